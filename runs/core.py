"""The core service: a run is created *held* at admission and released when the queue
reaches its job.

Creating a held run performs every synchronous check the core owns — at least one
source, each DOI well formed, today's provider budget — so each of those failures reaches
the user at click time, while the run refuses to judge until it is released. States:
``held → released → judging → done | failed``, or ``held → cancelled`` when the job ends
before its release. The tenant's daily budget counts the runs the provider may work
on: a unit is given back exactly when a held run is cancelled (it never was released).

:class:`CoreClient` is the interface the analyses' services talk to; :class:`LocalCore` keeps
the state machine in ``core_runs`` on Django's connection (so a create commits or rolls
back with the admission). A remote core is a class with the same four methods, selected
with the setting ``RUNS_CORE_CLIENT``. ``CORE_AVAILABLE = False`` makes the local core
unreachable (an outage, for tests and drills); ``CORE_DAILY_BUDGET`` caps creates per
tenant and UTC day.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Protocol

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone
from django.utils.module_loading import import_string
from psycopg.types.json import Jsonb

from queueing.sql import load
from runs.exceptions import (
    BudgetExhausted,
    CoreError,
    CoreStateError,
    CoreUnavailable,
    InvalidDoi,
    NoSources,
)
from runs.models import CoreRun, CoreRunState

DEFAULT_CLIENT = "runs.core.LocalCore"
#: Crossref's recommended DOI shape: "10." + a 4-9 digit registrant + "/" + a suffix.
DOI_PATTERN = re.compile(r"^10\.\d{4,9}/[-._;()/:A-Za-z0-9<>\[\]]+$")

queries = load("runs", "runs.sql")
logger = logging.getLogger(__name__)


class CoreClient(Protocol):
    """The upstream core service as pgstage calls it.

    Every call but ``create_held`` must be idempotent: a job retried after a crash
    repeats the call it may already have made. ``create_held`` runs before the admission
    takes the user's lock (a slow core never holds a user's other admits), in a commit of
    its own; a refused admission calls ``cancel_held``, and one that died in between
    leaves a held run ``expire_held`` cancels later. A core whose held runs live in the
    admission's database (:class:`LocalCore`, ``joins_admission = True``) is not called
    there: the admission's own statement creates the held run. A job that ends without releasing
    its run (cancelled while queued, its release failed for good, its user deactivated)
    calls ``cancel_held`` too; when the core is unreachable then, ``expire_held`` is the
    net. ``release``/``start``/``finish`` run
    while the job's row is locked, so a remote implementation (HTTP) should use short
    timeouts and raise ``CoreUnavailable`` rather than block: the job then retries with
    backoff inside its release window.
    """

    def create_held(
        self, *, run_id: uuid.UUID, user_id: int, sources: Sequence[Mapping[str, object]]
    ) -> int:
        """Validate and create a held run; return its id. Raises a ``CoreRefused``
        subclass naming the reason, or ``CoreUnavailable``."""

    def cancel_held(self, *, core_run_id: int) -> None:
        """Cancel a held run no live job needs (no job took it, or its job ended without
        releasing it), giving its budget back. Idempotent; a run a queued, pending or
        running job references, or one no longer held, stays as it is. Raises
        ``CoreUnavailable``."""

    def expire_held(self, *, older_than_seconds: float, limit: int) -> int:
        """Cancel held runs no live job needs: those no job took, older than
        ``older_than_seconds``, and those whose job ended without releasing them; fail
        the released (or judging) runs whose every job ended (their job's own close
        missed the core); return how many. A remote core that expires them itself
        returns 0. Raises ``CoreUnavailable``."""

    def release(self, *, core_run_id: int) -> None:
        """Take the run out of hold (attach its sources). Idempotent."""

    def start(self, *, core_run_id: int) -> None:
        """Start judging a released run. Idempotent."""

    def finish(self, *, core_run_id: int, ok: bool, detail: str = "") -> None:
        """Close a judging run as done or failed. Idempotent."""


def validate_sources(sources: Sequence[Mapping[str, object]]) -> list[dict[str, object]]:
    """The core's synchronous source checks: at least one source, every DOI well formed."""
    if not sources:
        raise NoSources()
    checked = []
    for source in sources:
        raw = source.get("doi")
        doi = raw.strip() if isinstance(raw, str) else ""
        if doi and not DOI_PATTERN.match(doi):
            raise InvalidDoi(
                f"source {source.get('key')!r} has a malformed DOI {doi!r} "
                "(expected 10.<registrant>/<suffix>)"
            )
        checked.append({"key": source.get("key"), "doi": doi or None})
    return checked


class LocalCore:
    """The core's state machine in ``core_runs``; every method refuses while
    ``CORE_AVAILABLE`` is off, as a remote core would while unreachable.

    Its held run lives in the admission's database, so the admission creates it in its
    own statement (:attr:`joins_admission`, :meth:`held_params`), under the user's lock
    and committed with the job: a refused admission never created it, and no budget unit
    has to be given back."""

    #: The admission creates the held run in its own statement (see runs.admission).
    joins_admission = True

    def _require_available(self) -> None:
        if not getattr(settings, "CORE_AVAILABLE", True):
            raise CoreUnavailable()

    def held_params(
        self, *, run_id: uuid.UUID, user_id: int, sources: Sequence[Mapping[str, object]]
    ) -> dict[str, object]:
        """The checks of :meth:`create_held` that need no database (the core reachable,
        the sources well formed), and the bound parameters of the SQL that creates the
        held run and takes the budget unit (``core_create_held``, or the admission's own
        statement: ``admit_local_hold``)."""
        self._require_available()
        return {
            "user_id": user_id,
            "run_id": run_id,
            "sources": Jsonb(validate_sources(sources)),
            "budget": int(getattr(settings, "CORE_DAILY_BUDGET", 0)),
        }

    def create_held(
        self, *, run_id: uuid.UUID, user_id: int, sources: Sequence[Mapping[str, object]]
    ) -> int:
        """One statement, committed on its own (or with the caller's transaction, when
        there is one): the budget unit and the held run, or neither. The admission does
        not call it: its own statement creates the held run (:attr:`joins_admission`)."""
        params = self.held_params(run_id=run_id, user_id=user_id, sources=sources)
        with connection.cursor() as cursor:
            cursor.execute(queries["core_create_held"], params)
            row = cursor.fetchone()
        if row is None:
            raise BudgetExhausted()
        return row[0]

    def cancel_held(self, *, core_run_id: int) -> None:
        self._require_available()
        self._cancel_held(core_run_id)

    def _cancel_held(self, core_run_id: int) -> bool:
        """True when the run was cancelled (and its budget unit given back)."""
        with connection.cursor() as cursor:
            cursor.execute(queries["core_cancel_held"], {"core_run_id": core_run_id})
            return cursor.fetchone()[0] > 0

    def expire_held(self, *, older_than_seconds: float, limit: int) -> int:
        self._require_available()
        with connection.cursor() as cursor:
            cursor.execute(
                queries["core_stale_held"], {"seconds": older_than_seconds, "limit": limit}
            )
            stale = [row[0] for row in cursor.fetchall()]
            cursor.execute(queries["core_abandoned_released"], {"limit": limit})
            abandoned = cursor.rowcount
        return sum(self._cancel_held(core_run_id) for core_run_id in stale) + abandoned

    def _move(
        self,
        core_run_id: int,
        *,
        to: CoreRunState,
        allowed: tuple[CoreRunState, ...],
        done: tuple[CoreRunState, ...],
        **fields: object,
    ) -> None:
        self._require_available()
        moved = CoreRun.objects.filter(pk=core_run_id, state__in=allowed).update(state=to, **fields)
        if moved:
            return
        state = CoreRun.objects.filter(pk=core_run_id).values_list("state", flat=True).first()
        if state not in done:
            raise CoreStateError(f"core run {core_run_id} is {state}, cannot become {to}")

    def release(self, *, core_run_id: int) -> None:
        self._move(
            core_run_id,
            to=CoreRunState.RELEASED,
            allowed=(CoreRunState.HELD,),
            done=(CoreRunState.RELEASED, CoreRunState.JUDGING, CoreRunState.DONE),
            released_at=timezone.now(),
        )

    def start(self, *, core_run_id: int) -> None:
        self._move(
            core_run_id,
            to=CoreRunState.JUDGING,
            allowed=(CoreRunState.RELEASED,),
            done=(CoreRunState.JUDGING, CoreRunState.DONE, CoreRunState.FAILED),
        )

    def finish(self, *, core_run_id: int, ok: bool, detail: str = "") -> None:
        to = CoreRunState.DONE if ok else CoreRunState.FAILED
        self._move(
            core_run_id,
            to=to,
            allowed=(CoreRunState.JUDGING,),
            done=(to,),
            finished_at=timezone.now(),
            error=detail,
        )


def _connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` lost this process's own database connection (not the core's):
    then nothing of the caller's transaction will commit, so the best-effort give-back
    must not swallow it and let the caller report success."""
    if not isinstance(exc, DatabaseError):
        return False
    raw = connection.connection
    return raw is None or raw.closed or raw.broken


def held_run_give_back(*, core_run_id: int | None) -> None:
    """Cancel the held run of a job that just ended without releasing it, giving the
    tenant's budget unit back (the provider did no work). Call it in the transaction
    that ends the job, so the run sees its job terminal: for the local core the give-back
    commits or rolls back with the job's end. Best effort: when the core is unreachable
    (or refuses), the run stays held and the resume tick's ``held_runs_expire`` cancels
    it later; a released run is never given back."""
    if core_run_id is None:
        return
    try:
        with transaction.atomic():
            get_core().cancel_held(core_run_id=core_run_id)
    except (CoreError, DatabaseError) as exc:
        if _connection_lost(exc):
            raise
        logger.warning(
            "could not cancel held core run %s now; the resume tick will",
            core_run_id,
            exc_info=True,
        )


def released_run_fail(*, core_run_id: int | None, detail: str) -> None:
    """Close the released run of a job that just failed or was given up after its
    release, as failed (it would otherwise stay ``judging`` for ever: no attempt comes
    back to finish it). Call it in the transaction that ends the job. Idempotent; best
    effort like :func:`held_run_give_back`: when the core is unreachable (or refuses),
    the resume tick's ``held_runs_expire`` fails the run later. The budget unit is not
    given back: the provider may have worked on a released run."""
    if core_run_id is None:
        return
    core = get_core()
    try:
        with transaction.atomic():
            core.start(core_run_id=core_run_id)
            core.finish(core_run_id=core_run_id, ok=False, detail=detail)
    except (CoreError, DatabaseError) as exc:
        if _connection_lost(exc):
            raise
        logger.warning(
            "could not fail released core run %s now; the resume tick will",
            core_run_id,
            exc_info=True,
        )


def get_core() -> CoreClient:
    """The configured core client (``RUNS_CORE_CLIENT``), by default :class:`LocalCore`."""
    return import_string(getattr(settings, "RUNS_CORE_CLIENT", DEFAULT_CLIENT))()
