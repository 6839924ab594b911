"""The pipeline's named SQL statements (``pipeline/sql/pipeline.sql``)."""

from __future__ import annotations

from queueing import sql

QUERIES = sql.load("pipeline", "pipeline.sql")
