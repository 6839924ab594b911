"""The site's own periodic work (autodiscovered by procrastinate's Django app)."""

from __future__ import annotations

from config import metrics  # noqa: F401  (declares the metrics_snapshot sweep)
