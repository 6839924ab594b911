"""The reference site's own metrics, beside the framework's (``queueing.metrics``).

:class:`SiteMetrics` is listed in ``QUEUEING_METRICS_SOURCES``: its families (stages per
stage and status, their durations, analyses, runs per writer, unsaved runs, rescues,
refunds) are read from the database like the framework's, the live ones on each scrape,
the history's from the ``metrics_snapshot`` row. Refused admissions must write nothing
(docs/design.md#admission), so they are counted in the web process instead, on the
framework's process registry (summed across gunicorn processes).
"""

from __future__ import annotations

from django.db.models import Case, CharField, Count, F, Q, Sum, Value, When
from django.http import HttpRequest
from prometheus_client import Counter

from pipeline.models import REPLAY_REASON_PREFIX, PipelineRun
from queueing.ledger import LedgerStatus
from queueing.metrics import PROCESS_REGISTRY, Family, MetricSource
from runs.models import AnalysisJob, AnalysisRun, CreditEntry, CreditKind, SavedBy
from runs.selectors import unsaved_counts_by_age

LIVE_ANALYSIS_STATUSES = ("queued", "pending", "running")
#: A stage a replay reset or queued and that has not run since: ``failed`` in the ledger
#: (so it is claimable) with the replay as its reason. It waits for the replay's job; an
#: alert on failed stages must not count it.
WAITING = "waiting"
#: ``saved_by`` NULL is a legacy row (it counts as a client save, docs/runs.md).
LEGACY = "legacy"


class SiteMetrics(MetricSource):
    """Stages, analyses, runs and credits of the reference site."""

    def families(self) -> dict[str, Family]:
        families = {
            "pgstage_pipeline_runs": Family(
                "gauge",
                "Stage ledger rows per stage and status; waiting: reset or queued by a "
                "replay, not run since (failed in the ledger).",
                ("stage", "status"),
            ),
            "pgstage_pipeline_stage_duration_seconds": Family(
                "summary",
                "Duration of the last attempt of each finished stage run "
                "(finished_at - started_at).",
                ("stage", "status"),
            ),
            "pgstage_analysis_jobs": Family(
                "gauge", "Analysis jobs (not deleted) per status.", ("status",)
            ),
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

    def collect_live(self, families: dict[str, Family]) -> None:
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
        for bucket, count in unsaved_counts_by_age().items():
            families["pgstage_unsaved_runs"].samples[(bucket,)] = count

    def collect_history(self, families: dict[str, Family]) -> None:
        stages = families["pgstage_pipeline_runs"]
        durations = families["pgstage_pipeline_stage_duration_seconds"]
        waiting = Q(status=LedgerStatus.FAILED, error__startswith=REPLAY_REASON_PREFIX)
        for row in (
            PipelineRun.objects.exclude(status=LedgerStatus.RUNNING)
            .annotate(
                shown=Case(
                    When(waiting, then=Value(WAITING)),
                    default=F("status"),
                    output_field=CharField(),
                )
            )
            .values("stage", "shown")
            .annotate(n=Count("id"), total=Sum(F("finished_at") - F("started_at")))
            .order_by()
        ):
            stages.samples[(row["stage"], row["shown"])] = row["n"]
            # A waiting stage has not run since the replay: its times are the reset's.
            if row["total"] is not None and row["shown"] != WAITING:
                durations.samples[(row["stage"], row["shown"])] = [
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


#: Refused admissions by reason: counted in the web processes (a refused admit writes
#: nothing), summed across them by the framework's multiprocess collection.
ADMISSION_REJECTIONS = Counter(
    "pgstage_admission_rejections",
    "Analysis admissions refused at click time, by reason.",
    ["reason"],
    registry=PROCESS_REGISTRY,
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
