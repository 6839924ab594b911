"""Keep the credit ledger as the balance marks read it (``runs.0010``): an entry's
``created_xid`` is always its inserting transaction's, and a folded entry never changes.

* ``credit_ledger_stamp`` (BEFORE INSERT, enabled ALWAYS, so a logical replica's apply
  fires it too) sets ``created_xid`` to ``pg_current_xact_id()`` whatever the insert
  says. A row copied in with an old id (``COPY``, ``pg_restore --data-only``, a
  replica's apply) would otherwise sit below a mark's horizon without ever having been
  folded into it, and never count; the user's mark goes with such a row (it may fold the
  row already), and so does a mark above the inserting transaction's id.
* ``credit_ledger_append_only`` (BEFORE UPDATE of the columns the balance reads, and
  BEFORE DELETE) refuses to change an entry once written: a folded entry changed would
  make the balance drift from the ledger's sum. A correction is a new entry. A
  deactivated user's entries may be deleted once their mark is (an erase, in one
  transaction), and any entry given the id every mark folds by ``manage.py
  rebase_credit_marks`` (after a restore).
* ``credit_ledger_truncated`` (BEFORE TRUNCATE) empties the marks with the ledger.

Each trigger only adds a check or a stamp to what the previous release writes (inserts,
never updates or deletes), so both releases run side by side."""

from django.db import migrations

GUARDS = """
CREATE OR REPLACE FUNCTION credit_ledger_stamp() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    xid xid8 := pg_current_xact_id();
BEGIN
    -- The user's mark goes (the next admission sums their ledger once and folds anew)
    -- when the row arrives with another transaction's id, copied in by a restore whose
    -- marks may already fold it, and when the mark's horizon is above this id (a clone
    -- given a later dump): counted again once the counter passed it, that mark would
    -- leave out the entries written meanwhile. Otherwise one probe that finds nothing.
    DELETE FROM credit_balance_marks m
     WHERE m.user_id = NEW.user_id
       AND (NEW.created_xid IS DISTINCT FROM xid OR m.horizon > xid);
    NEW.created_xid := xid;
    RETURN NEW;
END $$;
CREATE TRIGGER credit_ledger_stamp BEFORE INSERT ON credit_ledger
    FOR EACH ROW EXECUTE FUNCTION credit_ledger_stamp();
ALTER TABLE credit_ledger ENABLE ALWAYS TRIGGER credit_ledger_stamp;

CREATE OR REPLACE FUNCTION credit_ledger_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- With no mark of the user, nothing folded this entry: an erase may delete it, and
    -- manage.py rebase_credit_marks, which holds the ledger's ACCESS EXCLUSIVE lock (no
    -- admission folds meanwhile) and says so (pgstage.credit_rebase), may give it the id
    -- every mark folds ('1').
    IF NOT EXISTS (SELECT 1 FROM credit_balance_marks m WHERE m.user_id = OLD.user_id) THEN
        -- An erase: of a deactivated user only, whose admissions are refused and fold
        -- nothing (an active user's admission could fold the entry while it goes).
        IF TG_OP = 'DELETE' AND EXISTS (SELECT 1 FROM users u
                                         WHERE u.id = OLD.user_id AND NOT u.is_active) THEN
            RETURN OLD;
        END IF;
        IF NEW.created_xid = '1'::xid8 AND NEW.user_id = OLD.user_id
           AND NEW.amount = OLD.amount
           AND current_setting('pgstage.credit_rebase', true) = 'on' THEN
            RETURN NEW;
        END IF;
    END IF;
    RAISE EXCEPTION 'credit ledger entry % cannot be changed (%): the ledger is append-only',
                    OLD.id, lower(TG_OP)
          USING ERRCODE = 'restrict_violation',
                HINT = 'Record a correction as a new entry (manage.py grant_credits, a refund). '
                       'To erase a user''s credit history, deactivate them, then delete their '
                       'row in credit_balance_marks and their entries in one transaction.';
END $$;
CREATE TRIGGER credit_ledger_append_only
    BEFORE UPDATE OF user_id, amount, created_xid OR DELETE ON credit_ledger
    FOR EACH ROW EXECUTE FUNCTION credit_ledger_append_only();

CREATE OR REPLACE FUNCTION credit_ledger_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM credit_balance_marks;
    RETURN NULL;
END $$;
CREATE TRIGGER credit_ledger_truncated BEFORE TRUNCATE ON credit_ledger
    FOR EACH STATEMENT EXECUTE FUNCTION credit_ledger_truncated();
"""

DROP = """
DROP TRIGGER IF EXISTS credit_ledger_truncated ON credit_ledger;
DROP TRIGGER IF EXISTS credit_ledger_append_only ON credit_ledger;
DROP TRIGGER IF EXISTS credit_ledger_stamp ON credit_ledger;
DROP FUNCTION IF EXISTS credit_ledger_truncated();
DROP FUNCTION IF EXISTS credit_ledger_append_only();
DROP FUNCTION IF EXISTS credit_ledger_stamp();
"""


class Migration(migrations.Migration):
    dependencies = [("runs", "0011_credit_ledger_user_xid_idx")]

    operations = [migrations.RunSQL(GUARDS, DROP)]
