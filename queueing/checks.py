"""System checks for the settings the framework relies on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections

from queueing import timeouts
from queueing.outage import beat_resume_seconds
from queueing.sweeps import resume_gap_seconds


@register()
def check_database(app_configs: Sequence[AppConfig] | None, **kwargs: Any) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    # The backend's vendor, not its ENGINE path: a project's own PostgreSQL backend (a
    # subclass of Django's) counts.
    if connections[DEFAULT_DB_ALIAS].vendor != "postgresql":
        errors.append(
            Error(
                "pgstage needs PostgreSQL: advisory locks, partial unique indexes and "
                "SKIP LOCKED have no equivalent elsewhere.",
                hint="Point DATABASES['default'] at a PostgreSQL server: ENGINE "
                "'django.db.backends.postgresql' (or a backend of your own that subclasses it).",
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
    alias = getattr(settings, "PROCRASTINATE_DATABASE_ALIAS", DEFAULT_DB_ALIAS)
    if alias != DEFAULT_DB_ALIAS:
        errors.append(
            Error(
                f"PROCRASTINATE_DATABASE_ALIAS={alias!r}: pgstage enqueues on the "
                f"{DEFAULT_DB_ALIAS!r} connection, in the transaction of the write that "
                "causes the job, and its workers would fetch from another; those jobs would "
                "never run.",
                hint=f"Remove PROCRASTINATE_DATABASE_ALIAS (or set it to {DEFAULT_DB_ALIAS!r}): "
                "procrastinate's tables and your own share the default database.",
                id="queueing.E006",
            )
        )
    errors.extend(_check_isolation_level())
    errors.extend(_check_stall_threshold())
    errors.extend(_check_recovery_period())
    errors.extend(_check_job_timeouts())
    errors.extend(_check_busy_poll())
    return errors


def _check_isolation_level() -> list[Warning]:
    """The ledger, the serial queue and the sweeps read under READ COMMITTED (each
    statement sees what committed before it: a claim what a replay just committed, a
    statement after a lock wait what the lock's holder wrote)."""
    import psycopg

    level = (settings.DATABASES.get(DEFAULT_DB_ALIAS, {}).get("OPTIONS") or {}).get(
        "isolation_level"
    )
    if level is None:
        return []
    try:
        level = psycopg.IsolationLevel(level)
    except ValueError:
        return []  # Django's own check refuses it
    if level in (psycopg.IsolationLevel.READ_COMMITTED, psycopg.IsolationLevel.READ_UNCOMMITTED):
        return []  # PostgreSQL runs READ UNCOMMITTED as READ COMMITTED
    return [
        Warning(
            f"DATABASES['default']['OPTIONS']['isolation_level'] is "
            f"{level.name.replace('_', ' ')}: pgstage's "
            "ledger, serial queue and sweeps assume READ COMMITTED, where each statement "
            "sees what committed before it; under a stricter level a claim or an admission "
            "that waited for a lock fails with a serialization error, or reads data older "
            "than the lock it waited for.",
            hint="Leave OPTIONS['isolation_level'] unset (PostgreSQL's READ COMMITTED) on the "
            "connection pgstage uses.",
            id="queueing.W003",
        )
    ]


#: The levels under which each statement sees what committed before it (PostgreSQL runs
#: READ UNCOMMITTED as READ COMMITTED).
_STATEMENT_SNAPSHOTS = ("read committed", "read uncommitted")


@register(Tags.database)
def check_server_isolation(
    app_configs: Sequence[AppConfig] | None,
    databases: Sequence[str] | None = None,
    **kwargs: Any,
) -> list[CheckMessage]:
    """The database's default level (``default_transaction_isolation``: the server's, the
    database's or the role's). OPTIONS' ``isolation_level`` does not replace it: psycopg
    sends that level with each ``BEGIN`` only, so autocommit statements (a claim, an
    admission or an ``enqueue`` outside ``atomic()``) and the workers' pool, which takes no
    level from OPTIONS, run under the default. A database check: ``migrate`` and ``check
    --database default`` run it; a server that cannot be reached gives no message here."""
    if not databases or DEFAULT_DB_ALIAS not in databases:
        return []
    connection = connections[DEFAULT_DB_ALIAS]
    if connection.vendor != "postgresql":
        return []
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('default_transaction_isolation')")
            (level,) = cursor.fetchone()
    except (DatabaseError, ImproperlyConfigured):
        return []  # the connection's own errors say more, where it is used
    if level in _STATEMENT_SNAPSHOTS:
        return []
    return [
        Warning(
            f"The database's default_transaction_isolation is {level!r}: the ledger, the "
            "serial queue and the sweeps assume READ COMMITTED, where each statement sees "
            "what committed before it; under a stricter level a claim or an admission that "
            "waited for a lock fails with a serialization error, or reads data older than "
            "the lock it waited for. OPTIONS['isolation_level'] does not cover it: "
            "statements outside atomic() and the workers' connections run under the "
            "database's default.",
            hint="Set it back to 'read committed' where it is set: ALTER DATABASE … SET "
            "default_transaction_isolation = 'read committed' (an ALTER ROLE … SET of the "
            "role pgstage connects as overrides the database's; PGOPTIONS overrides both).",
            id="queueing.W004",
        )
    ]


def _check_job_timeouts() -> list[Error]:
    """A run's bound (``queueing.timeouts``): the default and each task's a finite number
    of seconds, 0 (or None, for the default) for no bound; the grace a positive one; and
    a bound no shorter than the grace *in force* (``timeouts.grace_seconds``: the grace
    configured, raised to ``timeouts.least_grace_seconds`` when that is longer) —
    recovery steps in that grace after the deadline, so a shorter bound would be no
    bound the task could plan around."""
    errors = []
    raw_grace = getattr(settings, "QUEUEING_JOB_TIMEOUT_GRACE_SECONDS", 30)
    grace = timeouts.check_seconds(raw_grace, allow_zero=False)
    if grace is None:
        errors.append(
            Error(
                f"QUEUEING_JOB_TIMEOUT_GRACE_SECONDS={raw_grace!r} must be a positive, finite "
                "number of seconds: how long past its timeout a run may still save its own "
                "outcome before stalled recovery ends it.",
                id="queueing.E004",
            )
        )
    least = timeouts.least_grace_seconds()
    in_force = timeouts.grace_seconds()
    raw_default = getattr(settings, "QUEUEING_JOB_TIMEOUT_SECONDS", 3600)
    bounds = {"QUEUEING_JOB_TIMEOUT_SECONDS": raw_default}
    bounds.update({f"@task(name={name!r}) timeout": v for name, v in timeouts.declared().items()})
    for source, raw in bounds.items():
        seconds = timeouts.check_seconds(raw)
        if seconds is None:
            errors.append(
                Error(
                    f"{source}={raw!r} must be a finite number of seconds at least 0 "
                    "(0 or None: runs are not bounded).",
                    id="queueing.E004",
                )
            )
        elif grace is not None and 0 < seconds < in_force:
            if grace >= least:
                why = f"QUEUEING_JOB_TIMEOUT_GRACE_SECONDS={grace:g}"
                hint = f"Use {in_force:g} s or more, or lower the grace."
            else:
                why = (
                    f"QUEUEING_JOB_TIMEOUT_GRACE_SECONDS={grace:g}, raised to stalled "
                    "recovery's resume gap plus twice the liveness bound"
                )
                hint = (
                    f"Use {in_force:g} s or more, or lower QUEUEING_STALLED_WORKER_SECONDS "
                    "(the grace in force follows it)."
                )
            errors.append(
                Error(
                    f"{source}={raw!r} is shorter than the grace in force, {in_force:g} s "
                    f"({why}): a run is ended a grace after its timeout, so a timeout "
                    "shorter than the grace bounds nothing the task can rely on.",
                    hint=hint,
                    id="queueing.E004",
                )
            )
    return errors


def _check_busy_poll() -> list[Error]:
    """A job that raised ``PollLater`` waits ``QUEUEING_BUSY_POLL_SECONDS`` (jittered down
    to half) before it runs again: 0 would make it spin against the database."""
    raw = getattr(settings, "QUEUEING_BUSY_POLL_SECONDS", 2)
    if timeouts.check_seconds(raw, allow_zero=False) is not None:
        return []
    return [
        Error(
            f"QUEUEING_BUSY_POLL_SECONDS={raw!r} must be a positive, finite number of "
            "seconds: a job waiting on a busy holder would poll again at once, in a loop.",
            hint="Use the default, 2 s.",
            id="queueing.E005",
        )
    ]


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
            hint=f"Use {max(gap / 2, 0.1):g} s or less, or raise QUEUEING_STALLED_WORKER_SECONDS.",
            id="queueing.E003",
        )
    ]


def _check_stall_threshold() -> list[CheckMessage]:
    """A worker is declared dead after QUEUEING_STALLED_WORKER_SECONDS of silence; that
    must outlast one heartbeat (an error: every live worker would be declared dead), should
    outlast two, and — unless the worker keeps beating while it drains
    (pgstage's worker does) — the whole drain, or a deploy runs jobs twice."""
    grace = float(getattr(settings, "QUEUEING_STALLED_WORKER_SECONDS", 30))
    beat = float(getattr(settings, "QUEUEING_HEARTBEAT_SECONDS", 10))
    warnings: list[CheckMessage] = []
    if grace <= beat:
        return [
            Error(
                f"QUEUEING_STALLED_WORKER_SECONDS={grace:g} is no longer than one heartbeat "
                f"(workers beat every {beat:g} s): every live worker would look dead between "
                "two beats, and stalled recovery would run its jobs again and again.",
                hint=f"Use {max(30, 3 * beat):g} seconds or more, or beat more often "
                "(QUEUEING_HEARTBEAT_SECONDS).",
                id="queueing.E007",
            )
        ]
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
                id="queueing.W002",
            )
        )
    return warnings
