"""The framework's own jobs (autodiscovered by procrastinate's Django app)."""

from __future__ import annotations

from queueing import (
    metrics,  # noqa: F401  (declares the metrics_snapshot sweep)
    retention,  # noqa: F401  (declares the finished-jobs retention sweep)
    stalled,  # noqa: F401  (declares the stalled-work sweep)
)
