"""The browser of the e2e suite: Debian's Chromium driven by Playwright. Every page it
loads is watched for Content-Security-Policy violations and for resources that failed to
load (a missing favicon is a 404 in the console): a test that met either fails."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connections

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


@pytest.fixture
def csp_violations() -> list[str]:
    """The console's Content-Security-Policy reports of the test's pages."""
    return []


@pytest.fixture
def load_failures() -> list[str]:
    """The console's reports of resources that did not load (a 404, a 500)."""
    return []


def _watch(message, csp_violations: list[str], load_failures: list[str]) -> None:
    if "Content Security Policy" in message.text:
        csp_violations.append(message.text)
    elif message.type == "error" and "Failed to load resource" in message.text:
        load_failures.append(f"{message.text} ({message.location.get('url')})")


@pytest.fixture
def browser_page(monkeypatch, csp_violations, load_failures) -> Iterator:
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop in this thread; the test's own ORM calls
    # between browser steps are still plain synchronous code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(15_000)
            page.on("console", lambda message: _watch(message, csp_violations, load_failures))
            yield page
        finally:
            browser.close()
            # While Playwright's event loop is set, Django keys its connections by
            # context rather than by thread: close the ones this test opened that way.
            connections.close_all()
    assert csp_violations == []
    assert load_failures == []
