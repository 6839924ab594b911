"""The dashboard in a real browser: Debian's Chromium (driven by Playwright) logs in,
submits two analyses and watches them move through the per-user queue, processed by a
real worker subprocess, until the page has saved both runs.

The worker's judge holds each analysis until the test opens its gate
(``tests.e2e.judges.GatedJudge``), so *running* and *queued* are states the page can be
seen in, not races. Screenshots go to ``test-output/``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import connections

from runs.credits import credit_grant
from tests.conftest import ROOT
from tests.factories import TenantFactory, UserFactory

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
OUTPUT = ROOT / "test-output"
PASSWORD = "correct horse battery staple"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="needs Debian's Chromium at /usr/bin/chromium "
        "(apt-get update && apt-get install -y chromium)",
    ),
]


@pytest.fixture
def browser_page(monkeypatch) -> Iterator:
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop in this thread; the test's own ORM calls
    # between browser steps are still plain synchronous code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(15_000)
            yield page
        finally:
            browser.close()
            # While Playwright's event loop is set, Django keys its connections by
            # context rather than by thread: close the ones this test opened that way.
            connections.close_all()


def eventually(check: Callable[[], bool], *, timeout: float = 30, message: str) -> None:
    """Poll the page (which reloads itself every 2 s) until ``check`` holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:  # the page may be mid-reload
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")


def job_status(page, job_id: int) -> str | None:
    row = page.locator(f"#job-{job_id}")
    return row.get_attribute("data-status", timeout=1_000) if row.count() else None


def submit_analysis(page, *, title: str, key: str) -> int:
    """Fill the dashboard's form and submit it; returns the admitted job's id."""
    page.wait_for_load_state("load")
    page.fill("#id_title", title)
    page.fill("#id_doc_html", f"<p>Water boils at one hundred degrees at sea level [{key}].</p>")
    page.fill("#id_source_key", key)
    page.fill("#id_source_title", "Thermodynamics")
    page.fill("#id_source_doi", "10.1000/thermo.1")
    page.fill("#id_source_text", "At sea level water boils at one hundred degrees.")
    with page.expect_navigation():
        page.click("#analysis-form button[type=submit]")
    message = page.locator(".messages li").inner_text()
    match = re.search(r"Analysis #(\d+) admitted", message)
    assert match, page.content()
    return int(match.group(1))


def test_submit_and_watch_analyses_through_the_queue(
    browser_page, live_server, start_worker, clean_queue, tmp_path
):
    page = browser_page
    gates = tmp_path / "gates"
    gates.mkdir()
    OUTPUT.mkdir(exist_ok=True)
    tenant = TenantFactory(slug="acme", name="Acme Analytics")
    user = UserFactory(username="alice", tenant=tenant)
    user.set_password(PASSWORD)
    user.save()
    credit_grant(user_id=user.pk, amount=5, note="e2e")
    start_worker(
        env={"DJANGO_SETTINGS_MODULE": "tests.e2e.settings", "E2E_JUDGE_GATES": str(gates)}
    )

    page.goto(f"{live_server.url}/dashboard/")
    assert "/accounts/login/" in page.url
    page.fill("#id_username", "alice")
    page.fill("#id_password", PASSWORD)
    with page.expect_navigation():
        page.click("button[type=submit].primary")
    assert page.url.endswith("/dashboard/")
    assert page.locator("#balance").inner_text() == "5"

    first = submit_analysis(page, title="Boiling point", key="alpha")
    eventually(lambda: job_status(page, first) == "running", message="the first job running")

    second = submit_analysis(page, title="Sea level", key="beta")
    assert "queued at position 1" in page.locator(".messages li").inner_text()
    assert job_status(page, second) == "queued"
    assert page.locator(f"#job-{second} .position").inner_text() == "1"
    page.screenshot(path=str(OUTPUT / "dashboard-queued.png"), full_page=True)

    (gates / "alpha").touch()
    eventually(lambda: job_status(page, first) == "complete", message="the first job complete")
    eventually(lambda: job_status(page, second) == "running", message="the second job running")

    (gates / "beta").touch()
    eventually(lambda: job_status(page, second) == "complete", message="the second job complete")
    # The page saves finished analyses itself (the client save) and shows them as runs.
    eventually(
        lambda: page.locator("#runs .badge.client").count() == 2,
        message="both runs saved by the page",
    )
    assert page.locator("body").get_attribute("data-in-flight") == "false"
    assert page.locator("#balance").inner_text() == "3"
    page.screenshot(path=str(OUTPUT / "dashboard.png"), full_page=True)
