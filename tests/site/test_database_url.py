"""``DATABASE_URL`` with several servers (a primary and its standbys): what Django and the
worker get from it (``config.settings.database_config``), and a real connection through it.
The failover itself is tests/acceptance/test_failover.py."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.db.backends.postgresql.base import DatabaseWrapper

from config.settings import database_config
from tests.servers import free_port


@pytest.mark.parametrize(
    ("url", "host", "port"),
    [
        ("postgresql://u@h1:5433,h2:5434/db", "h1,h2", "5433,5434"),
        # A host without a port has libpq's default, not its neighbour's.
        ("postgresql://u@h1:5433,h2/db", "h1,h2", "5433,"),
        ("postgresql://u@h1,h2:5434/db", "h1,h2", ",5434"),
        ("postgres://u@[::1]:5433,[fe80::1]:5434/db", "::1,fe80::1", "5433,5434"),
    ],
)
def test_several_servers_become_libpq_host_and_port_lists(url, host, port):
    config = database_config(url)
    assert (config["HOST"], config["PORT"]) == (host, port)
    assert config["NAME"] == "db"
    assert config["USER"] == "u"
    assert config["OPTIONS"]["target_session_attrs"] == "read-write"


def test_the_url_keeps_its_password_and_options():
    config = database_config(
        "postgresql://u:p%40ss@h1:5433,h2:5434/d?target_session_attrs=primary&sslmode=require"
    )
    assert config["PASSWORD"] == "p@ss"
    assert config["OPTIONS"] == {"target_session_attrs": "primary", "sslmode": "require"}


def test_one_server_is_parsed_as_before():
    config = database_config("postgresql://u@h1:5433/db")
    assert (config["HOST"], config["PORT"]) == ("h1", 5433)
    assert "target_session_attrs" not in config.get("OPTIONS", {})


@pytest.mark.parametrize("servers", ["h1:5433,h2:port", "h1:0,h2", "h1:70000,h2"])
def test_a_bad_port_is_a_clear_error_without_the_password(servers):
    with pytest.raises(ImproperlyConfigured, match="port is not a number") as raised:
        database_config(f"postgresql://u:secret@{servers}/db")
    assert "secret" not in str(raised.value)


@pytest.mark.django_db
def test_django_connects_to_the_first_server_that_answers():
    """The first server refuses connections (nothing listens there); Django connects to
    the second, the test's own server, as a worker or the web would."""
    here = connections["default"]
    here.ensure_connection()
    info = here.connection.info
    # A Unix socket's directory (the embedded server's) is percent-encoded, as in libpq.
    host = quote(info.host, safe="")
    url = f"postgresql://{info.user}@127.0.0.1:{free_port()},{host}:{info.port}/{info.dbname}"
    settings_dict = connections.configure_settings({"default": database_config(url)})["default"]
    settings_dict["PASSWORD"] = here.settings_dict["PASSWORD"]
    wrapper = DatabaseWrapper(settings_dict, alias="multi")
    try:
        with wrapper.cursor() as cursor:
            cursor.execute(
                "SELECT current_setting('port')::int, current_setting('transaction_read_only')"
            )
            assert cursor.fetchone() == (info.port, "off")
    finally:
        wrapper.close()
