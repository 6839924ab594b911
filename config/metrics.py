"""``/metrics``: Prometheus text exposition, computed from the database at scrape time.

The numbers live in PostgreSQL (procrastinate's job table, the stage ledger, the credit
ledger, the analyses), so a custom collector reads them on each scrape instead of keeping
in-process counters: every web process reports the same truth, and a restart loses
nothing. The collector sits in its own registry, so the exposition holds only these
metrics, not the serving process's own.

Access: ``Authorization: Bearer <METRICS_TOKEN>`` or a staff session. With
``METRICS_TOKEN`` unset only staff sessions may read it.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator

from django.conf import settings
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

from pipeline.models import PipelineRun
from runs.models import AnalysisJob, AnalysisRun, CreditEntry, CreditKind, SavedBy
from runs.selectors import unsaved_counts_by_age

#: procrastinate's job statuses, reported even at zero so a dashboard's series never gaps.
JOB_STATUSES = ("todo", "doing", "succeeded", "failed", "cancelled", "aborting", "aborted")
#: ``saved_by`` NULL is a legacy row (it counts as a client save, DESIGN §4).
LEGACY = "legacy"


class DatabaseCollector(Collector):
    """Yields every pgstage metric from a handful of aggregate queries."""

    def collect(self) -> Iterator[Metric]:
        yield from self._procrastinate()
        yield from self._pipeline()
        yield from self._analyses()
        yield from self._credits()

    def _procrastinate(self) -> Iterator[Metric]:
        rows = (
            ProcrastinateJob.objects.values("queue_name", "status")
            .annotate(n=Count("id"))
            .order_by()
        )
        depth = GaugeMetricFamily(
            "pgstage_queue_depth",
            "Jobs waiting to run (procrastinate todo) per queue.",
            labels=["queue"],
        )
        jobs = GaugeMetricFamily(
            "pgstage_jobs",
            "procrastinate jobs per queue and status.",
            labels=["queue", "status"],
        )
        counts: dict[str, dict[str, int]] = {}
        for row in rows:
            counts.setdefault(row["queue_name"], {})[row["status"]] = row["n"]
        for queue in sorted(counts):
            depth.add_metric([queue], counts[queue].get("todo", 0))
            for status in JOB_STATUSES:
                jobs.add_metric([queue, status], counts[queue].get(status, 0))
        yield depth
        yield jobs

    def _pipeline(self) -> Iterator[Metric]:
        runs = GaugeMetricFamily(
            "pgstage_pipeline_runs",
            "Stage ledger rows per stage and status.",
            labels=["stage", "status"],
        )
        for row in (
            PipelineRun.objects.values("stage", "status")
            .annotate(n=Count("id"))
            .order_by("stage", "status")
        ):
            runs.add_metric([row["stage"], row["status"]], row["n"])
        yield runs

        durations = SummaryMetricFamily(
            "pgstage_pipeline_stage_duration_seconds",
            "Duration of the last attempt of each finished stage run (finished_at - started_at).",
            labels=["stage", "status"],
        )
        finished = (
            PipelineRun.objects.filter(started_at__isnull=False, finished_at__isnull=False)
            .values("stage", "status")
            .annotate(n=Count("id"), total=Sum(F("finished_at") - F("started_at")))
            .order_by("stage", "status")
        )
        for row in finished:
            durations.add_metric(
                [row["stage"], row["status"]],
                count_value=row["n"],
                sum_value=row["total"].total_seconds(),
            )
        yield durations

    def _analyses(self) -> Iterator[Metric]:
        jobs = GaugeMetricFamily(
            "pgstage_analysis_jobs", "Analysis jobs (not deleted) per status.", labels=["status"]
        )
        for row in (
            AnalysisJob.objects.filter(deleted_at__isnull=True)
            .values("status")
            .annotate(n=Count("id"))
            .order_by("status")
        ):
            jobs.add_metric([row["status"]], row["n"])
        yield jobs

        saved = dict(AnalysisRun.objects.values_list("saved_by").annotate(n=Count("id")).order_by())
        runs = GaugeMetricFamily(
            "pgstage_analysis_runs", "Recorded analysis runs per writer.", labels=["saved_by"]
        )
        for label, value in ((s.value, s.value) for s in SavedBy):
            runs.add_metric([label], saved.get(value, 0))
        runs.add_metric([LEGACY], saved.get(None, 0))
        yield runs

        unsaved = GaugeMetricFamily(
            "pgstage_unsaved_runs",
            "Finished analyses whose result is in no run yet, by age since they ended: "
            "under_grace is expected (the browser may still save), anything older means "
            "the backstop sweep is not keeping up.",
            labels=["age"],
        )
        for bucket, count in unsaved_counts_by_age().items():
            unsaved.add_metric([bucket], count)
        yield unsaved

        rescues = CounterMetricFamily(
            "pgstage_sweep_rescues",
            "Runs the backstop sweep recorded because no client saved them "
            "(analysis_runs.saved_by = 'worker').",
        )
        rescues.add_metric([], saved.get(SavedBy.WORKER.value, 0))
        yield rescues

    def _credits(self) -> Iterator[Metric]:
        refunds = CreditEntry.objects.filter(kind=CreditKind.REFUND).aggregate(
            n=Count("id"), credits=Sum("amount")
        )
        count = CounterMetricFamily("pgstage_refunds", "Credit refunds issued (one per job).")
        count.add_metric([], refunds["n"])
        yield count
        credits = CounterMetricFamily("pgstage_refunded_credits", "Credits given back by refunds.")
        credits.add_metric([], refunds["credits"] or 0)
        yield credits


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
