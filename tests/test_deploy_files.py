"""The container files (there is no Docker engine in the test environment, so they are
read, not run): the image runs the production server as a non-root user, compose wires
web through PgBouncer in transaction mode and the workers straight to PostgreSQL, and
every long-running service restarts and drains as docs/deploy.md says."""

from __future__ import annotations

import configparser
import re
import subprocess

import yaml

from tests.conftest import ROOT


def compose() -> dict:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def test_the_image_runs_gunicorn_as_a_non_root_user():
    dockerfile = (ROOT / "Dockerfile").read_text()
    final = dockerfile.rsplit("\nFROM ", 1)[1]
    assert final.startswith("python:3.11-slim")
    users = re.findall(r"^USER (\S+)$", final, re.MULTILINE)
    assert users and users[-1] not in ("root", "0")
    assert (
        'CMD ["python", "-m", "gunicorn", "-c", "python:queueing.gunicorn", "config.wsgi"]' in final
    )
    assert "collectstatic" in dockerfile
    # The distribution is the framework, installed plainly (not editable); the site's
    # libraries come from its extra, and neither the embedded PostgreSQL nor the
    # development tools are installed.
    installs = re.findall(r"pip install ([^\n\\&]+)", dockerfile)
    assert installs == ['".[demo]" ', "--no-deps . "], installs
    assert "-e " not in "".join(installs) and "pgserver" not in dockerfile
    assert "rm -rf queueing" in dockerfile.split("COPY . .", 1)[1]
    assert "HEALTHCHECK" in final and "/healthz" in final


def test_compose_runs_postgres_pgbouncer_web_and_two_workers():
    services = compose()["services"]
    assert {"postgres", "pgbouncer", "web", "worker", "migrate"} <= set(services)
    web, worker = services["web"], services["worker"]
    assert "@pgbouncer:6432/" in web["environment"]["DATABASE_URL"]
    assert web["environment"]["DATABASE_TRANSACTION_POOLING"] == "true"
    assert "@postgres:5432/" in worker["environment"]["DATABASE_URL"]
    assert worker["deploy"]["replicas"] == 2
    assert worker["command"][:4] == ["python", "manage.py", "procrastinate", "worker"]


def test_long_running_services_restart_and_workers_drain():
    services = compose()["services"]
    for name in ("postgres", "pgbouncer", "web", "worker"):
        assert services[name]["restart"] == "unless-stopped", name
    worker = services["worker"]
    assert worker["stop_signal"] == "SIGTERM"
    drain = int(worker["environment"]["WORKER_GRACEFUL_TIMEOUT_SECONDS"])
    assert int(worker["stop_grace_period"].rstrip("s")) > drain
    assert worker["healthcheck"]["test"] == ["CMD", "python", "manage.py", "worker_health"]
    assert services["migrate"]["restart"] == "no"
    for name in ("web", "worker"):
        assert services[name]["depends_on"]["migrate"] == {
            "condition": "service_completed_successfully"
        }


def test_pgbouncer_pools_by_transaction():
    config = configparser.ConfigParser(inline_comment_prefixes=(";",))
    config.read(ROOT / "deploy" / "pgbouncer" / "pgbouncer.ini")
    assert config["pgbouncer"]["pool_mode"] == "transaction"
    assert "extra_float_digits" in config["pgbouncer"]["ignore_startup_parameters"]


def test_test_tool_caches_are_neither_committed_nor_shipped():
    tracked = subprocess.run(
        ["git", "ls-files", ".schemathesis", ".hypothesis"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    ignored = (ROOT / ".gitignore").read_text().split()
    shipped = (ROOT / ".dockerignore").read_text().split()

    assert tracked == ""
    assert {".schemathesis/", ".hypothesis/"} <= set(ignored)
    assert {".schemathesis", ".hypothesis"} <= set(shipped)
