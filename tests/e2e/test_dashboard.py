"""The dashboard in a real browser: Debian's Chromium (driven by Playwright) logs in,
uploads an inquiry (on the board at once, its message gone once its pipeline finished)
and follows it to its detail page until ``calculate`` succeeds (files to download, the
material every view shows), and submits analyses that a real worker subprocess runs
through the per-user queue, until the page has saved their runs — all without a page
reload (a marker set on the window after the page loaded must still be there at the end).
Every time on the pages reads the same way, whether the server or the script wrote it;
without a live worker the pages say so, and stop saying it when one beats.

The worker's judge holds each analysis until the test opens its gate
(``tests.e2e.judges.GatedJudge``), so *running* and *queued* are states the page can be
seen in, not races. Screenshots go to ``test-output/``, or to ``$E2E_SCREENSHOTS``
(``make screenshots`` points it at ``docs/images``).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from django.db import connection

from pipeline.models import Position
from runs.admission import analysis_job_admit
from runs.credits import credit_grant
from tests.conftest import ROOT
from tests.e2e.conftest import CHROMIUM
from tests.factories import TenantFactory, UserFactory

SCREENSHOTS = Path(os.environ.get("E2E_SCREENSHOTS") or ROOT / "test-output")
PASSWORD = "correct horse battery staple"
INQUIRY = ROOT / "config" / "demo_data" / "steel-beams.txt"

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
def alice(db):
    tenant = TenantFactory(slug="acme", name="Acme Analytics")
    user = UserFactory(username="alice", tenant=tenant)
    user.set_password(PASSWORD)
    user.save()
    credit_grant(user_id=user.pk, amount=5, note="e2e")
    return user


@pytest.fixture
def gates(clean_queue, tmp_path, start_worker) -> Path:
    """A worker with the gated judge; open a source's gate with ``(gates / key).touch()``.
    (After ``clean_queue``: emptying procrastinate's tables would unregister it.)"""
    directory = tmp_path / "gates"
    directory.mkdir()
    start_worker(
        concurrency=2,
        env={"DJANGO_SETTINGS_MODULE": "tests.e2e.settings", "E2E_JUDGE_GATES": str(directory)},
    )
    return directory


def eventually(check: Callable[[], bool], *, timeout: float = 45, message: str) -> None:
    """Poll the page (which updates itself from the API) until ``check`` holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")


def log_in(page, url: str) -> None:
    page.goto(f"{url}/dashboard/")
    assert "/accounts/login/" in page.url
    page.fill("#id_username", "alice")
    page.fill("#id_password", PASSWORD)
    with page.expect_navigation():
        page.click("button[type=submit].primary")
    assert page.url.endswith("/dashboard/")


def mark_loaded(page) -> None:
    """Set a marker that a reload (or any navigation) would wipe out."""
    page.wait_for_load_state("load")
    page.evaluate("window.__notReloaded = true")


def not_reloaded(page) -> bool:
    return page.evaluate("window.__notReloaded === true")


def status_of(page, selector: str) -> str | None:
    row = page.locator(selector)
    return row.first.get_attribute("data-status") if row.count() else None


#: How the pages show a time, and how long ago it was (config/templatetags/timestamps.py).
STAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC")
AGO = re.compile(r"just now|\d+ (min|h|d) ago")


def assert_times_read_alike(page) -> int:
    """Every time cell holds a stamp and a relative hint of the one style, or a dash.
    Returns how many times the page shows."""
    cells = page.locator("td.when").evaluate_all(
        "cells => cells.map(c => [c.querySelector('time')?.textContent ?? null,"
        " c.querySelector('.ago')?.textContent ?? null, c.textContent.trim()])"
    )
    shown = 0
    for stamp, ago, text in cells:
        if stamp is None:
            assert text == "—", text
            continue
        assert STAMP.fullmatch(stamp) and AGO.fullmatch(ago), (stamp, ago)
        shown += 1
    return shown


def submit_analysis(page, *, title: str, key: str) -> int:
    """Fill the dashboard's form; the page admits it through the API (no navigation) and
    says so. Returns the admitted job's id."""
    page.fill("#id_title", title)
    page.fill("#id_doc_html", f"<p>Water boils at one hundred degrees at sea level [{key}].</p>")
    page.fill("#id_source_key", key)
    page.fill("#id_source_title", "Thermodynamics")
    page.fill("#id_source_doi", "10.1000/thermo.1")
    page.fill("#id_source_text", "At sea level water boils at one hundred degrees.")
    with page.expect_response(re.compile(r"/api/analysis-jobs$")) as admitted:
        page.click("#analysis-form button[type=submit]")
    job = admitted.value.json()["id"]
    # The message about it stays at least until the page sees the analysis finish.
    assert f"Analysis #{job} admitted" in page.locator("#notices").inner_text()
    return job


def test_upload_an_inquiry_follow_it_then_analyse_and_see_the_page_save(
    browser_page, live_server, alice, gates
):
    page = browser_page
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    log_in(page, live_server.url)
    mark_loaded(page)

    page.fill("#id_inquiry_title", "Steel beams for hall 3")
    page.set_input_files("#id_files", str(INQUIRY))
    page.click("#inquiry-form button[type=submit]")
    link = page.locator("#new-inquiry-link")
    link.wait_for()
    assert not_reloaded(page)
    anfrage_id = int(re.search(r"#(\d+)", link.inner_text()).group(1))
    # On the stage board at once, not at the next poll.
    assert page.locator(f"#anfrage-{anfrage_id}").count() == 1
    assert page.locator("#no-worker").is_hidden()
    eventually(
        lambda: page.locator(f"#anfrage-{anfrage_id} [data-status=success]").count() == 4,
        message="the inquiry's pipeline to finish on the board",
    )
    eventually(
        lambda: page.locator("#notices li").count() == 0,
        message="the message about the inquiry to go once its pipeline finished",
    )

    with page.expect_navigation():
        page.click(f"#anfrage-{anfrage_id} a")
    assert page.url.endswith(f"/dashboard/inquiries/{anfrage_id}")
    mark_loaded(page)
    eventually(
        lambda: status_of(page, "#stage-rows [data-stage=calculate]") == "success",
        message="calculate to succeed on the detail page",
    )
    assert not_reloaded(page), "the detail page reloaded instead of polling"
    assert page.locator("#position-rows tr").count() == 3
    eventually(lambda: page.locator("#live").is_hidden(), message="the page to stop polling")
    assert re.match(r"\d+\.\d\d EUR", page.locator("#quote").inner_text())
    # The material column shows what pipeline_status and the API show.
    shown = [
        p.material_shown or "—"
        for p in Position.objects.filter(anfrage_id=anfrage_id).order_by("position_index")
    ]
    assert page.locator("#position-rows tr td:nth-child(4)").all_inner_texts() == shown
    assert assert_times_read_alike(page) == 8
    download = page.locator("#file-rows a")
    assert download.inner_text() == INQUIRY.name
    fetched = page.evaluate(
        "href => fetch(href).then(async r => [r.status, await r.text()])",
        download.get_attribute("href"),
    )
    assert fetched == [200, INQUIRY.read_text()]
    assert (
        page.evaluate("fetch(document.querySelector('link[rel=icon]').href).then(r => r.status)")
        == 200
    )
    page.screenshot(path=str(SCREENSHOTS / "inquiry.png"), full_page=True)

    with page.expect_navigation():
        page.click("text=← Dashboard")
    mark_loaded(page)
    (gates / "alpha").touch()
    job = submit_analysis(page, title="Boiling point", key="alpha")
    eventually(
        lambda: page.locator(f"#runs tr[data-job='{job}'] .badge.client").count() == 1,
        message="the page to save the finished analysis's run",
    )
    assert status_of(page, f"#job-{job}") == "complete"
    assert "1 supported" in page.locator(f"#job-{job} .verdicts").inner_text()
    assert page.locator("#balance").inner_text() == "4"
    assert not_reloaded(page), "the dashboard reloaded instead of polling"

    eventually(lambda: page.locator("#notices li").count() == 0, message="the message to go")
    assert_times_read_alike(page)

    with page.expect_navigation():
        page.click(f"#job-{job} a")
    assert "Saved by" in page.locator("#run-state").inner_text()
    assert page.locator("#verdict-rows tr").count() == 1
    assert "[alpha]" in page.locator("#document pre.doc").inner_text()
    assert page.locator("#run-link").get_attribute("href").endswith(f"/dashboard/analyses/{job}")
    assert assert_times_read_alike(page) == 3
    page.screenshot(path=str(SCREENSHOTS / "analysis.png"), full_page=True)


def test_analyses_move_through_the_queue_and_are_saved_without_a_reload(
    browser_page, live_server, alice, gates
):
    page = browser_page
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    log_in(page, live_server.url)
    mark_loaded(page)
    assert page.locator("#balance").inner_text() == "5"

    first = submit_analysis(page, title="Boiling point", key="alpha")
    eventually(lambda: status_of(page, f"#job-{first}") == "running", message="first running")
    second = submit_analysis(page, title="Sea level", key="beta")
    assert "queued at position 1" in page.locator("#notices li").last.inner_text()
    eventually(lambda: status_of(page, f"#job-{second}") == "queued", message="second queued")
    assert page.locator(f"#job-{second} .position").inner_text() == "1"
    page.screenshot(path=str(SCREENSHOTS / "dashboard-queued.png"), full_page=True)

    (gates / "alpha").touch()
    eventually(lambda: status_of(page, f"#job-{first}") == "complete", message="first complete")
    eventually(lambda: status_of(page, f"#job-{second}") == "running", message="second running")

    (gates / "beta").touch()
    eventually(lambda: status_of(page, f"#job-{second}") == "complete", message="second done")
    # The page saves finished analyses itself (the client save) and shows them as runs.
    eventually(
        lambda: page.locator("#runs .badge.client").count() == 2,
        message="both runs saved by the page",
    )
    eventually(lambda: page.locator("#live").is_hidden(), message="the page to stop polling")
    assert page.locator("body").get_attribute("data-in-flight") == "false"
    assert page.locator("#balance").inner_text() == "3"
    # Rows the script built read like the ones the server rendered.
    assert assert_times_read_alike(page) >= 4
    assert not_reloaded(page), "the dashboard reloaded instead of polling"
    page.screenshot(path=str(SCREENSHOTS / "dashboard.png"), full_page=True)


def test_the_pages_say_when_no_worker_is_alive(browser_page, live_server, alice, clean_queue):
    """Heartbeats are rows of ``procrastinate_workers``, aged by back-dating them."""
    analysis_job_admit(
        user=alice,
        title="Waits for a worker",
        doc_html="<p>Water boils at one hundred degrees at sea level [alpha].</p>",
        sources=[{"key": "alpha", "title": "T", "doi": None, "text": "Water boils."}],
    )
    page = browser_page
    log_in(page, live_server.url)
    notice = page.locator("#no-worker")
    assert notice.is_visible()
    assert "No worker is running" in notice.inner_text()

    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO procrastinate_workers DEFAULT VALUES RETURNING id")
        [worker] = cursor.fetchone()
    eventually(notice.is_hidden, timeout=10, message="the notice to go once a worker beats")

    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE procrastinate_workers SET last_heartbeat = now() - interval '1 hour' "
            "WHERE id = %s",
            [worker],
        )
    eventually(notice.is_visible, timeout=10, message="the notice once the worker fell silent")
