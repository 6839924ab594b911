"""gunicorn settings for the web process: ``gunicorn -c python:config.gunicorn config.wsgi``.

Read from the environment so ``make run``, the container and a systemd unit run the same
server with the same knobs (docs/deploy.md):

* ``HOST`` / ``PORT`` — where to listen (``127.0.0.1`` / ``8000``);
* ``WEB_WORKERS`` — processes (2); ``WEB_THREADS`` — threads per process (4). Each thread
  holds at most one database connection, so one web container holds up to
  ``WEB_WORKERS * WEB_THREADS`` connections (to PgBouncer when it is in front);
* ``WEB_BACKLOG`` — connections the kernel queues while every thread is busy (2048): a
  burst waits here instead of being reset, as it was with runserver's backlog of 5;
* ``WEB_TIMEOUT`` — seconds before a stuck request's worker is restarted (30).

Threads (``gthread``) rather than more processes: a request spends most of its time
waiting on PostgreSQL, and threads share one process's memory.
"""

from __future__ import annotations

import os
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

if os.environ.get("LOG_FORMAT", "").strip().lower() == "json":
    logconfig_dict = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": "queueing.logs.JsonFormatter"}},
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "json"}},
        "loggers": {
            "gunicorn.error": {"handlers": ["console"], "level": "INFO", "propagate": False},
            "gunicorn.access": {"handlers": ["console"], "level": "INFO", "propagate": False},
        },
    }
