"""gunicorn settings for the web process: ``gunicorn -c python:queueing.gunicorn
proj.wsgi`` (``manage.py run_all`` starts it so).

Read from the environment so ``run_all``, a container and a systemd unit run the same
server with the same knobs (docs/deploy.md):

* ``HOST`` / ``PORT`` — where to listen (``127.0.0.1`` / ``8000``);
* ``WEB_WORKERS`` — processes (2); ``WEB_THREADS`` — threads per process (4). Each thread
  holds at most one database connection, so one web container holds up to
  ``WEB_WORKERS * WEB_THREADS`` connections (to PgBouncer when it is in front);
* ``WEB_BACKLOG`` — connections the kernel queues while every thread is busy (2048): a
  burst waits here instead of being reset, as it was with runserver's backlog of 5;
* ``WEB_TIMEOUT`` — seconds before a stuck request's worker is restarted (30);
* ``LOG_FORMAT`` — ``plain`` or ``json``, ``LOG_LEVEL``: gunicorn's own lines and its
  access lines (the request as fields, duration included) in the format of the Django
  and worker logs (:mod:`queueing.logs`);
* ``PROMETHEUS_MULTIPROC_DIR`` — where every web process keeps its request metrics and
  counters for ``/metrics`` to sum (prometheus_client's multiprocess mode). Unset, a
  fresh directory is made for this server; either way it is emptied when the server
  starts, so counters start at zero with the server as Prometheus expects.

Threads (``gthread``) rather than more processes: a request spends most of its time
waiting on PostgreSQL, and threads share one process's memory.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    try:
        return int(raw) if raw else default
    except ValueError:
        raise SystemExit(f"{name}={raw!r} is not a whole number") from None


bind = [f"{os.environ.get('HOST', '').strip() or '127.0.0.1'}:{_int('PORT', 8000)}"]
worker_class = "gthread"
workers = _int("WEB_WORKERS", 2)
threads = _int("WEB_THREADS", 4)
backlog = _int("WEB_BACKLOG", 2048)
timeout = _int("WEB_TIMEOUT", 30)
graceful_timeout = timeout
keepalive = 5
# gunicorn 24+ opens a control socket in the home directory, one path for every server of
# the user: two servers (two checkouts, the tests) would fight over it. Nothing uses it.
control_socket_disable = True
accesslog = "-"
errorlog = "-"
# Workers touch a heartbeat file; on a container's overlay filesystem a slow fsync there
# can make the master kill a healthy worker, /dev/shm is memory.
if Path("/dev/shm").is_dir():
    worker_tmp_dir = "/dev/shm"

_format = os.environ.get("LOG_FORMAT", "").strip().lower() or "plain"
if _format not in ("plain", "json"):
    raise SystemExit(f"LOG_FORMAT={_format!r}: use 'plain' or 'json'")
_level = os.environ.get("LOG_LEVEL", "").strip().upper() or "INFO"
logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"()": "queueing.logs.PlainFormatter"},
        "json": {"()": "queueing.logs.JsonFormatter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": _format}},
    "loggers": {
        "gunicorn.error": {"handlers": ["console"], "level": _level, "propagate": False},
        # Every request is logged, whatever LOG_LEVEL says of the rest.
        "gunicorn.access": {"handlers": ["console"], "level": "INFO", "propagate": False},
    },
}

# Set before the workers fork, so prometheus_client in each of them writes to the shared
# directory (it reads the variable when it is imported, in the application).
if not os.environ.get("PROMETHEUS_MULTIPROC_DIR", "").strip():
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="pgstage-metrics-")


def on_starting(server: object) -> None:
    """Empty the metrics directory: values left by an earlier server are not this one's."""
    directory = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.db"):
        stale.unlink(missing_ok=True)
