"""accounts.throttle: failures per address counted in PostgreSQL, windows that end, rows
that are pruned, and the address behind trusted proxies.

Fault model:

* many web processes count the same address at once: one UPSERT per failure, so none is
  lost (``test_concurrent_failures_are_all_counted``, real concurrent connections);
* a window ends: the address may try again, and its next failure starts a new window
  (``test_a_window_ends``, by back-dating the row);
* many addresses fail once and never return: later failures prune their rows
  (``test_ended_windows_are_pruned_by_later_failures``);
* a client forges ``X-Forwarded-For``: only the hop the trusted proxy appended counts
  (``test_the_address_behind_trusted_proxies``).
"""

from __future__ import annotations

import datetime

import pytest
from django.test import RequestFactory
from django.utils import timezone

from accounts import throttle
from accounts.models import AuthFailure
from tests.conftest import run_concurrently


@pytest.mark.django_db(transaction=True)
def test_concurrent_failures_are_all_counted(settings):
    settings.AUTH_FAILURE_LIMIT = 100

    run_concurrently(
        lambda i: throttle.auth_failure_record(scope=throttle.TOKEN, address="192.0.2.1"), 8
    )

    assert AuthFailure.objects.get(address="192.0.2.1").failures == 8


@pytest.mark.django_db
def test_a_window_ends(settings):
    settings.AUTH_FAILURE_LIMIT = 2
    for _ in range(2):
        throttle.auth_failure_record(scope=throttle.LOGIN, address="192.0.2.2")
    refused = throttle.auth_throttle_check(scope=throttle.LOGIN, address="192.0.2.2")
    assert refused is not None and 0 < refused.retry_after <= settings.AUTH_FAILURE_WINDOW_SECONDS
    # The other scope is counted apart.
    assert throttle.auth_throttle_check(scope=throttle.TOKEN, address="192.0.2.2") is None

    ended = timezone.now() - datetime.timedelta(seconds=settings.AUTH_FAILURE_WINDOW_SECONDS + 1)
    AuthFailure.objects.update(window_start=ended)

    assert throttle.auth_throttle_check(scope=throttle.LOGIN, address="192.0.2.2") is None
    assert throttle.auth_failure_record(scope=throttle.LOGIN, address="192.0.2.2") == 1


@pytest.mark.django_db
def test_ended_windows_are_pruned_by_later_failures(settings):
    ended = timezone.now() - datetime.timedelta(seconds=settings.AUTH_FAILURE_WINDOW_SECONDS + 1)
    AuthFailure.objects.bulk_create(
        AuthFailure(
            scope=throttle.TOKEN,
            address=f"10.0.{i // 250}.{i % 250}",
            window_start=ended,
            failures=1,
        )
        for i in range(throttle.PRUNE_BATCH + 10)
    )

    throttle.auth_failure_record(scope=throttle.TOKEN, address="192.0.2.3")
    throttle.auth_failure_record(scope=throttle.TOKEN, address="192.0.2.3")

    assert list(AuthFailure.objects.values_list("address", flat=True)) == ["192.0.2.3"]


@pytest.mark.parametrize(
    ("hops", "forwarded", "address"),
    [
        (0, "1.1.1.1", "127.0.0.9"),
        (1, "6.6.6.6, 1.1.1.1", "1.1.1.1"),
        (2, "6.6.6.6, 1.1.1.1, 10.0.0.1", "1.1.1.1"),
        (2, "1.1.1.1", "127.0.0.9"),
    ],
)
def test_the_address_behind_trusted_proxies(settings, hops, forwarded, address):
    settings.TRUSTED_PROXY_HOPS = hops
    request = RequestFactory().get("/", REMOTE_ADDR="127.0.0.9", HTTP_X_FORWARDED_FOR=forwarded)
    assert throttle.client_address(request) == address
