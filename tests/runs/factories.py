"""Factories and helpers of the runs tests: payloads, funded users, terminal jobs, an
in-process stand-in for a worker, and time travel by back-dating rows."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import factory
from django.db import connection
from django.utils import timezone

from queueing.exceptions import RetryLater
from runs.credits import credit_grant
from runs.models import AnalysisJob, JobStatus
from tests.factories import UserFactory

DOC_HTML = (
    "<h1>Thesis</h1>"
    "<p>Water boils at one hundred degrees at sea level [thermo]. "
    "The moon is made of green cheese [moon].</p>"
    '<p><cite data-source="thermo">The boiling point depends on air pressure</cite></p>'
)
SOURCES = [
    {
        "key": "thermo",
        "title": "Thermodynamics",
        "doi": "10.1000/thermo.1",
        "text": "At sea level water boils at one hundred degrees; the boiling point depends "
        "on the air pressure.",
    },
    {
        "key": "moon",
        "title": "Lunar geology",
        "doi": None,
        "text": "The moon is made of rock and dust.",
    },
]
RESULTS = {
    "judge": "overlap-v1",
    "verdicts": [
        {
            "marker": "c1",
            "source_key": "thermo",
            "claim": "Water boils.",
            "verdict": "supported",
            "score": 1.0,
            "reason": "",
        }
    ],
    "summary": {
        "citations": 1,
        "supported": 1,
        "partial": 0,
        "unsupported": 0,
        "missing_source": 0,
    },
}


def payload(**overrides: Any) -> dict[str, Any]:
    """A valid POST /api/analysis-jobs body."""
    body = {
        "title": "Chapter 1",
        "doc_html": DOC_HTML,
        "sources": [dict(s) for s in SOURCES],
        "delta_of_job_id": None,
    }
    body.update(overrides)
    return body


def funded_user(credits: int = 10, **kwargs: Any):
    user = UserFactory(**kwargs)
    if credits:
        credit_grant(user_id=user.pk, amount=credits, note="test")
    return user


class AnalysisJobFactory(factory.django.DjangoModelFactory):
    """A job that already ended (``complete``, body and results present, no run yet)."""

    class Meta:
        model = AnalysisJob

    user = factory.SubFactory(UserFactory)
    tenant = factory.LazyAttribute(lambda o: o.user.tenant)
    run_id = factory.LazyFunction(uuid.uuid4)
    status = JobStatus.COMPLETE
    title = factory.Sequence(lambda n: f"Chapter {n}")
    doc_html = DOC_HTML
    sources = factory.LazyFunction(lambda: [dict(s) for s in SOURCES])
    results = factory.LazyFunction(lambda: dict(RESULTS))
    finished_at = factory.LazyFunction(timezone.now)


def backdate(
    table: str, ids: Iterable[Any], *, seconds: float, columns: Sequence[str] = ("updated_at",)
) -> None:
    """Move ``columns`` of the rows ``ids`` of ``table`` ``seconds`` into the past."""
    assignments = ", ".join(f"{c} = {c} - %(seconds)s * interval '1 second'" for c in columns)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET {assignments} WHERE id = ANY(%(ids)s)",
            {"seconds": seconds, "ids": list(ids)},
        )


@dataclass(frozen=True)
class Ran:
    job_id: int
    task_name: str
    args: dict[str, Any]
    outcome: Any


def register_worker() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT worker_id FROM procrastinate_register_worker_v1()")
        return cursor.fetchone()[0]


def drain(
    *, worker_id: int | None = None, queues: Sequence[str] = ("analyses",), limit: int = 10_000
) -> list[Ran]:
    """Run waiting procrastinate jobs in this thread, as a worker would: fetch with
    procrastinate's own SKIP LOCKED function, call the task, finish the job. A job that
    raises RetryLater is put back an hour later (its key stays held)."""
    from procrastinate.contrib.django import app

    ran = []
    while len(ran) < limit:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT id, task_name, args FROM procrastinate_fetch_job_v2(%s, %s)",
                [list(queues), worker_id],
            )
            job_id, task_name, args = cursor.fetchone()
        if job_id is None:
            break
        if isinstance(args, str):  # Django loads jsonb as text unless parameters were bound
            args = json.loads(args)
        func = app.tasks[task_name].func
        func = getattr(func, "__wrapped__", func)
        try:
            outcome = func(**args)
        except RetryLater as exc:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT procrastinate_retry_job_v2(%s, now() + interval '1 hour', NULL, "
                    "NULL, NULL)",
                    [job_id],
                )
            ran.append(Ran(job_id, task_name, args, exc))
            continue
        except Exception:
            with connection.cursor() as cursor:
                cursor.execute("SELECT procrastinate_finish_job_v1(%s, 'failed', false)", [job_id])
            raise
        with connection.cursor() as cursor:
            cursor.execute("SELECT procrastinate_finish_job_v1(%s, 'succeeded', false)", [job_id])
        ran.append(Ran(job_id, task_name, args, outcome))
    return ran


def active_first_pass_per_user() -> dict[int, int]:
    """Users with more than one first-pass job pending or running (must stay empty)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT user_id, count(*) FROM analysis_jobs "
            "WHERE status IN ('pending', 'running') AND delta_of_job_id IS NULL "
            "AND deleted_at IS NULL GROUP BY user_id HAVING count(*) > 1"
        )
        return dict(cursor.fetchall())
