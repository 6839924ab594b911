"""The end-to-end demo: seed tenants and users, start real workers, push inquiries through
all four stages and a user's batch of analyses through the per-user queue, then print what
happened and where to look. Re-runnable; not for cron."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.test import Client

from accounts.models import User
from accounts.services import api_token_create, tenant_get_or_create, user_get_or_create
from accounts.validation import int_argument
from queueing.display import format_table

DATA = Path(__file__).resolve().parents[2] / "demo_data"
INQUIRIES = [("acme", "steel-beams.txt"), ("acme", "sheet-metal.csv"), ("globex", "fittings.md")]
USERS = [("acme", "alice"), ("acme", "bob"), ("globex", "carol")]
TIMEOUT_SECONDS = 50
WORKER_GRACE_SECONDS = 120


def manage_py(args: str) -> str:
    """``args`` as a ``manage.py`` call with the Python that runs this demo (the
    checkout's ``.venv/bin/python``, relative when it is under the current directory): a
    fresh machine's ``python`` has no Django."""
    python = Path(sys.executable)
    try:
        shown = str(python.relative_to(Path.cwd()))
    except ValueError:
        shown = str(python)
    return f"{shown} manage.py {args}"


def sample_analysis(n: int) -> dict:
    return {
        "title": f"Thesis chapter {n}",
        "doc_html": (
            f"<h1>Chapter {n}</h1><p>Steel beams carry the load [1]. Corrosion halves the "
            f"service life of unprotected sheet [2].</p>"
        ),
        "sources": [
            {
                "key": "1",
                "title": "Structural steel design",
                "doi": "10.1000/steel.2020.1",
                "text": "Steel beams carry the load of the floor structure.",
            },
            {
                "key": "2",
                "title": "Corrosion of sheet metal",
                "doi": "10.1000/corr.2019.7",
                "text": "Unprotected sheet corrodes; coatings extend service life.",
            },
        ],
    }


@contextmanager
def _quiet_console(path: Path) -> Iterator[None]:
    """This process's informational log lines (a sweep's counts, say) go to ``path``
    instead of between the demo's tables; warnings and errors still reach the console."""
    root = logging.getLogger()
    handler = logging.FileHandler(path)
    if root.handlers:
        handler.setFormatter(root.handlers[0].formatter)
    consoles = [
        (h, h.level)
        for h in root.handlers
        if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
    ]
    root.addHandler(handler)
    for console, _ in consoles:
        console.setLevel(max(console.level, logging.WARNING))
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()
        for console, level in consoles:
            console.setLevel(level)


class Command(BaseCommand):
    help = "Run pgstage end to end on this database and print a summary (exits within a minute)."

    def add_arguments(self, parser):
        parser.add_argument("--workers", type=int_argument(maximum=8), default=2)
        parser.add_argument(
            "--grace",
            type=int_argument(minimum=0, maximum=3600),
            default=3,
            help="SWEEP_GRACE_SECONDS for the demo (production default: 120)",
        )

    def handle(self, *args, workers: int, grace: int, **options):
        if workers < 1:
            raise CommandError("--workers must be at least 1.")
        if grace < 0:
            raise CommandError("--grace must be 0 or more seconds.")
        # The closed tab's run is rescued after the grace window; shorten it for the demo in
        # this process, which runs the sweep the demo shows.
        settings.SWEEP_GRACE_SECONDS = grace
        with connection.cursor() as cursor:
            cursor.execute("SELECT coalesce(max(id), 0) FROM procrastinate_jobs")
            (self.first_job_id,) = cursor.fetchone()
        log_dir = settings.DATA_DIR / "demo-logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        with _quiet_console(log_dir / "demo.log"):
            self._run(workers)

    def _run(self, workers: int) -> None:
        self._step("seeding tenants, users, tokens and credits")
        tokens = self._seed()
        procs = self._start_workers(workers)
        try:
            self._step("submitting inquiries (manage.py submit_anfrage)")
            inquiries = [(tenant, self._submit(tenant, name)) for tenant, name in INQUIRIES]
            self._step("alice clicks 'analyse' five times (POST /api/analysis-jobs)")
            client = Client()
            alice = {"HTTP_AUTHORIZATION": f"Bearer {tokens['alice']}"}
            admitted = []
            for n in range(1, 6):
                response = client.post(
                    "/api/analysis-jobs",
                    json.dumps(sample_analysis(n)),
                    content_type="application/json",
                    **alice,
                )
                if response.status_code != 201:
                    raise CommandError(
                        f"admission failed: {response.status_code} "
                        f"{response.content.decode()[:300]}"
                    )
                admitted.append(response.json())
            self.stdout.write(
                format_table(
                    ["job", "status at click", "queue position"],
                    [[a["id"], a["status"], a["queue_position"]] for a in admitted],
                )
            )

            self._step("waiting for the pipelines and the analyses (one at a time for alice)")
            self._wait(
                lambda: (
                    self._pipelines_done(client, tokens, inquiries)
                    and self._analyses_done(client, alice, admitted)
                )
            )

            self._step("the browser saves 4 runs; one tab was closed before it could")
            for job in admitted[:4]:
                client.post(
                    "/api/analysis-runs",
                    json.dumps({"job_id": job["id"]}),
                    content_type="application/json",
                    **alice,
                )
            self._step(
                f"the backstop sweep rescues the closed tab's run after "
                f"{settings.SWEEP_GRACE_SECONDS}s grace"
            )
            time.sleep(settings.SWEEP_GRACE_SECONDS + 0.5)
            out = io.StringIO()
            call_command("sweep", "unsaved_runs", stdout=out)
            self.stdout.write(out.getvalue())
            self._summary(client, tokens, inquiries, alice, admitted)
        finally:
            self._stop_workers(procs)

    # -- steps ---------------------------------------------------------------------------

    def _step(self, text: str) -> None:
        self.stdout.write(self.style.MIGRATE_HEADING(f"» {text}"))

    def _seed(self) -> dict[str, str]:
        tokens = {}
        for tenant_slug, username in USERS:
            tenant = tenant_get_or_create(slug=tenant_slug)
            user = user_get_or_create(tenant=tenant, username=username)
            if not user.password:  # never set (a password set since is kept)
                # Demo users log in to the dashboard with their name as password.
                user.set_password(username)
                user.save(update_fields=["password"])
            tokens[username] = api_token_create(user=user, name="demo")
            call_command("grant_credits", user=username, amount=10, stdout=io.StringIO())
        admin, created = User.objects.get_or_create(
            username="admin",
            defaults={
                "is_staff": True,
                "is_superuser": True,
                "tenant": tenant_get_or_create(slug="acme"),
            },
        )
        if created:
            admin.set_password("admin")
            admin.save()
        return tokens

    def _start_workers(self, count: int) -> list[subprocess.Popen]:
        self._step(f"starting {count} workers (manage.py procrastinate worker)")
        log_dir = settings.DATA_DIR / "demo-logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            # The workers' own periodic sweep keeps the production grace: with the demo's
            # it could rescue the closed tab's run before the demo's sweep, on a busy
            # machine, and the demo would show a sweep that found nothing.
            "SWEEP_GRACE_SECONDS": str(WORKER_GRACE_SECONDS),
            "LOG_LEVEL": "WARNING",
        }
        procs = []
        for i in range(count):
            log = open(log_dir / f"worker-{i}.log", "w")  # noqa: SIM115 - lives with the process
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "manage.py",
                        "procrastinate",
                        "worker",
                        f"--name=demo-worker-{i}",
                        "--concurrency=2",
                    ],
                    cwd=settings.BASE_DIR,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        return procs

    def _stop_workers(self, procs: list[subprocess.Popen]) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = []
        for proc in procs:
            try:
                codes.append(proc.wait(timeout=30))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append("killed")
        self._step(f"workers drained on SIGTERM, exit codes {codes}")

    def _submit(self, tenant: str, filename: str) -> int:
        out = io.StringIO()
        call_command("submit_anfrage", str(DATA / filename), tenant=tenant, stdout=out)
        return int(out.getvalue().strip().splitlines()[-1])

    def _wait(self, done) -> None:
        deadline = time.monotonic() + TIMEOUT_SECONDS
        # The animation is for a terminal; a log file gets no carriage returns.
        animate = self.stderr.isatty()
        spinner = 0
        while time.monotonic() < deadline:
            if done():
                if animate:
                    self.stderr.write("\r" + " " * 40 + "\r")
                return
            spinner += 1
            if animate:
                self.stderr.write(f"\r  working {'.' * (spinner % 4):<4}")
            time.sleep(0.5)
        raise CommandError(
            f"the demo did not finish within {TIMEOUT_SECONDS}s; see the worker logs under "
            f"{settings.DATA_DIR / 'demo-logs'}"
        )

    def _headers(self, tokens, tenant: str) -> dict:
        username = next(u for t, u in USERS if t == tenant)
        return {"HTTP_AUTHORIZATION": f"Bearer {tokens[username]}"}

    def _pipelines_done(self, client, tokens, inquiries) -> bool:
        for tenant, anfrage_id in inquiries:
            body = client.get(f"/api/anfragen/{anfrage_id}", **self._headers(tokens, tenant)).json()
            stages = {s["stage"]: s["status"] for s in body.get("stages", [])}
            if stages.get("calculate") != "success":
                return False
        return True

    def _analyses_done(self, client, headers, admitted) -> bool:
        return all(
            client.get(f"/api/analysis-jobs/{a['id']}", **headers).json()["status"]
            in ("complete", "failed")
            for a in admitted
        )

    def _summary(self, client, tokens, inquiries, alice, admitted) -> None:
        self._step("inquiries")
        rows = []
        for tenant, anfrage_id in inquiries:
            body = client.get(f"/api/anfragen/{anfrage_id}", **self._headers(tokens, tenant)).json()
            stages = " → ".join(f"{s['stage']}:{s['status']}" for s in body["stages"])
            positions = body.get("positions", [])
            feasible = sum(1 for p in positions if p.get("feasible"))
            rows.append(
                [
                    anfrage_id,
                    tenant,
                    stages,
                    f"{feasible}/{len(positions)}",
                    body.get("quote_total"),
                ]
            )
        self.stdout.write(format_table(["id", "tenant", "stages", "feasible", "quote total"], rows))
        self._step("alice's analyses")
        runs = {r["job_id"]: r for r in client.get("/api/analysis-runs", **alice).json()}
        rows = []
        for a in admitted:
            job = client.get(f"/api/analysis-jobs/{a['id']}", **alice).json()
            run = runs.get(a["id"], {})
            rows.append(
                [
                    a["id"],
                    a["status"],
                    job["status"],
                    len(job.get("verdicts") or []),
                    run.get("saved_by", "-"),
                ]
            )
        self.stdout.write(
            format_table(["job", "admitted as", "final", "verdicts", "run saved by"], rows)
        )
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT task_name, status, count(*) FROM procrastinate_jobs WHERE id > %s "
                "GROUP BY 1, 2 ORDER BY 1, 2",
                [self.first_job_id],
            )
            self._step("procrastinate jobs of this demo")
            self.stdout.write(format_table(["task", "status", "jobs"], cursor.fetchall()))
        self._step("where to look")
        self.stdout.write(
            format_table(
                ["what", "where"],
                [
                    ["web server", "make run  (then open the links below)"],
                    ["admin", "http://127.0.0.1:8000/admin/  (user admin, password admin)"],
                    ["dashboard", "http://127.0.0.1:8000/dashboard/  (alice/alice, carol/carol)"],
                    ["API docs", "http://127.0.0.1:8000/api/docs"],
                    ["stage table", manage_py("pipeline_status")],
                    ["analysis queue", manage_py("queue_status")],
                ],
            )
        )
