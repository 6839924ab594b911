"""``/metrics``: Prometheus text exposition, from the database.

The numbers live in PostgreSQL (procrastinate's job table, the stage ledger, the credit
ledger, the analyses), so a custom collector reads them instead of keeping in-process
counters: every web process reports the same truth, and a restart loses nothing. What an
alert needs fresh (waiting and running jobs, live analyses, running stages, unsaved runs)
is counted on each scrape through partial indexes, so it costs what is in flight; the
counts that grow with history (finished jobs, stages, runs, refunds) are taken once a
minute by the ``metrics_snapshot`` sweep and read from its one row, so a scrape never
aggregates a million rows. The collector sits in its own registry, so the exposition
holds only these metrics, not the serving process's own.

Access: ``Authorization: Bearer <METRICS_TOKEN>`` or a staff session. With
``METRICS_TOKEN`` unset only staff sessions may read it.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Count, F, Sum
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET
from procrastinate.contrib.django.models import ProcrastinateJob
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector
from psycopg.types.json import Jsonb

from pipeline.models import PipelineRun
from queueing.jobs import unrunnable_tasks
from queueing.ledger import LedgerStatus
from queueing.sql import load
from queueing.sweeps import SweepContext, SweepResult, declare_sweep
from runs.models import AnalysisJob, AnalysisRun, CreditEntry, CreditKind, SavedBy
from runs.selectors import unsaved_counts_by_age

#: procrastinate's job statuses, reported even at zero so a dashboard's series never gaps.
JOB_STATUSES = ("todo", "doing", "succeeded", "failed", "cancelled", "aborting", "aborted")
#: Counted on each scrape (bounded by live work); the rest come from the snapshot.
LIVE_JOB_STATUSES = ("todo", "doing")
LIVE_ANALYSIS_STATUSES = ("queued", "pending", "running")
METRIC_QUERIES = load("config", "metrics.sql")
#: ``saved_by`` NULL is a legacy row (it counts as a client save, DESIGN §4).
LEGACY = "legacy"


@dataclass
class Family:
    """One metric family as collected: kind, help text, label names, and per label
    values either a number (gauge, counter) or ``[count, sum]`` (summary)."""

    kind: str
    doc: str
    labels: tuple[str, ...]
    samples: dict[tuple[str, ...], Any] = field(default_factory=dict)

    def metric(self, name: str) -> Metric:
        if self.kind == "summary":
            family = SummaryMetricFamily(name, self.doc, labels=list(self.labels))
            for labels, (count, total) in sorted(self.samples.items()):
                family.add_metric(list(labels), count_value=count, sum_value=total)
            return family
        maker = CounterMetricFamily if self.kind == "counter" else GaugeMetricFamily
        family = maker(name, self.doc, labels=list(self.labels))
        for labels, value in sorted(self.samples.items()):
            family.add_metric(list(labels), value)
        return family


JOBS_DOC = "procrastinate jobs per queue and status."
ANALYSES_DOC = "Analysis jobs (not deleted) per status."
STAGES_DOC = "Stage ledger rows per stage and status."


def _empty_families() -> dict[str, Family]:
    """Every family, its label-less and fixed-label series at zero (so a dashboard's
    series never gap; the snapshot's age says whether the history was counted yet)."""
    families = {
        "pgstage_queue_depth": Family(
            "gauge", "Jobs waiting to run (procrastinate todo) per queue.", ("queue",)
        ),
        "pgstage_jobs": Family("gauge", JOBS_DOC, ("queue", "status")),
        "pgstage_jobs_without_worker": Family(
            "gauge",
            "Waiting jobs whose task no live worker has, per task (they wait for one).",
            ("task",),
        ),
        "pgstage_pipeline_runs": Family("gauge", STAGES_DOC, ("stage", "status")),
        "pgstage_pipeline_stage_duration_seconds": Family(
            "summary",
            "Duration of the last attempt of each finished stage run (finished_at - started_at).",
            ("stage", "status"),
        ),
        "pgstage_analysis_jobs": Family("gauge", ANALYSES_DOC, ("status",)),
        "pgstage_analysis_runs": Family(
            "gauge", "Recorded analysis runs per writer.", ("saved_by",)
        ),
        "pgstage_unsaved_runs": Family(
            "gauge",
            "Finished analyses whose result is in no run yet, by age since they ended: "
            "under_grace is expected (the browser may still save), anything older means "
            "the backstop sweep is not keeping up.",
            ("age",),
        ),
        "pgstage_sweep_rescues": Family(
            "counter",
            "Runs the backstop sweep recorded because no client saved them "
            "(analysis_runs.saved_by = 'worker').",
            (),
        ),
        "pgstage_refunds": Family("counter", "Credit refunds issued (one per job).", ()),
        "pgstage_refunded_credits": Family("counter", "Credits given back by refunds.", ()),
    }
    for name in ("pgstage_sweep_rescues", "pgstage_refunds", "pgstage_refunded_credits"):
        families[name].samples[()] = 0
    for writer in (*(w.value for w in SavedBy), LEGACY):
        families["pgstage_analysis_runs"].samples[(writer,)] = 0
    return families


def collect_live(families: dict[str, Family]) -> None:
    """The numbers an alert needs fresh, each bounded by live work (partial indexes):
    waiting and running jobs, live analyses, stages running, unsaved runs by age."""
    jobs = families["pgstage_jobs"]
    depth = families["pgstage_queue_depth"]
    for row in (
        ProcrastinateJob.objects.filter(status__in=LIVE_JOB_STATUSES)
        .values("queue_name", "status")
        .annotate(n=Count("id"))
        .order_by()
    ):
        jobs.samples[(row["queue_name"], row["status"])] = row["n"]
    for queue in {queue for queue, _ in jobs.samples}:
        for live in LIVE_JOB_STATUSES:
            jobs.samples.setdefault((queue, live), 0)
        depth.samples[(queue,)] = jobs.samples[(queue, "todo")]
    analyses = families["pgstage_analysis_jobs"]
    for row in (
        AnalysisJob.objects.filter(status__in=LIVE_ANALYSIS_STATUSES, deleted_at__isnull=True)
        .values("status")
        .annotate(n=Count("id"))
        .order_by()
    ):
        analyses.samples[(row["status"],)] = row["n"]
    stages = families["pgstage_pipeline_runs"]
    for row in (
        PipelineRun.objects.filter(status=LedgerStatus.RUNNING)
        .values("stage", "status")
        .annotate(n=Count("id"))
        .order_by()
    ):
        stages.samples[(row["stage"], row["status"])] = row["n"]
    for unrunnable in unrunnable_tasks():
        families["pgstage_jobs_without_worker"].samples[(unrunnable.task_name,)] = unrunnable.jobs
    for bucket, count in unsaved_counts_by_age().items():
        families["pgstage_unsaved_runs"].samples[(bucket,)] = count


def collect_history(families: dict[str, Family]) -> None:
    """The counts that grow with history (finished jobs, stages, runs, refunds): full
    aggregates, taken by the ``metrics_snapshot`` sweep, never on a scrape."""
    jobs = families["pgstage_jobs"]
    for row in (
        ProcrastinateJob.objects.exclude(status__in=LIVE_JOB_STATUSES)
        .values("queue_name", "status")
        .annotate(n=Count("id"))
        .order_by()
    ):
        jobs.samples[(row["queue_name"], row["status"])] = row["n"]
    for queue in {queue for queue, _ in jobs.samples}:
        for status in JOB_STATUSES:
            if status not in LIVE_JOB_STATUSES:
                jobs.samples.setdefault((queue, status), 0)
    stages = families["pgstage_pipeline_runs"]
    durations = families["pgstage_pipeline_stage_duration_seconds"]
    for row in (
        PipelineRun.objects.exclude(status=LedgerStatus.RUNNING)
        .values("stage", "status")
        .annotate(n=Count("id"), total=Sum(F("finished_at") - F("started_at")))
        .order_by()
    ):
        stages.samples[(row["stage"], row["status"])] = row["n"]
        if row["total"] is not None:
            durations.samples[(row["stage"], row["status"])] = [
                row["n"],
                row["total"].total_seconds(),
            ]
    analyses = families["pgstage_analysis_jobs"]
    for row in (
        AnalysisJob.objects.filter(deleted_at__isnull=True)
        .exclude(status__in=LIVE_ANALYSIS_STATUSES)
        .values("status")
        .annotate(n=Count("id"))
        .order_by()
    ):
        analyses.samples[(row["status"],)] = row["n"]
    saved = dict(AnalysisRun.objects.values_list("saved_by").annotate(n=Count("id")).order_by())
    runs = families["pgstage_analysis_runs"]
    for writer in SavedBy:
        runs.samples[(writer.value,)] = saved.get(writer.value, 0)
    runs.samples[(LEGACY,)] = saved.get(None, 0)
    families["pgstage_sweep_rescues"].samples[()] = saved.get(SavedBy.WORKER.value, 0)
    refunds = CreditEntry.objects.filter(kind=CreditKind.REFUND).aggregate(
        n=Count("id"), credits=Sum("amount")
    )
    families["pgstage_refunds"].samples[()] = refunds["n"]
    families["pgstage_refunded_credits"].samples[()] = refunds["credits"] or 0


def snapshot_take() -> None:
    """Take the history's counts now and keep them for the scrapes (one row)."""
    families = _empty_families()
    collect_history(families)
    payload = {
        name: [[list(labels), value] for labels, value in family.samples.items()]
        for name, family in families.items()
    }
    with connection.cursor() as cursor:
        cursor.execute(METRIC_QUERIES["snapshot_save"], {"payload": Jsonb(payload)})


class DatabaseCollector(Collector):
    """Every pgstage metric: the live numbers counted now, the history's from the latest
    snapshot (``pgstage_metrics_snapshot_age_seconds`` says how old it is). A scrape
    therefore costs what is in flight, not what the tables hold."""

    def collect(self) -> Iterator[Metric]:
        families = _empty_families()
        age = None
        with connection.cursor() as cursor:
            cursor.execute(METRIC_QUERIES["snapshot_read"])
            row = cursor.fetchone()
        if row is not None:
            payload, age = row
            payload = json.loads(payload) if isinstance(payload, str) else payload
            for name, samples in payload.items():
                if name in families:
                    for labels, value in samples:
                        families[name].samples[tuple(labels)] = value
        collect_live(families)
        for name, family in families.items():
            yield family.metric(name)
        snapshot_age = GaugeMetricFamily(
            "pgstage_metrics_snapshot_age_seconds",
            "How old the history's counts are (the metrics_snapshot sweep takes them; "
            "-1: not taken yet).",
        )
        snapshot_age.add_metric([], -1 if age is None else float(age))
        yield snapshot_age


@declare_sweep(name="metrics_snapshot", cron="* * * * *", batch_size=1)
def take_metrics_snapshot(ctx: SweepContext) -> SweepResult:
    """Count the history's metrics (finished jobs, stages, runs, refunds) for /metrics."""
    if ctx.dry_run:
        return SweepResult()
    snapshot_take()
    return SweepResult(selected=1, changed=1)


REGISTRY = CollectorRegistry(auto_describe=False)
REGISTRY.register(DatabaseCollector())

#: Refused admissions by reason. A refused admit must write nothing (DESIGN §5, 5 and 9),
#: so this one is counted in the serving process, not in the database: each web process
#: reports its own count and Prometheus sums them over instances.
ADMISSION_REJECTIONS = Counter(
    "pgstage_admission_rejections",
    "Analysis admissions refused at click time, by reason (per web process).",
    ["reason"],
    registry=REGISTRY,
)
ADMISSION_PATH = "/api/analysis-jobs"


def record_admission_rejection(reason: str) -> None:
    ADMISSION_REJECTIONS.labels(reason=reason).inc()


def record_api_refusal(request: HttpRequest, code: str) -> None:
    """Count a 4xx answer to ``POST /api/analysis-jobs`` as an admission rejection (a
    missing token is not one: nobody was refused an analysis)."""
    if (
        request.method == "POST"
        and request.path.rstrip("/") == ADMISSION_PATH
        and code != "unauthenticated"
    ):
        record_admission_rejection(code)


def _refuse(status: int, code: str, detail: str) -> JsonResponse:
    response = JsonResponse({"error": code, "detail": detail}, status=status)
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
    return response


def _denial(request: HttpRequest) -> JsonResponse | None:
    """None when the request may read the metrics, else the 401/403 answer."""
    token = settings.METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    if header:
        scheme, _, presented = header.partition(" ")
        if (
            scheme.lower() == "bearer"
            and token
            and hmac.compare_digest(presented.strip().encode(), token.encode())
        ):
            return None
        return _refuse(403, "forbidden", "the bearer token does not match METRICS_TOKEN")
    if request.user.is_authenticated and request.user.is_staff:
        return None
    if request.user.is_authenticated:
        return _refuse(403, "forbidden", "metrics are for staff users or the METRICS_TOKEN")
    hint = (
        "send 'Authorization: Bearer <METRICS_TOKEN>'"
        if token
        else "METRICS_TOKEN is unset: log in as a staff user, or set METRICS_TOKEN"
    )
    return _refuse(401, "unauthenticated", hint)


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus scrape endpoint (read-only; every value is computed at scrape time)."""
    denial = _denial(request)
    if denial is not None:
        return denial
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
