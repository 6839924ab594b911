"""The pages under the Content-Security-Policy, in a real browser: each page of the
dashboard and of the admin loads with its script and its stylesheet working and no
violation reported (the ``browser_page`` fixture fails a test that met one: the dashboard's
detail pages are checked by every test of ``test_dashboard.py``), while an inline script
is refused. The framework's admin pages (procrastinate's job list and job page, the
Sweeps page) style what procrastinate styled inline with classes of
``queueing/admin.css``.

Fault model: an inline ``<script>``, ``<style>`` or ``style=""`` left in a template (the
page would lose its behaviour or its look under the policy: a console violation fails the
test); an injected inline script (it must not run).
"""

from __future__ import annotations

import pytest
from django.db import connection

from tests.e2e.test_dashboard import (  # noqa: F401  (alice: a fixture)
    alice,
    log_in,
    mark_loaded,
    pytestmark,
    submit_analysis,
)
from tests.factories import UserFactory

INK = "rgb(29, 35, 48)"  # --ink of pgstage.css: the stylesheet was applied


@pytest.mark.usefixtures("alice")
def test_the_dashboard_runs_under_the_policy_and_refuses_an_inline_script(
    browser_page, live_server, csp_violations
):
    page = browser_page
    log_in(page, live_server.url)
    mark_loaded(page)

    header = page.evaluate("getComputedStyle(document.querySelector('header.top')).backgroundColor")
    policy = page.evaluate(
        "fetch(location.href).then(r => r.headers.get('content-security-policy'))"
    )
    # The dashboard's script runs: it admits the form through the API and says so.
    job = submit_analysis(page, title="Under the policy", key="alpha")
    injected = page.evaluate(
        """() => {
            const script = document.createElement("script");
            script.textContent = "window.__inlineRan = true";
            document.body.appendChild(script);
            return window.__inlineRan === true;
        }"""
    )

    assert header == INK
    assert "script-src 'self'" in policy and "style-src 'self'" in policy
    assert job > 0
    assert injected is False
    # The refusal is the one violation (the fixture fails the test on any other).
    assert len(csp_violations) == 1 and "inline script" in csp_violations[0]
    csp_violations.clear()


def admin_log_in(page, url: str) -> None:
    root = UserFactory(username="root", is_staff=True, is_superuser=True)
    root.set_password("right horse")
    root.save()
    page.goto(f"{url}/admin/login/")
    page.fill("#id_username", "root")
    page.fill("#id_password", "right horse")
    with page.expect_navigation():
        page.click("input[type=submit]")


@pytest.mark.parametrize(
    "path",
    [
        "/admin/",
        "/admin/runs/analysisjob/",
        "/admin/pipeline/pipelinerun/",
        "/admin/accounts/user/",
    ],
)
def test_admin_pages_load_under_the_policy(browser_page, live_server, csp_violations, path):
    page = browser_page
    admin_log_in(page, live_server.url)

    page.goto(f"{live_server.url}{path}")
    page.wait_for_load_state("load")

    assert page.locator("#content").count() == 1
    # The admin's own stylesheet applied (its header is not the browser's default).
    assert page.evaluate(
        "getComputedStyle(document.querySelector('#header')).backgroundColor"
    ) not in ("rgba(0, 0, 0, 0)", "")


def test_the_job_pages_and_the_sweeps_page_keep_their_look_under_the_policy(
    browser_page, live_server, clean_queue
):
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO procrastinate_jobs (queue_name, task_name, args) "
            "VALUES ('default', 'pipeline.tasks.intake', '{\"anfrage_id\": 1}') RETURNING id"
        )
        [job] = cursor.fetchone()
    page = browser_page
    admin_log_in(page, live_server.url)
    jobs = f"{live_server.url}/admin/procrastinate/procrastinatejob/"

    for url, selector, prop, value in [
        (jobs, "pre.job-args", "marginTop", "0px"),
        (f"{jobs}{job}/change/", "pre.job-args", "marginTop", "0px"),
        (f"{jobs}sweeps/", "#result_list td.nowrap[title]", "whiteSpace", "nowrap"),
    ]:
        page.goto(url)
        page.wait_for_load_state("load")
        assert (
            page.evaluate(f"getComputedStyle(document.querySelector('{selector}')).{prop}") == value
        ), url
