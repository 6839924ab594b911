"""The nemesis workload: clients of both domains and of the generic tasks, drawn from a seed.

Runs in the runner's process, on Django's connection straight to the server (clients are
not behind the workers' proxies). Each operation is recorded ``invoke`` → ``ok`` /
``fail`` / ``info`` (:mod:`tests.nemesis.history`). Operations:

- ``submit``: an inquiry through all four pipeline stages (``anfrage_submit``);
- ``admit``: an analysis (``analysis_job_admit``), processed by the workers;
- ``save``: a client save of a terminal analysis (``analysis_run_save``);
- ``effect``: a generic job that logs its effects outside the database (one in four
  holds 5 to 45 s, so that it spans faults and recoveries);
- ``settled``: a generic job with a give-up hook, failing for good when ``fail``;
- ``new_effect``: a job of the task only the new release has (when the config asks).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import django.db
from django.db import connection

from tests.nemesis.history import History

INQUIRY = b"12 pcs steel beam HEA 200, 6 m\n4 Stk Stahltraeger IPE 300, 4500 mm\n"
#: Positions the extractor reads from :data:`INQUIRY` (the checker counts them).
INQUIRY_POSITIONS = 2
DOC = "<p>Steel carries load [1]. Coatings extend life [2].</p>"
SOURCES = [
    {"key": "1", "title": "Steel", "doi": "10.1000/steel.1", "text": "Steel carries load."},
    {"key": "2", "title": "Coatings", "doi": "10.1000/coat.2", "text": "Coatings extend life."},
]
TENANTS = ("nemesis-a", "nemesis-b")
USERS = (("nemesis-a", "alice"), ("nemesis-a", "bob"), ("nemesis-b", "carol"))
CREDITS = 100_000


@dataclass(frozen=True, kw_only=True)
class WorkloadConfig:
    #: Mean pause between two client operations, seconds.
    pause: float = 0.4
    #: Enqueue jobs of the task only the new release has.
    new_task: bool = False


def operate(history: History, op: str, func: Callable[[], Any], **fields: Any) -> Any:
    """Record ``op``'s invoke and its outcome: ``ok`` (with its value), ``fail`` (refused:
    nothing happened) or ``info`` (a database error: it may or may not have happened)."""
    op_id = history.next_id()
    history.record("op", op=op, id=op_id, phase="invoke", **fields)
    try:
        value = func()
    except django.db.Error as exc:
        history.record("op", op=op, id=op_id, phase="info", error=repr(exc)[:300])
        connection.close()
        return None
    except Exception as exc:
        history.record("op", op=op, id=op_id, phase="fail", error=repr(exc)[:300])
        return None
    history.record("op", op=op, id=op_id, phase="ok", value=value)
    return value


def set_up() -> None:
    """The tenants and funded users (before any fault)."""
    from accounts.services import tenant_get_or_create, user_get_or_create
    from runs.credits import credit_grant

    tenants = {slug: tenant_get_or_create(slug=slug) for slug in TENANTS}
    for slug, username in USERS:
        user = user_get_or_create(tenant=tenants[slug], username=username)
        credit_grant(user_id=user.pk, amount=CREDITS, note="nemesis")


class Workload:
    def __init__(self, *, history: History, rng: random.Random, config: WorkloadConfig) -> None:
        self.history = history
        self.rng = rng
        self.config = config
        self.stop = threading.Event()
        self.keys = 0
        self.analyses: list[tuple[str, int]] = []
        self._thread = threading.Thread(target=self._run, daemon=True, name="workload")

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        self.stop.set()
        self._thread.join(timeout=120)

    def _run(self) -> None:
        ops = [
            (self.submit, 2),
            (self.admit, 3),
            (self.save, 3),
            (self.effect, 4),
            (self.settled, 2),
        ]
        if self.config.new_task:
            ops.append((self.new_effect, 2))
        funcs, weights = zip(*ops, strict=True)
        try:
            while not self.stop.is_set():
                self.rng.choices(funcs, weights)[0]()
                self.stop.wait(self.rng.expovariate(1 / self.config.pause))
        finally:
            django.db.connections.close_all()

    def _key(self, prefix: str) -> str:
        self.keys += 1
        return f"{prefix}-{self.keys}"

    def submit(self) -> None:
        from accounts.models import Tenant
        from pipeline.submit import Upload, anfrage_submit

        slug = self.rng.choice(TENANTS)
        title = self._key("inquiry")

        def submit() -> int:
            tenant = Tenant.objects.get(slug=slug)
            upload = Upload(filename=f"{title}.txt", data=INQUIRY)
            return anfrage_submit(tenant=tenant, uploads=[upload], title=title, actor="nemesis").pk

        operate(self.history, "submit", submit, tenant=slug, title=title)

    def admit(self) -> None:
        from accounts.models import User
        from runs.admission import analysis_job_admit

        username = self.rng.choice(USERS)[1]
        title = self._key("paper")

        def admit() -> int:
            user = User.objects.get(username=username)
            return analysis_job_admit(user=user, title=title, doc_html=DOC, sources=SOURCES).id

        job_id = operate(self.history, "admit", admit, user=username, title=title)
        if job_id is not None:
            self.analyses.append((username, job_id))

    def save(self) -> None:
        from accounts.models import User
        from runs.durability import analysis_run_save
        from runs.models import AnalysisJob

        if not self.analyses:
            return
        username, job_id = self.rng.choice(self.analyses)

        def save() -> bool | None:
            status = AnalysisJob.objects.filter(pk=job_id).values_list("status", flat=True)[0]
            if status not in ("complete", "failed"):
                return None
            user = User.objects.get(username=username)
            return analysis_run_save(user=user, job_id=job_id).written

        operate(self.history, "save", save, user=username, job=job_id)

    def _enqueue(self, op: str, task: str, args: dict[str, Any]) -> None:
        from queueing.enqueue import enqueue

        operate(
            self.history,
            op,
            lambda: enqueue(task, args=args).job_id,
            task=task,
            key=args["key"],
            args=args,
        )

    def effect(self) -> None:
        from tests.nemesis.tasks import EFFECT

        # One in four runs long: long enough to span a fault and the recovery after it.
        long = self.rng.random() < 0.25
        hold = round(self.rng.uniform(5, 45) if long else self.rng.uniform(0.1, 3), 2)
        self._enqueue("effect", EFFECT, {"key": self._key("effect"), "hold": hold})

    def settled(self) -> None:
        from tests.nemesis.tasks import SETTLED

        args = {"key": self._key("settled"), "hold": 0.2, "fail": self.rng.random() < 0.4}
        self._enqueue("settled", SETTLED, args)

    def new_effect(self) -> None:
        from tests.nemesis.tasks_new import NEW_EFFECT

        args = {"key": self._key("new"), "hold": 0.3, "fail": self.rng.random() < 0.3}
        self._enqueue("new_effect", NEW_EFFECT, args)
