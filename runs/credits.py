"""Credits: grants, and the charge's refund, each exactly once per job.

A balance is the sum of a user's ledger entries. Charges and refunds name their job and
are unique per (job, kind), so a retried task, a second worker or an operator can never
refund twice; grants are plain inserts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import connection, transaction
from django.utils import timezone

from queueing.rows import insert_or_get
from runs.exceptions import (
    InvalidAmount,
)
from runs.models import (
    AnalysisJob,
    CreditEntry,
    CreditKind,
)
from runs.selectors import credit_balance

logger = logging.getLogger(__name__)

#: Credits one analysis costs (charged at admission, refunded at most once).
ANALYSIS_PRICE = 1
#: Amounts and balances are 64-bit (``credit_ledger.amount`` is a bigint): no grant may
#: take a balance past what one can hold.
MAX_CREDITS = 2**63 - 1
NOTE_MAX = CreditEntry._meta.get_field("note").max_length


#: An admission folds the user's ledger entries into their balance mark once this many
#: have settled since the last one (``runs.models.CreditBalanceMark``): the balance check
#: reads the mark and at most about this many entries (more while a long transaction
#: holds the horizon back).
FOLD_AFTER = 100


@dataclass(frozen=True)
class Rebased:
    """What :func:`credit_marks_rebase` changed (or, in a dry run, would change)."""

    entries: int
    marks: int


#: The ledger locked against every reader and writer (an admission waits, and reads the
#: ledger afresh after), its marks dropped, and each entry given the id every mark folds.
#: The append-only trigger lets an entry's id become '1' only with no mark of its user
#: and under this lock, which the transaction says it holds (``pgstage.credit_rebase``).
#: A restore with ``--disable-triggers`` re-enables the stamp as an ordinary trigger,
#: which a logical replica's apply skips: ENABLE ALWAYS again.
_REBASE = (
    "LOCK TABLE credit_ledger IN ACCESS EXCLUSIVE MODE",
    "DELETE FROM credit_balance_marks",
    "SET LOCAL pgstage.credit_rebase = 'on'",
    "UPDATE credit_ledger SET created_xid = '1' WHERE created_xid <> '1'",
    "ALTER TABLE credit_ledger ENABLE ALWAYS TRIGGER credit_ledger_stamp",
)


def credit_marks_rebase(*, dry_run: bool = False) -> Rebased:
    """After a restore (a dump into another cluster; a data-only restore anywhere): the
    entries keep the old cluster's transaction ids (``pg_restore`` creates the ledger's
    triggers after its data), which may lie ahead of this server's counter; read in each
    admission's tail until the counter passes them, they make every admission sum the
    user's whole history. In one transaction, under a lock that makes admissions wait:
    drop every mark, give every entry the id every mark folds, and enable the stamp
    trigger ALWAYS again. The next admission of each user sums their ledger once and
    folds it. ``dry_run``: count what it would change, under the same lock, and change
    nothing."""
    if dry_run:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(_REBASE[0])
            cursor.execute(
                "SELECT (SELECT count(*) FROM credit_ledger WHERE created_xid <> '1'),"
                " (SELECT count(*) FROM credit_balance_marks)"
            )
            entries, marks = cursor.fetchone()
            return Rebased(entries=entries, marks=marks)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_REBASE[0])
        cursor.execute(_REBASE[1])
        marks = cursor.rowcount
        cursor.execute(_REBASE[2])
        cursor.execute(_REBASE[3])
        entries = cursor.rowcount
        cursor.execute(_REBASE[4])
        return Rebased(entries=entries, marks=marks)


def credit_grant(*, user_id: int, amount: int, note: str = "") -> int:
    """Add ``amount`` credits (a new ledger entry each call: grants are not idempotent)
    and return the new balance. Refused (:class:`InvalidAmount`, nothing written) unless
    1 ≤ amount and the new balance fits 64 bits."""
    if not 0 < amount <= MAX_CREDITS:
        raise InvalidAmount(
            f"a credit grant must be a whole number from 1 to {MAX_CREDITS}, got {amount}"
        )
    with transaction.atomic():
        balance = credit_balance(user_id=user_id)
        if balance + amount > MAX_CREDITS:
            raise InvalidAmount(
                f"the balance is {balance}; adding {amount} would pass {MAX_CREDITS}"
            )
        CreditEntry.objects.create(
            user_id=user_id, kind=CreditKind.GRANT, amount=amount, note=note[:NOTE_MAX]
        )
        return credit_balance(user_id=user_id)


def credit_refund(job: AnalysisJob, *, note: str) -> bool:
    """Refund the job's charge; the unique (job, kind) makes a second refund a no-op."""
    _, created = insert_or_get(
        CreditEntry,
        values={
            "user": job.user_id,
            "job": job.pk,
            "kind": CreditKind.REFUND.value,
            "amount": ANALYSIS_PRICE,
            "note": note[:200],
            "created_at": timezone.now(),
        },
        conflict_fields=("job", "kind"),
    )
    return created
