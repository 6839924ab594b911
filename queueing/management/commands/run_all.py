"""Serve the project's WSGI application (``WSGI_APPLICATION``) with gunicorn
(:mod:`queueing.gunicorn`) and run one supervised ``procrastinate worker`` beside it: the
same server as production, for one machine. Production runs the two as separate services
(docs/deploy.md). Ctrl-C or SIGTERM stops both; the worker drains its running jobs. Not
for cron."""

from __future__ import annotations

import argparse
import importlib.util
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
#: The most job slots one worker is given here: each is a thread and up to two
#: connections (docs/deploy.md); more work wants more workers, not more slots.
MAX_CONCURRENCY = 100
#: A host name's length limit (RFC 1035).
MAX_HOST_CHARS = 253


def port_number(value: str) -> int:
    """``--port`` (and ``PORT``, its default): a TCP port, 1-65535."""
    try:
        port = int(value)
    except ValueError:
        port = 0
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"{value!r} is not a TCP port (1-65535)")
    return port


def job_slots(value: str) -> int:
    """``--concurrency``: a whole number of job slots, 1 to :data:`MAX_CONCURRENCY`."""
    try:
        slots = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if slots < 1:
        raise argparse.ArgumentTypeError(f"{value}: give at least 1")
    if slots > MAX_CONCURRENCY:
        raise argparse.ArgumentTypeError(
            f"{value}: at most {MAX_CONCURRENCY} per worker; start more workers instead"
        )
    return slots


def host_address(value: str) -> str:
    """``--host`` (and ``HOST``): an address or host name to bind."""
    if "\x00" in value:
        raise argparse.ArgumentTypeError("an address cannot contain NUL")
    if not value.strip():
        raise argparse.ArgumentTypeError("name an address, e.g. 127.0.0.1 or 0.0.0.0")
    if len(value) > MAX_HOST_CHARS:
        raise argparse.ArgumentTypeError(f"{len(value)} characters; at most {MAX_HOST_CHARS}")
    return value


def _wsgi() -> str:
    """gunicorn's ``module:attribute`` for ``WSGI_APPLICATION`` (``proj.wsgi.application``)."""
    module, _, attribute = str(settings.WSGI_APPLICATION).rpartition(".")
    if not module:
        raise CommandError(
            "WSGI_APPLICATION must name module.attribute, e.g. proj.wsgi.application"
        )
    return f"{module}:{attribute}"


def _project_roots() -> list[str]:
    """The directories the project's settings and WSGI module are imported from. The
    children start in the current directory, which need not be the project's (``python
    src/manage.py run_all``): they get these on ``PYTHONPATH``, as this process had them
    on its path (manage.py's directory, ``--pythonpath``)."""
    roots: list[str] = []
    for dotted in (os.environ.get("DJANGO_SETTINGS_MODULE"), str(settings.WSGI_APPLICATION)):
        spec = importlib.util.find_spec(dotted.split(".")[0]) if dotted else None
        if spec is None:
            continue
        if spec.submodule_search_locations:
            root = Path(next(iter(spec.submodule_search_locations))).parent
        elif spec.origin:
            root = Path(spec.origin).parent
        else:
            continue
        if str(root) not in roots:
            roots.append(str(root))
    return roots


def _drain_seconds() -> float:
    defaults = getattr(settings, "PROCRASTINATE_WORKER_DEFAULTS", None) or {}
    return float(defaults.get("shutdown_graceful_timeout") or 60.0)


class Command(BaseCommand):
    help = "Start gunicorn and a supervised `procrastinate worker` side by side until stopped."

    def add_arguments(self, parser):
        # The environment's HOST and PORT are string defaults, which argparse checks with
        # the same type as the flags.
        parser.add_argument(
            "--host",
            type=host_address,
            default=os.environ.get("HOST") or "127.0.0.1",
            help="address to bind",
        )
        parser.add_argument(
            "--port",
            type=port_number,
            default=os.environ.get("PORT") or "8000",
            help="port to bind",
        )
        parser.add_argument(
            "--concurrency",
            type=job_slots,
            default="2",
            help=f"the worker's job slots (1-{MAX_CONCURRENCY})",
        )

    def handle(self, *args: Any, host: str, port: int, concurrency: int, **options: Any) -> None:
        # call_command() may pass the values without the parser: check them here too.
        for flag, check, value in (
            ("--concurrency", job_slots, concurrency),
            ("--port", port_number, port),
            ("--host", host_address, host),
        ):
            try:
                check(str(value))
            except argparse.ArgumentTypeError as exc:
                raise CommandError(f"{flag} {exc}.") from None
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
        python_path = [*_project_roots(), *filter(None, [os.environ.get("PYTHONPATH")])]
        env = {
            **os.environ,
            "HOST": host,
            "PORT": str(port),
            "PYTHONPATH": os.pathsep.join(python_path),
        }
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
