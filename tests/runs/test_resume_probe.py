"""The resume tick's probe (``selectors.resume_work``): a tick with nothing to do is one
read-only statement, and a part runs its batch when the probe finds work for it.

What can race or go wrong, and the test of each:

- the probe says nothing where a part's batch would find work (its predicate drifted from
  the batch's): each kind of work is flagged for its part alone, that part then does it,
  and the probe is quiet again — test_each_kind_of_work_is_flagged_for_its_part_alone;
- a part changes rows that leave a later part work the probe could not see (a give-back
  of a held run that failed: it is best effort): once anything changed, every later part
  runs in the same tick — test_once_a_part_changed_anything_every_later_part_runs;
- a row that appears after the probe waits for the next tick, as it would after the
  batch; a flag that is stale by the time its part runs costs one empty batch (each part
  re-reads, locks and re-checks what it takes): the parts' own tests
  (test_queue.py, test_release.py, test_deactivated.py, test_budget.py);
- the probe reads history (every job, or every procrastinate job, ever): its plan —
  test_sweep_plans.py::test_the_resume_probe_reads_live_rows_and_probes_the_rest_per_row.
"""

from __future__ import annotations

import datetime
import uuid

import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.utils import timezone

from queueing.sweeps import get_sweep, run_sweep
from runs import admission, core, selectors
from runs.models import AnalysisJob, CoreRun, JobStatus
from tests.runs.factories import DOC_HTML, SOURCES, backdate, funded_user

PARTS = ("expired_releases", "deactivated", "stuck", "lost", "held_runs")


def admit(user):
    return admission.analysis_job_admit(user=user, title="T", doc_html=DOC_HTML, sources=SOURCES)


def flagged() -> set[str]:
    work = selectors.resume_work(
        idle_seconds=get_sweep("analysis_resume").grace_seconds,
        held_seconds=float(django_settings.CORE_HELD_EXPIRY_SECONDS),
    )
    return {part for part in PARTS if getattr(work, part)}


def a_queue():
    """A user with an active job (its process_job waiting) and two queued behind it, all
    idle past the grace: the steady state, where the tick has nothing to do."""
    user = funded_user(credits=5)
    jobs = [admit(user) for _ in range(3)]
    backdate("analysis_jobs", [j.id for j in jobs], seconds=3600)
    return user, jobs


def expired_release(user, jobs) -> None:
    AnalysisJob.objects.filter(pk=jobs[0].id).update(
        status=JobStatus.RUNNING,
        release_attempts=1,
        release_deadline=timezone.now() - datetime.timedelta(minutes=1),
    )


def deactivated(user, jobs) -> None:
    type(user).objects.filter(pk=user.pk).update(is_active=False)


def stuck(user, jobs) -> None:
    # Its end committed without the promotion (an operator fixed the rows by hand).
    job = AnalysisJob.objects.get(pk=jobs[0].id)
    CoreRun.objects.filter(pk=job.core_run_id).update(state="done")
    AnalysisJob.objects.filter(pk=job.pk).update(status=JobStatus.COMPLETE)


def lost(user, jobs) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM procrastinate_jobs WHERE args->>'job_id' = %s", [str(jobs[0].id)]
        )


def stale_held_run(user, jobs) -> None:
    """A held run no admission took (its admission died), past the expiry."""
    orphan = core.LocalCore().create_held(run_id=uuid.uuid4(), user_id=user.pk, sources=SOURCES)
    backdate("core_runs", [orphan], seconds=3600, columns=("created_at",))


def abandoned_released_run(user, jobs) -> None:
    """A released run whose job ended while the core was unreachable (nobody failed it)."""
    job = AnalysisJob.objects.get(pk=jobs[1].id)
    CoreRun.objects.filter(pk=job.core_run_id).update(state="released")
    AnalysisJob.objects.filter(pk=job.pk).update(status=JobStatus.CANCELLED)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("make", "part", "note"),
    [
        (expired_release, "expired_releases", "gave_up"),
        (deactivated, "deactivated", "deactivated_cancelled"),
        (stuck, "stuck", "promoted"),
        (lost, "lost", "requeued"),
        (stale_held_run, "held_runs", "held_expired"),
        (abandoned_released_run, "held_runs", "held_expired"),
    ],
)
def test_each_kind_of_work_is_flagged_for_its_part_alone(make, part, note):
    user, jobs = a_queue()
    assert flagged() == set()
    assert run_sweep("analysis_resume").changed == 0

    make(user, jobs)

    assert flagged() == {part}
    result = run_sweep("analysis_resume")
    assert result.notes[note] >= 1, result
    assert flagged() == set(), "the part left the work its probe found"


@pytest.mark.django_db(transaction=True)
def test_an_idle_tick_is_one_read_only_round_trip(clean_queue):
    """Counted on the wire: nothing to do is one statement, in autocommit."""
    from tests.queueing.test_round_trips import round_trips

    a_queue()
    run_sweep("analysis_resume")  # the probe prepared on this connection

    result, trips = round_trips(lambda: run_sweep("analysis_resume"))

    assert (result.changed, result.failed) == (0, 0)
    assert trips == 1


@pytest.mark.django_db
def test_once_a_part_changed_anything_every_later_part_runs(monkeypatch):
    """A deactivated user's queued job is cancelled; its held run's give-back is best
    effort, and here it did not happen. The probe saw no held run to expire (there was
    none yet), but since the cancel changed something, the expiry runs in the same tick
    and gives the run back."""
    user, jobs = a_queue()
    deactivated(user, jobs)
    assert flagged() == {"deactivated"}
    # The cancel's give-back does not happen (best effort: the core did not answer).
    monkeypatch.setattr(admission, "held_run_give_back", lambda *, core_run_id: None)

    result = run_sweep("analysis_resume")

    assert result.notes["deactivated_cancelled"] == 2
    assert result.notes["held_expired"] == 2
    assert flagged() == set()
