"""Run the web server and one worker together (for local use; production runs them as
separate services). Ctrl-C or SIGTERM stops both; the worker drains its running jobs."""

from __future__ import annotations

import signal
import subprocess
import sys

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Start `runserver` and `procrastinate worker` side by side until interrupted."

    def add_arguments(self, parser):
        parser.add_argument("--addr", default="127.0.0.1:8000", help="host:port to serve on")
        parser.add_argument("--concurrency", type=int, default=2)

    def handle(self, *args, addr: str, concurrency: int, **options):
        if concurrency < 1:
            raise CommandError("--concurrency must be at least 1.")
        python = [sys.executable, "manage.py"]
        procs = [
            # --insecure: serve the admin's and the API docs' static files without DEBUG
            # (local use; production serves collectstatic's output from a web server).
            subprocess.Popen(
                [*python, "runserver", addr, "--noreload", "--insecure"], cwd=settings.BASE_DIR
            ),
            subprocess.Popen(
                [*python, "procrastinate", "worker", f"--concurrency={concurrency}"],
                cwd=settings.BASE_DIR,
            ),
        ]
        self.stdout.write(
            f"web on http://{addr}/ (dashboard /dashboard/, admin /admin/), "
            "one worker; Ctrl-C stops both"
        )

        def stop(*_):
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)

        signal.signal(signal.SIGTERM, stop)
        try:
            while all(proc.poll() is None for proc in procs):
                try:
                    procs[0].wait(timeout=1)
                except subprocess.TimeoutExpired:
                    continue
        except KeyboardInterrupt:
            pass
        finally:
            stop()
            for proc in procs:
                proc.wait(timeout=90)
