"""JSON API of pipeline (attached by config.api)."""

from __future__ import annotations

from ninja import Router

router = Router(tags=["pipeline"])
