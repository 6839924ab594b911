"""pgstage: durable, idempotent background pipelines for Django on PostgreSQL.

The public API is docs/api.md: the modules named in ``__all__`` and, in each of them, the
names of its own ``__all__``. Everything else is internal and may change in any release.
"""

__all__ = [
    "app",
    "backoff",
    "connector",
    "enqueue",
    "exceptions",
    "gunicorn",
    "health",
    "indexes",
    "jobs",
    "keys",
    "ledger",
    "locks",
    "logs",
    "metrics",
    "middleware",
    "rows",
    "serial",
    "sweeps",
    "worker",
    "worker_state",
]
