"""A worker the database refuses — a role that does not exist (SQLSTATE 28000), a wrong
password (28P01), a database that does not exist (3D000) — is misconfigured, not cut off
by an outage: it exits at once, non-zero, saying what to fix, instead of retrying for
``QUEUEING_DATABASE_OUTAGE_SECONDS`` (300 s here).

Real worker subprocesses against the real server: it trusts every role it has, so a role
or a database that does not exist is what it really refuses."""

from __future__ import annotations

import subprocess
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.conftest import database_url

pytestmark = [pytest.mark.slow, pytest.mark.django_db]


def _url(*, user: str | None = None, dbname: str | None = None) -> str:
    """The test database's URL with another role or database."""
    url = urlsplit(database_url())
    netloc = url.netloc
    if user is not None:
        netloc = user + "@" + netloc.rpartition("@")[2]
    path = f"/{dbname}" if dbname is not None else url.path
    return urlunsplit((url.scheme, netloc, path, url.query, url.fragment))


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"user": "pgstage_no_such_role"}, 'role "pgstage_no_such_role" does not exist'),
        ({"dbname": "pgstage_no_such_database"}, 'database "pgstage_no_such_database"'),
    ],
    ids=["no-such-role", "no-such-database"],
)
def test_a_worker_the_database_refuses_exits_at_once_saying_what_to_fix(
    start_worker, changes, says
):
    worker = start_worker(
        env={"DATABASE_URL": _url(**changes), "DATABASE_OUTAGE_SECONDS": "300"},
        wait_ready=False,
    )
    try:
        code = worker.wait(timeout=60)  # an outage would be retried for 300 s
    except subprocess.TimeoutExpired:
        pytest.fail("the worker retried a refusal as an outage:\n" + worker.log()[-2000:])
    log = worker.log()
    assert code != 0, log
    assert "refuses" in log and says in log and "DATABASES" in log, log[-2000:]
    assert "out of reach" not in log, log[-2000:]
