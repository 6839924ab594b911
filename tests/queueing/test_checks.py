from __future__ import annotations

import re

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

import tests.queueing.tasks  # noqa: F401  (registers tests.hang, whose timeout is checked)
from config.embedded import embedded_database_url
from queueing.checks import check_database, check_server_isolation
from tests.conftest import ROOT


def ids(messages) -> list[str]:
    return [m.id for m in messages]


def test_the_default_configuration_passes():
    assert check_database(None) == []


def test_a_stalled_threshold_shorter_than_two_heartbeats_is_flagged(settings):
    settings.QUEUEING_STALLED_WORKER_SECONDS = 15
    settings.QUEUEING_STALLED_RECOVERY_SECONDS = 5
    assert ids(check_database(None)) == ["queueing.W001"]


@pytest.mark.parametrize("threshold", [10, 4])
def test_a_stalled_threshold_no_longer_than_a_heartbeat_is_an_error(settings, threshold):
    """Between two beats every live worker would look dead: recovery's clock would even
    run backwards (a gap of the threshold less the beats it allows goes negative)."""
    settings.QUEUEING_HEARTBEAT_SECONDS = 10
    settings.QUEUEING_STALLED_WORKER_SECONDS = threshold
    settings.QUEUEING_STALLED_RECOVERY_SECONDS = 5
    [error] = [m for m in check_database(None) if m.id.startswith("queueing.E00")]
    assert error.id == "queueing.E007" and "look dead" in error.msg
    assert "queueing.W001" not in ids(check_database(None))


@pytest.mark.parametrize(
    ("level", "flagged"),
    [(None, False), (1, False), (2, False), (3, True), (4, True)],
)
def test_an_isolation_level_stricter_than_read_committed_is_flagged(
    settings, monkeypatch, level, flagged
):
    """psycopg's IsolationLevel: 1 READ UNCOMMITTED (PostgreSQL's READ COMMITTED), 2 READ
    COMMITTED, 3 REPEATABLE READ, 4 SERIALIZABLE."""
    _isolation_level(settings, monkeypatch, level)
    assert ids(check_database(None)) == (["queueing.W003"] if flagged else [])


def test_a_worker_that_stops_beating_while_it_drains_is_flagged(settings):
    """Without pgstage's worker, no stall threshold covers a drain of sync jobs."""
    settings.PROCRASTINATE_ON_APP_READY = None
    [warning] = check_database(None)
    assert warning.id == "queueing.W002" and "cannot cover a drain" in warning.msg


@pytest.mark.parametrize("period", [0, -1, 8, 45, "15", True])
def test_a_recovery_period_longer_than_the_stall_threshold_is_an_error(settings, period):
    settings.QUEUEING_STALLED_RECOVERY_SECONDS = period
    assert ids(check_database(None)) == ["queueing.E003"]


def test_the_embedded_server_says_what_to_do_when_it_cannot_start(tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the data directory should be")
    with pytest.raises(ImproperlyConfigured, match=r"Remove .* or set DATABASE_URL"):
        embedded_database_url(blocker / "pg")


def documented_settings() -> set[str]:
    """The settings table of docs/api.md: what a project may set."""
    table = (ROOT / "docs" / "api.md").read_text().split("## Settings", 1)[1]
    return set(re.findall(r"^\| `([A-Z][A-Z0-9_]+)` \|", table, re.MULTILINE))


def _isolation_level(settings, monkeypatch, level: int | None) -> None:
    """``OPTIONS["isolation_level"]`` of the default database, for this test only."""
    default = settings.DATABASES["default"]
    options = {**default.get("OPTIONS", {}), "isolation_level": level}
    monkeypatch.setitem(default, "OPTIONS", options)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("level", "flagged"),
    [
        ("read committed", False),
        ("read uncommitted", False),
        ("repeatable read", True),
        ("serializable", True),
    ],
)
def test_a_server_default_stricter_than_read_committed_is_flagged(level, flagged):
    """The session's default_transaction_isolation stands for the server's, the
    database's or the role's (the test's transaction ends the SET)."""
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT set_config('default_transaction_isolation', %s, false)", [level])
    messages = check_server_isolation(None, databases=["default"])
    assert ids(messages) == (["queueing.W004"] if flagged else [])
    if flagged:
        assert repr(level) in messages[0].msg
        assert "ALTER DATABASE" in messages[0].hint and "ALTER ROLE" in messages[0].hint


@pytest.mark.django_db
def test_a_level_in_options_does_not_cover_the_server_default(settings, monkeypatch):
    """OPTIONS' level rides on each BEGIN only: an autocommit statement (a claim or an
    enqueue outside atomic()) runs under the database's default, and so does the workers'
    pool, which takes no level from OPTIONS."""
    from procrastinate.contrib.django.utils import connector_params

    _isolation_level(settings, monkeypatch, 2)
    with connections["default"].cursor() as cursor:
        cursor.execute("SET default_transaction_isolation = 'serializable'")
    assert ids(check_server_isolation(None, databases=["default"])) == ["queueing.W004"]
    assert "isolation_level" not in connector_params()


def test_the_server_default_is_looked_at_only_when_the_checks_may_reach_the_database():
    """Without ``databases`` (``manage.py check``, a worker's start) nothing is queried."""
    assert check_server_isolation(None) == []
    assert check_server_isolation(None, databases=["other"]) == []


def every_message(settings, monkeypatch) -> list:
    """Each message check_database can give, in a project that has nothing else: not
    PostgreSQL, a recovery period too long, a threshold too short, procrastinate's worker."""
    monkeypatch.setattr(connections["default"], "vendor", "sqlite")
    settings.QUEUEING_STALLED_RECOVERY_SECONDS = 45
    settings.PROCRASTINATE_ON_APP_READY = None
    _isolation_level(settings, monkeypatch, 3)
    messages = check_database(None)
    # A threshold within two heartbeats leaves no recovery period to weigh (E003).
    settings.QUEUEING_STALLED_WORKER_SECONDS = 15
    short = [m for m in check_database(None) if "two heartbeats" in m.msg]
    settings.QUEUEING_STALLED_WORKER_SECONDS = 5
    shorter = [m for m in check_database(None) if m.id == "queueing.E007"]
    return [*messages, *short, *shorter]


def test_each_message_names_only_settings_a_project_has(settings, monkeypatch):
    """A hint is followed literally: a setting it names must be one the project can set
    (the framework's, in docs/api.md, or Django's), not the reference site's environment."""
    messages = every_message(settings, monkeypatch)
    assert sorted(ids(messages)) == [
        "queueing.E001",
        "queueing.E003",
        "queueing.E007",
        "queueing.W001",
        "queueing.W002",
        "queueing.W003",
    ]
    known = documented_settings() | {"DATABASES", "INSTALLED_APPS", "ENGINE"}
    for message in messages:
        named = set(
            re.findall(r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b", f"{message.msg} {message.hint}")
        )
        assert named <= known, (message.id, named - known)


def test_the_postgresql_error_says_which_setting_to_change(settings, monkeypatch):
    [error] = [m for m in every_message(settings, monkeypatch) if m.id == "queueing.E001"]
    assert "DATABASES" in error.hint and "django.db.backends.postgresql" in error.hint


def test_procrastinate_on_another_database_alias_is_an_error(settings):
    """The framework enqueues on Django's default connection, in the caller's transaction;
    a worker on procrastinate's own alias would never see those jobs."""
    settings.PROCRASTINATE_DATABASE_ALIAS = "jobs"
    [error] = check_database(None)
    assert error.id == "queueing.E006"
    assert "PROCRASTINATE_DATABASE_ALIAS" in error.hint


def test_procrastinate_on_the_default_alias_named_explicitly_passes(settings):
    settings.PROCRASTINATE_DATABASE_ALIAS = "default"
    assert check_database(None) == []


def test_a_timeout_shorter_than_the_grace_in_force_is_refused(settings):
    """The grace configured (5 s) is raised to the least grace that lets a run ended at its
    deadline save its outcome after an outage (16 s with the defaults): a 10 s timeout is
    shorter than the grace actually in force, and is refused for it."""
    settings.QUEUEING_JOB_TIMEOUT_GRACE_SECONDS = 5
    settings.QUEUEING_JOB_TIMEOUT_SECONDS = 10
    [error] = check_database(None)
    assert error.id == "queueing.E004"
    assert "QUEUEING_JOB_TIMEOUT_SECONDS=10" in error.msg and "16 s" in error.msg


def test_a_tasks_timeout_shorter_than_a_grace_raised_by_the_stall_threshold_is_refused(settings):
    """A longer stall threshold raises the grace in force (30 s configured, 106 s in force
    with a 120 s threshold): tests.hang's 60 s timeout is shorter than that, and the hint
    names the setting that raised it, since lowering the configured grace would not help."""
    settings.QUEUEING_STALLED_WORKER_SECONDS = 120
    errors = [e for e in check_database(None) if e.id == "queueing.E004"]
    [error] = [e for e in errors if "tests.hang" in e.msg]
    assert "106 s" in error.msg and "QUEUEING_STALLED_WORKER_SECONDS" in error.hint


def test_a_timeout_no_shorter_than_the_grace_in_force_passes(settings):
    settings.QUEUEING_JOB_TIMEOUT_GRACE_SECONDS = 5
    settings.QUEUEING_JOB_TIMEOUT_SECONDS = 16
    assert check_database(None) == []
