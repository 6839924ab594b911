"""The URL the benchmark harness gives its worker subprocesses names the servers and the
libpq options the harness itself connects with: a multi-host ``DATABASE_URL`` (failover)
reaches the workers whole, not as the one server the harness happened to reach."""

from __future__ import annotations

from bench.database import database_url
from config.settings import database_config

MULTI_HOST = (
    "postgresql://bench:s%40cret@db1.internal:5432,db2.internal:5433/pgstage"
    "?target_session_attrs=primary&sslmode=require"
)


def test_a_multi_host_url_reaches_the_workers_whole():
    harness = database_config(MULTI_HOST)

    workers = database_config(database_url(harness))

    assert workers["HOST"] == "db1.internal,db2.internal"
    assert workers["PORT"] == "5432,5433"
    assert workers["OPTIONS"]["target_session_attrs"] == "primary"
    assert workers["OPTIONS"]["sslmode"] == "require"
    assert (workers["NAME"], workers["USER"], workers["PASSWORD"]) == ("pgstage", "bench", "s@cret")


def test_a_host_without_its_own_port_keeps_the_default():
    harness = database_config("postgresql://bench@db1.internal,db2.internal:5433/pgstage")

    workers = database_config(database_url(harness))

    assert (workers["HOST"], workers["PORT"]) == ("db1.internal,db2.internal", ",5433")
    assert workers["OPTIONS"]["target_session_attrs"] == "read-write"


def test_one_server_and_a_socket_directory_stay_as_they_are():
    for url in (
        "postgresql://bench@127.0.0.1:5432/pgstage",
        "postgresql://postgres@/pgstage?host=/tmp/pg-sockets&port=5999",
    ):
        harness = database_config(url)
        workers = database_config(database_url(harness))
        assert {k: workers[k] for k in ("NAME", "USER", "HOST", "PORT")} == {
            k: harness[k] for k in ("NAME", "USER", "HOST", "PORT")
        }, url
        assert workers.get("OPTIONS", {}) == harness.get("OPTIONS", {}), url


def test_the_process_name_is_left_to_each_worker():
    harness = database_config("postgresql://bench@db1/pgstage?application_name=harness")
    assert "application_name" not in database_config(database_url(harness)).get("OPTIONS", {})
