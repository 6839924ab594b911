"""Serve the project's WSGI application (``WSGI_APPLICATION``) with gunicorn
(:mod:`queueing.gunicorn`) and run one supervised ``procrastinate worker`` beside it: the
same server as production, for one machine. Production runs the two as separate services
(docs/deploy.md). Ctrl-C or SIGTERM stops both; the worker drains its running jobs. Not
for cron."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from queueing.supervisor import Child, Supervisor

#: Beyond the worker's drain budget: sync jobs finish regardless, give them a little more.
STOP_MARGIN_SECONDS = 30.0


def _wsgi() -> str:
    """gunicorn's ``module:attribute`` for ``WSGI_APPLICATION`` (``proj.wsgi.application``)."""
    module, _, attribute = str(settings.WSGI_APPLICATION).rpartition(".")
    if not module:
        raise CommandError(
            "WSGI_APPLICATION must name module.attribute, e.g. proj.wsgi.application"
        )
    return f"{module}:{attribute}"


def _drain_seconds() -> float:
    defaults = getattr(settings, "PROCRASTINATE_WORKER_DEFAULTS", None) or {}
    return float(defaults.get("shutdown_graceful_timeout") or 60.0)


class Command(BaseCommand):
    help = "Start gunicorn and a supervised `procrastinate worker` side by side until stopped."

    def add_arguments(self, parser):
        parser.add_argument(
            "--host", default=os.environ.get("HOST") or "127.0.0.1", help="address to bind"
        )
        parser.add_argument(
            "--port", type=int, default=int(os.environ.get("PORT") or 8000), help="port to bind"
        )
        parser.add_argument("--concurrency", type=int, default=2, help="the worker's job slots")

    def handle(self, *args: Any, host: str, port: int, concurrency: int, **options: Any) -> None:
        if concurrency < 1:
            raise CommandError("--concurrency must be at least 1.")
        if not 0 < port < 65536:
            raise CommandError(f"--port {port} is not a TCP port (1-65535).")
        if not host.strip():
            raise CommandError("--host must name an address, e.g. 127.0.0.1 or 0.0.0.0.")
        if "django.contrib.staticfiles" in settings.INSTALLED_APPS and getattr(
            settings, "STATIC_ROOT", None
        ):
            # What the web server serves as static files (whitenoise, for instance).
            call_command("collectstatic", interactive=False, verbosity=0)
        web = Child(
            name="web",
            argv=[sys.executable, "-m", "gunicorn", "-c", "python:queueing.gunicorn", _wsgi()],
            restart_on_failure=False,
            stop_timeout=60.0,
        )
        worker = Child(
            name="worker",
            argv=[
                sys.executable,
                "-m",
                "django",
                "procrastinate",
                "worker",
                f"--concurrency={concurrency}",
            ],
            restart_on_failure=True,
            stop_timeout=_drain_seconds() + STOP_MARGIN_SECONDS,
        )
        env = {**os.environ, "HOST": host, "PORT": str(port)}
        supervisor = Supervisor([web, worker], cwd=Path.cwd(), env=env, out=self.stdout)
        shown = f"[{host}]" if ":" in host else host
        self.stdout.write(
            f"web on http://{shown}:{port}/ (health /healthz and /readyz), one supervised "
            "worker; Ctrl-C stops both"
        )

        def on_signal(signum, frame):
            supervisor.stopping = True

        signal.signal(signal.SIGTERM, on_signal)
        try:
            status = supervisor.run()
        except KeyboardInterrupt:
            status = 0
        finally:
            supervisor.stop()
        if status:
            raise CommandError(f"the web server exited with status {status}")
