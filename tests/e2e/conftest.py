"""The browser of the e2e suite: Debian's Chromium driven by Playwright. Every page it
loads is watched for Content-Security-Policy violations: a test that met one fails."""

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
def browser_page(monkeypatch, csp_violations) -> Iterator:
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
            page.on(
                "console",
                lambda message: (
                    csp_violations.append(message.text)
                    if "Content Security Policy" in message.text
                    else None
                ),
            )
            yield page
        finally:
            browser.close()
            # While Playwright's event loop is set, Django keys its connections by
            # context rather than by thread: close the ones this test opened that way.
            connections.close_all()
    assert csp_violations == []
