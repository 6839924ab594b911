"""queue_status and grant_credits: tables on success, CommandError saying what to do."""

from __future__ import annotations

import datetime
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction

from runs import admission, processing
from runs.management.commands.replay_failed_analyses import parse_since
from runs.models import AnalysisAudit
from runs.selectors import credit_balance
from tests.runs.factories import DOC_HTML, SOURCES, AnalysisJobFactory, backdate, funded_user

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_grant_credits_adds_to_the_balance_and_prints_it():
    user = funded_user(credits=2)

    output = run("grant_credits", "--user", user.username, "--amount", "3")

    assert credit_balance(user_id=user.pk) == 5
    assert user.username in output and "5" in output.splitlines()[-1]


@pytest.mark.parametrize(
    ("username", "amount", "message"),
    [
        ("nobody", "3", "create_api_token"),
        (None, "0", "--amount 1 or more"),
        (None, "-4", "--amount 1 or more"),
    ],
)
def test_grant_credits_refuses_unknown_users_and_non_positive_amounts(username, amount, message):
    user = funded_user(credits=1)

    with pytest.raises(CommandError, match=message):
        run("grant_credits", "--user", username or user.username, "--amount", amount)
    assert credit_balance(user_id=user.pk) == 1


def test_queue_status_shows_running_and_queued_per_user():
    ann, bob = funded_user(credits=5, username="ann"), funded_user(credits=5, username="bob")
    for user, count in ((ann, 3), (bob, 1)):
        for _ in range(count):
            admission.analysis_job_admit(user=user, title="T", doc_html=DOC_HTML, sources=SOURCES)

    everyone = run("queue_status").splitlines()
    only_bob = run("queue_status", "--user", "bob").splitlines()

    assert everyone[0].split()[:6] == ["user", "tenant", "balance", "running", "pending", "queued"]
    ann_row = next(line for line in everyone if line.startswith("ann")).split()
    # balance 2; running 0, pending 1, queued 2, finished 0, no run yet 0: numbers, not blanks
    assert ann_row[2:8] == ["2", "0", "1", "2", "0", "0"]
    assert [line.split()[0] for line in only_bob[2:]] == ["bob"]
    with pytest.raises(CommandError, match="no user"):
        run("queue_status", "--user", "nobody")


def test_queue_status_lists_every_user_with_a_queue_and_live_only_on_request():
    idle = funded_user(credits=2, username="idle")
    busy = funded_user(credits=2, username="busy")
    funded_user(credits=2, username="never")
    AnalysisJobFactory(user=idle)  # finished, no run yet
    admission.analysis_job_admit(user=busy, title="T", doc_html=DOC_HTML, sources=SOURCES)

    everyone = run("queue_status").splitlines()
    names = [line.split()[0] for line in everyone[2:]]
    assert names == ["busy", "idle"]  # "never" has no queue
    idle_row = next(line for line in everyone if line.startswith("idle")).split()
    assert idle_row[3:8] == ["0", "0", "0", "1", "1"]
    assert [line.split()[0] for line in run("queue_status", "--live").splitlines()[2:]] == ["busy"]


def failed(user) -> int:
    admitted = admission.analysis_job_admit(
        user=user, title="T", doc_html=DOC_HTML, sources=SOURCES
    )
    with transaction.atomic():
        processing.job_fail(admission.lock_job(admitted.id), reason="judge failed")
    return admitted.id


def test_retry_analysis_retries_once_and_prints_the_new_job():
    job_id = failed(funded_user(credits=3))

    dry = run("retry_analysis", "--job", str(job_id), "--dry-run")
    assert "would retry" in dry and "nothing changed" in dry
    assert "has no saved result yet" in dry
    assert AnalysisAudit.objects.count() == 0

    out = run("retry_analysis", "--job", str(job_id))
    new_id = AnalysisAudit.objects.get(job_id=job_id).payload["new_job_id"]
    row = out.splitlines()[-1].split()
    assert row[:4] == [str(job_id), "retried", str(new_id), "pending"]
    assert AnalysisAudit.objects.get().actor == "command:retry_analysis"
    again = run("retry_analysis", "--job", str(job_id))
    assert "already retried" in again and str(new_id) in again


@pytest.mark.parametrize(
    ("job", "message"),
    [("0", "not a job id"), ("99999999", "no analysis job"), ("-3", "not a job id")],
)
def test_retry_analysis_refuses_bad_ids(job, message):
    with pytest.raises(CommandError, match=message):
        run("retry_analysis", "--job", job)


def test_retry_analysis_refuses_a_job_that_did_not_fail():
    job = AnalysisJobFactory(user=funded_user(credits=1))
    with pytest.raises(CommandError, match="only failed analyses are retried"):
        run("retry_analysis", "--job", str(job.pk))


def test_replay_failed_analyses_by_user_and_since_with_progress():
    ann, bob = funded_user(credits=5, username="ann"), funded_user(credits=5, username="bob")
    old, recent, bobs = failed(ann), failed(ann), failed(bob)
    backdate("analysis_jobs", [old], seconds=3 * 86400, columns=("finished_at",))

    out = StringIO()
    err = StringIO()
    call_command(
        "replay_failed_analyses",
        "--user",
        "ann",
        "--since",
        "1d",
        "--dry-run",
        stdout=out,
        stderr=err,
    )
    assert "1 failed analysis job(s): 1 would retry (dry run: nothing changed)" in out.getvalue()
    assert AnalysisAudit.objects.count() == 0

    call_command("replay_failed_analyses", "--user", "ann", stdout=out, stderr=err)
    assert "retry analyses: 2/2" in err.getvalue()
    assert set(AnalysisAudit.objects.values_list("job_id", flat=True)) == {old, recent}
    assert "2 failed analysis job(s): 2 retried" in out.getvalue()

    # Again, everyone: ann's are done; bob's is retried now.
    final = run("replay_failed_analyses")
    assert "1 failed analysis job(s): 1 retried" in final
    assert AnalysisAudit.objects.filter(job_id=bobs).exists()


def test_replay_failed_analyses_counts_refusals_and_goes_on():
    poor = funded_user(credits=1, username="poor")
    failed(poor)
    admission.analysis_job_admit(user=poor, title="spent", doc_html=DOC_HTML, sources=SOURCES)
    out = run("replay_failed_analyses")
    assert "1 failed analysis job(s): 1 refused" in out
    assert "credit" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--user", "nobody"], "no user 'nobody'"),
        (["--since", "yesterday"], "give an age"),
        (["--since", "2025-13-45"], "give an age"),
        (["--limit", "0"], "from 1 to"),
    ],
)
def test_replay_failed_analyses_refuses_bad_options(args, message):
    with pytest.raises(CommandError, match=message):
        run("replay_failed_analyses", *args)


def test_since_accepts_ages_dates_and_times():
    now = datetime.datetime(2025, 3, 10, 12, 0, tzinfo=datetime.UTC)
    assert parse_since("90m", now=now) == now - datetime.timedelta(minutes=90)
    assert parse_since("2d", now=now) == now - datetime.timedelta(days=2)
    assert parse_since("2025-03-01", now=now) == datetime.datetime(2025, 3, 1, tzinfo=datetime.UTC)
    assert parse_since("2025-03-01T08:30", now=now).hour == 8


def test_replay_failed_analyses_dry_run_shows_what_each_retry_replaces_or_why_not(
    failed_deltas,
):
    v1, v2, v3 = failed_deltas.saved, failed_deltas.superseded, failed_deltas.latest
    run_id = failed_deltas.run_id

    out = run("replay_failed_analyses", "--dry-run")

    # The table's rows by job id (not the summary line, which starts with a count).
    lines = {
        line.split()[0]: line
        for line in out.splitlines()
        if line.split()[:1] and "failed analysis job(s)" not in line
    }
    assert f"superseded by job {v3}" in lines[str(v2)] and "refused" in lines[str(v2)]
    assert f"replaces run {run_id}'s job {v1} (saved by client)" in lines[str(v3)]
    assert "1 refused, 1 would retry (dry run: nothing changed)" in out
    assert AnalysisAudit.objects.count() == 0
