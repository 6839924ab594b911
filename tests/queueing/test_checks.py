from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from config.embedded import embedded_database_url
from queueing.checks import check_database


def ids(messages) -> list[str]:
    return [m.id for m in messages]


def test_the_default_configuration_passes():
    assert check_database(None) == []


def test_a_stalled_threshold_shorter_than_two_heartbeats_is_flagged(settings):
    settings.QUEUEING_STALLED_WORKER_SECONDS = 10
    settings.QUEUEING_STALLED_RECOVERY_SECONDS = 5
    assert ids(check_database(None)) == ["queueing.W001"]


def test_a_worker_that_stops_beating_while_it_drains_is_flagged(settings):
    """Without pgstage's worker, no stall threshold covers a drain of sync jobs."""
    settings.PROCRASTINATE_ON_APP_READY = None
    [warning] = check_database(None)
    assert warning.id == "queueing.W001" and "cannot cover a drain" in warning.msg


@pytest.mark.parametrize("period", [0, -1, 8, 45, "15", True])
def test_a_recovery_period_longer_than_the_stall_threshold_is_an_error(settings, period):
    settings.QUEUEING_STALLED_RECOVERY_SECONDS = period
    assert ids(check_database(None)) == ["queueing.E003"]


def test_the_embedded_server_says_what_to_do_when_it_cannot_start(tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the data directory should be")
    with pytest.raises(ImproperlyConfigured, match=r"Remove .* or set DATABASE_URL"):
        embedded_database_url(blocker / "pg")
