"""/metrics behind gunicorn with several processes: every scrape reports the same totals,
whichever process answers it (prometheus_client's multiprocess mode, set up by
``queueing.gunicorn``), and the access log is one line of fields per request.

Fault model: the load balancer (here, the kernel's accept queue) sends consecutive
scrapes to different gunicorn processes; an in-process counter would then jump back and
forth between each process's own count.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.servers import http, start_web

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TOKEN = "processes-metrics-token"
DURATION = "pgstage_http_request_duration_seconds"


def head_count(url: str) -> float:
    reply = http("GET", f"{url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert reply.status == 200, reply.body[:300]
    for family in text_string_to_metric_families(reply.body.decode()):
        for sample in family.samples:
            if sample.name == f"{DURATION}_count" and sample.labels == {
                "method": "HEAD",
                "status": "200",
            }:
                return sample.value
    return 0.0


def test_every_scrape_reports_the_requests_of_every_process(worker_env, tmp_path):
    metrics_dir = tmp_path / "prometheus"
    env = {
        **worker_env,
        "METRICS_TOKEN": TOKEN,
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
        "LOG_FORMAT": "json",
    }
    web = start_web(env, tmp_path / "web.log", WEB_WORKERS=2, WEB_THREADS=1)
    try:
        sent = 0
        lock = threading.Lock()

        def probe() -> None:
            nonlocal sent
            assert http("HEAD", f"{web.url}/healthz").status == 200
            with lock:
                sent += 1

        # Concurrent probes until both processes have answered some (each process keeps
        # its values in files named after its pid).
        deadline = time.monotonic() + 60
        while len(list(metrics_dir.glob("histogram_*.db"))) < 2:
            assert time.monotonic() < deadline, "one gunicorn process answered everything"
            threads = [threading.Thread(target=probe) for _ in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=30)
        assert sent > 0
        # Every scrape, whichever process answers it, reports every process's probes.
        assert [head_count(web.url) for _ in range(10)] == [float(sent)] * 10
    finally:
        web.stop()
    access = [
        json.loads(line)
        for line in web.log().splitlines()
        if line.startswith("{") and '"gunicorn.access"' in line
    ]
    probes = [line for line in access if line["method"] == "HEAD"]
    assert len(probes) == sent
    first = probes[0]
    assert first["path"] == "/healthz"
    assert first["status"] == 200
    assert isinstance(first["duration"], float) and first["duration"] >= 0
    assert first["message"] == "HEAD /healthz 200"
