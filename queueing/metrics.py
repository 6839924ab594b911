"""``/metrics``: Prometheus text exposition, from the database and from the web processes.

Two kinds of numbers, each kept where no scrape can see a different answer:

* **What the database holds** (procrastinate's jobs and workers, every stage ledger, the
  inline sweeps' clocks, and whatever a project adds). A custom collector reads it on
  each scrape instead of keeping in-process counters, so every web process reports the
  same truth and a restart loses nothing. What an alert needs fresh (waiting and running
  jobs, running ledger entries, workers) is counted on each scrape through partial
  indexes, so it costs what is in flight; the counts that grow with history (finished
  jobs, finished ledger entries) are taken once a minute by the ``metrics_snapshot``
  sweep and read from its one row (``pgstage_metrics_snapshot``), so a scrape never
  aggregates a million rows.
* **What happens in the web process** (requests by method and status with their
  latency, and counters a project declares on :data:`PROCESS_REGISTRY`, such as refusals
  that must write nothing). Under gunicorn these use prometheus_client's multiprocess
  mode (``PROMETHEUS_MULTIPROC_DIR``, set by :mod:`queueing.gunicorn`): every process
  writes its values to a shared directory and a scrape sums them, so a counter never
  jumps back when the load balancer sends the next scrape to another process.

A project adds its own database metrics with a :class:`MetricSource` subclass listed in
``QUEUEING_METRICS_SOURCES`` (dotted paths): its families are collected beside the
framework's, their history included in the same snapshot.

Access: ``Authorization: Bearer <METRICS_TOKEN>``, or a logged-in user with the
permission ``queueing.view_metrics`` (superusers have it). With ``METRICS_TOKEN`` unset
only such users may read it.
"""

from __future__ import annotations

import hmac
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from django.apps import apps
from django.conf import settings
from django.db import connection
from django.db.models import Count
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.module_loading import import_string
from django.views.decorators.http import require_safe
from procrastinate.contrib.django.models import ProcrastinateJob
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from psycopg.types.json import Jsonb

from queueing.jobs import unrunnable_tasks
from queueing.ledger import LedgerEntry, LedgerStatus
from queueing.sql import load
from queueing.sweeps import SweepContext, SweepResult, declare_sweep

__all__ = ["PROCESS_REGISTRY", "Family", "MetricSource", "metrics_view"]

#: procrastinate's job statuses, reported even at zero so a dashboard's series never gaps.
JOB_STATUSES = ("todo", "doing", "succeeded", "failed", "cancelled", "aborting", "aborted")
#: Counted on each scrape (bounded by live work); the rest come from the snapshot.
LIVE_JOB_STATUSES = ("todo", "doing")
METRIC_QUERIES = load("queueing", "metrics.sql")
#: The permission that lets a logged-in user read ``/metrics``.
METRICS_PERMISSION = "queueing.view_metrics"


@dataclass
class Family:
    """One metric family as collected: kind (``gauge``, ``counter`` or ``summary``), help
    text, label names, and per label values either a number or ``[count, sum]``
    (summary)."""

    kind: str
    doc: str
    labels: tuple[str, ...]
    samples: dict[tuple[str, ...], Any] = field(default_factory=dict)

    def metric(self, name: str) -> Metric:
        if self.kind == "summary":
            summary = SummaryMetricFamily(name, self.doc, labels=list(self.labels))
            for labels, (count, total) in sorted(self.samples.items()):
                summary.add_metric(list(labels), count_value=count, sum_value=total)
            return summary
        maker = CounterMetricFamily if self.kind == "counter" else GaugeMetricFamily
        family = maker(name, self.doc, labels=list(self.labels))
        for labels, value in sorted(self.samples.items()):
            family.add_metric(list(labels), value)
        return family


class MetricSource:
    """Metrics a project reads from its own tables, collected beside the framework's.

    Subclass it and list the class's dotted path in ``QUEUEING_METRICS_SOURCES``.
    :meth:`families` declares every family (with the series that must exist at zero);
    :meth:`collect_live` fills what an alert needs fresh, on each scrape (keep it bounded
    by live work: partial indexes); :meth:`collect_history` fills what grows with
    history, once a minute in the ``metrics_snapshot`` sweep. Every method reads only;
    none may write. Family names must be unique across sources.
    """

    def families(self) -> dict[str, Family]:
        return {}

    def collect_live(self, families: dict[str, Family]) -> None:
        """Fill the live numbers into ``families`` (the merged families of every source)."""

    def collect_history(self, families: dict[str, Family]) -> None:
        """Fill the history's counts into ``families`` (the merged families of every
        source); the snapshot keeps them until the next run."""


def ledger_models() -> list[type[LedgerEntry]]:
    """Every concrete stage ledger model of the installed apps whose table exists (one
    catalog query: a model whose migration has not run yet is left out, not an error)."""
    models = [m for m in apps.get_models() if issubclass(m, LedgerEntry)]
    if not models:
        return []
    tables = set(connection.introspection.table_names())
    return [m for m in models if m._meta.db_table in tables]


def _count_jobs(jobs: Family, queryset: Any) -> None:
    """procrastinate's jobs of ``queryset`` per queue and status, into ``jobs``."""
    for row in queryset.values("queue_name", "status").annotate(n=Count("id")).order_by():
        jobs.samples[(row["queue_name"], row["status"])] = row["n"]


class QueueingMetrics(MetricSource):
    """The framework's own families: jobs per queue and status, workers, ledger entries
    per ledger and status, and the age of each inline sweep's last run."""

    def families(self) -> dict[str, Family]:
        families = {
            "pgstage_queue_depth": Family(
                "gauge", "Jobs waiting to run (procrastinate todo) per queue.", ("queue",)
            ),
            "pgstage_jobs": Family(
                "gauge", "procrastinate jobs per queue and status.", ("queue", "status")
            ),
            "pgstage_workers": Family(
                "gauge",
                "Registered procrastinate workers: alive (heart-beat within "
                "QUEUEING_STALLED_WORKER_SECONDS) or silent.",
                ("state",),
            ),
            "pgstage_worker_hung_slots": Family(
                "gauge",
                "Job slots of alive workers held by hung runs (past their task's timeout: "
                "ended, but a sync thread cannot be stopped).",
                (),
            ),
            "pgstage_workers_all_slots_hung": Family(
                "gauge",
                "Alive workers whose every slot is held by a hung run: they run nothing "
                "until restarted.",
                (),
            ),
            "pgstage_ledger_entries": Family(
                "gauge", "Stage ledger rows per ledger model and status.", ("ledger", "status")
            ),
            "pgstage_inline_sweep_age_seconds": Family(
                "gauge",
                "Seconds since each inline sweep (stalled recovery) last ran on any worker.",
                ("sweep",),
            ),
            "pgstage_jobs_without_worker": Family(
                "gauge",
                "Waiting jobs whose task no live worker has, per task (they wait for one).",
                ("task",),
            ),
        }
        for state in ("alive", "silent"):
            families["pgstage_workers"].samples[(state,)] = 0
        families["pgstage_worker_hung_slots"].samples[()] = 0
        families["pgstage_workers_all_slots_hung"].samples[()] = 0
        return families

    def collect_live(self, families: dict[str, Family]) -> None:
        jobs = families["pgstage_jobs"]
        _count_jobs(jobs, ProcrastinateJob.objects.filter(status__in=LIVE_JOB_STATUSES))
        for queue in {queue for queue, _ in jobs.samples}:
            for live in LIVE_JOB_STATUSES:
                jobs.samples.setdefault((queue, live), 0)
            families["pgstage_queue_depth"].samples[(queue,)] = jobs.samples[(queue, "todo")]
        ledgers = families["pgstage_ledger_entries"]
        for model in ledger_models():
            running = model._base_manager.filter(status=LedgerStatus.RUNNING).count()
            ledgers.samples[(model._meta.label_lower, LedgerStatus.RUNNING.value)] = running
        threshold = float(getattr(settings, "QUEUEING_STALLED_WORKER_SECONDS", 30))
        with connection.cursor() as cursor:
            cursor.execute(METRIC_QUERIES["workers"], {"threshold": threshold})
            alive, silent, hung_slots, all_hung = cursor.fetchone()
            cursor.execute(METRIC_QUERIES["inline_sweeps"])
            sweeps = cursor.fetchall()
        families["pgstage_workers"].samples[("alive",)] = alive
        families["pgstage_workers"].samples[("silent",)] = silent
        families["pgstage_worker_hung_slots"].samples[()] = hung_slots
        families["pgstage_workers_all_slots_hung"].samples[()] = all_hung
        for name, age in sweeps:
            families["pgstage_inline_sweep_age_seconds"].samples[(name,)] = float(age)
        for unrunnable in unrunnable_tasks():
            families["pgstage_jobs_without_worker"].samples[(unrunnable.task_name,)] = (
                unrunnable.jobs
            )

    def collect_history(self, families: dict[str, Family]) -> None:
        jobs = families["pgstage_jobs"]
        _count_jobs(jobs, ProcrastinateJob.objects.exclude(status__in=LIVE_JOB_STATUSES))
        for queue in {queue for queue, _ in jobs.samples}:
            for status in JOB_STATUSES:
                if status not in LIVE_JOB_STATUSES:
                    jobs.samples.setdefault((queue, status), 0)
        ledgers = families["pgstage_ledger_entries"]
        for model in ledger_models():
            counts = dict(
                model._base_manager.exclude(status=LedgerStatus.RUNNING)
                .values_list("status")
                .annotate(n=Count("id"))
                .order_by()
            )
            for status in (LedgerStatus.SUCCESS, LedgerStatus.FAILED):
                ledgers.samples[(model._meta.label_lower, status.value)] = counts.get(status, 0)


def sources() -> list[MetricSource]:
    """The framework's source, then each of ``QUEUEING_METRICS_SOURCES`` in order."""
    extra = getattr(settings, "QUEUEING_METRICS_SOURCES", ()) or ()
    return [QueueingMetrics(), *(import_string(path)() for path in extra)]


def _empty_families(active: list[MetricSource]) -> dict[str, Family]:
    families: dict[str, Family] = {}
    for source in active:
        for name, family in source.families().items():
            if name in families:
                raise ValueError(f"metric family {name} is declared by two metric sources")
            families[name] = family
    return families


def snapshot_take() -> None:
    """Take the history's counts now and keep them for the scrapes (one row, replaced
    whole: two concurrent takes leave one of the two complete snapshots)."""
    active = sources()
    families = _empty_families(active)
    for source in active:
        source.collect_history(families)
    payload = {
        name: [[list(labels), value] for labels, value in family.samples.items()]
        for name, family in families.items()
    }
    with connection.cursor() as cursor:
        # django-stubs' parameter types leave out psycopg's adapters such as Jsonb.
        params = {"payload": Jsonb(payload)}
        cursor.execute(METRIC_QUERIES["snapshot_save"], params)  # type: ignore[arg-type]


class DatabaseCollector(Collector):
    """Every database metric: the live numbers counted now, the history's from the latest
    snapshot (``pgstage_metrics_snapshot_age_seconds`` says how old it is). A scrape
    therefore costs what is in flight, not what the tables hold. Reads only."""

    def collect(self) -> Iterator[Metric]:
        active = sources()
        families = _empty_families(active)
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
        for source in active:
            source.collect_live(families)
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
    """Count the history's metrics (finished jobs and ledger entries, and every metric
    source's history) for /metrics."""
    if ctx.dry_run:
        return SweepResult()
    snapshot_take()
    return SweepResult(selected=1, changed=1)


REGISTRY = CollectorRegistry(auto_describe=False)
REGISTRY.register(DatabaseCollector())

#: Where the web process's own metrics are declared (``Counter(..., registry=
#: PROCESS_REGISTRY)``). Without ``PROMETHEUS_MULTIPROC_DIR`` (one process: runserver,
#: tests) a scrape reads it directly; with it, from every process's files.
PROCESS_REGISTRY = CollectorRegistry()


#: Every request the web process answered, by method and status, with its latency
#: (``queueing.middleware.RequestMetricsMiddleware`` observes it).
REQUEST_SECONDS = Histogram(
    "pgstage_http_request_duration_seconds",
    "Seconds from a request entering Django's middleware to its response, by method and "
    "status (the _count series counts requests).",
    ["method", "status"],
    registry=PROCESS_REGISTRY,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
#: Methods reported by name; any other is reported as ``other`` (bounded label values).
REQUEST_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def observe_request(method: str, status: int, seconds: float) -> None:
    label = method if method in REQUEST_METHODS else "other"
    REQUEST_SECONDS.labels(method=label, status=str(status)).observe(seconds)


def process_metrics() -> CollectorRegistry:
    """The registry a scrape reads the web processes' metrics from."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        MultiProcessCollector(registry)
        return registry
    return PROCESS_REGISTRY


def _refuse(status: int, code: str, detail: str) -> JsonResponse:
    response = JsonResponse({"error": code, "detail": detail}, status=status)
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
    return response


def _denial(request: HttpRequest) -> JsonResponse | None:
    """None when the request may read the metrics, else the 401/403 answer."""
    token = getattr(settings, "METRICS_TOKEN", "")
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
    if request.user.is_authenticated and request.user.has_perm(METRICS_PERMISSION):
        return None
    if request.user.is_authenticated:
        return _refuse(
            403,
            "forbidden",
            f"metrics need the permission {METRICS_PERMISSION} or the METRICS_TOKEN",
        )
    hint = (
        "send 'Authorization: Bearer <METRICS_TOKEN>'"
        if token
        else f"METRICS_TOKEN is unset: log in as a user with {METRICS_PERMISSION}, "
        "or set METRICS_TOKEN"
    )
    return _refuse(401, "unauthenticated", hint)


@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus scrape endpoint (read-only; every value is computed at scrape time)."""
    denial = _denial(request)
    if denial is not None:
        return denial
    body = generate_latest(REGISTRY) + generate_latest(process_metrics())
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
