"""System checks for the settings the framework relies on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register
from django.db import connections

from queueing.outage import beat_resume_seconds
from queueing.sweeps import resume_gap_seconds


@register()
def check_database(app_configs: Sequence[AppConfig] | None, **kwargs: Any) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    # The backend's vendor, not its ENGINE path: a project's own PostgreSQL backend (a
    # subclass of Django's) counts.
    if connections["default"].vendor != "postgresql":
        errors.append(
            Error(
                "pgstage needs PostgreSQL: advisory locks, partial unique indexes and "
                "SKIP LOCKED have no equivalent elsewhere.",
                hint="Set DATABASE_URL=postgresql://… or unset it to use the embedded server.",
                id="queueing.E001",
            )
        )
    if "procrastinate.contrib.django" not in settings.INSTALLED_APPS:
        errors.append(
            Error(
                "queueing needs 'procrastinate.contrib.django' in INSTALLED_APPS.",
                id="queueing.E002",
            )
        )
    errors.extend(_check_stall_threshold())
    errors.extend(_check_recovery_period())
    return errors


def _check_recovery_period() -> list[Error]:
    """Recovery must run well within its resume gap (the stall threshold less one and a
    half heartbeats, less the liveness bound): a pause between two runs longer than that
    counts as a time nobody watched (``Sweep.resume_gap_seconds``), so a period near it
    would make every run (a slow one, a busy maintenance thread) a restart of the clock,
    and no dead worker's job would ever be recovered. At most half the gap leaves the
    other half for slow runs."""
    period = getattr(settings, "QUEUEING_STALLED_RECOVERY_SECONDS", 5)
    grace = float(getattr(settings, "QUEUEING_STALLED_WORKER_SECONDS", 30))
    beat = float(getattr(settings, "QUEUEING_HEARTBEAT_SECONDS", 10))
    gap = resume_gap_seconds(grace=grace, heartbeat=beat)
    if not isinstance(period, int | float) or isinstance(period, bool) or period <= 0:
        ok = False
    else:
        # A threshold within a heartbeat or two is queueing.W001's; nothing to weigh.
        ok = gap <= 0 or period <= gap / 2
    if ok:
        return []
    return [
        Error(
            f"QUEUEING_STALLED_RECOVERY_SECONDS={period!r} must be a positive number of "
            f"seconds, at most half the stall threshold less one and a half heartbeats "
            f"less the liveness bound (({grace:g} - 1.5 * {beat:g} - "
            f"{beat_resume_seconds(beat):g}) / 2 = {gap / 2:g} s): a longer pause between "
            "two recoveries counts as a time nobody watched, so with a slow run recovery "
            "would restart its clock and never recover a dead worker's job.",
            hint=f"Use {max(gap / 2, 0.1):g} s or less, or raise STALLED_WORKER_SECONDS.",
            id="queueing.E003",
        )
    ]


def _check_stall_threshold() -> list[Warning]:
    """A worker is declared dead after QUEUEING_STALLED_WORKER_SECONDS of silence; that
    must outlast two heartbeats, and — unless the worker keeps beating while it drains
    (pgstage's worker does) — the whole drain, or a deploy runs jobs twice."""
    grace = float(getattr(settings, "QUEUEING_STALLED_WORKER_SECONDS", 30))
    beat = float(getattr(settings, "QUEUEING_HEARTBEAT_SECONDS", 10))
    warnings = []
    if grace < 2 * beat:
        warnings.append(
            Warning(
                f"QUEUEING_STALLED_WORKER_SECONDS={grace:g} is shorter than two heartbeats "
                f"(workers beat every {beat:g} s): live workers would be treated as dead "
                "and their jobs run twice.",
                hint=f"Use {max(30, 3 * beat):g} seconds or more, or beat more often.",
                id="queueing.W001",
            )
        )
    hook = getattr(settings, "PROCRASTINATE_ON_APP_READY", None)
    if hook != "queueing.worker.install":
        drain = (getattr(settings, "PROCRASTINATE_WORKER_DEFAULTS", {}) or {}).get(
            "shutdown_graceful_timeout"
        )
        warnings.append(
            Warning(
                "procrastinate's own worker stops heart-beating as soon as it starts "
                f"draining, so a stall threshold of {grace:g} s cannot cover a drain (graceful "
                f"timeout {drain if drain is not None else 'unbounded'} s, and unbounded for "
                "sync jobs): a deploy would run the draining worker's jobs a second time.",
                hint="Set PROCRASTINATE_ON_APP_READY = 'queueing.worker.install' so that "
                "workers keep beating until their last job ends.",
                id="queueing.W001",
            )
        )
    return warnings
