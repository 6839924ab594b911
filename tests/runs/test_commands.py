"""queue_status and grant_credits: tables on success, CommandError saying what to do."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from runs import admission
from runs.selectors import credit_balance
from tests.runs.factories import DOC_HTML, SOURCES, funded_user

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
    assert ann_row[2] == "2" and ann_row[4] == "2"
    assert [line.split()[0] for line in only_bob[2:]] == ["bob"]
    with pytest.raises(CommandError, match="no user"):
        run("queue_status", "--user", "nobody")
