"""Authentication under attack: missing and wrong credentials are a 401 with a challenge
(never a CSRF 403, never an admission rejection in /metrics); wrong tokens and failed
logins are rate-limited per client address, with a 429 and ``Retry-After``.

Fault model:

* a POST without a token: once answered 403 "CSRF check Failed" and counted as a refused
  admission (``test_a_post_without_a_token_is_a_401_and_no_admission_rejection``);
* a logged-in session that skips CSRF: still a 403
  (``test_a_session_still_needs_its_csrf_token``);
* a token guesser: refused from the limit on, even with a right token, per address; other
  addresses unaffected (``test_wrong_tokens_are_limited_per_address``);
* a password guesser on either login page (``test_failed_logins_are_limited_per_address``);
* a locked-out address (its own user, or everyone behind the same proxy): an operator
  sees it in the admin and lifts it there or with a command
  (``test_an_operator_sees_a_lockout_in_the_admin_and_resets_it``,
  ``test_an_operator_lists_and_resets_a_lockout_with_a_command``).
"""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from accounts.models import AuthFailure
from config.metrics import ADMISSION_REJECTIONS
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

JOB = {"title": "T", "doc_html": "<p>x [k]</p>", "sources": [{"key": "k"}]}


def rejections() -> dict[str, float]:
    return {
        sample.labels["reason"]: sample.value
        for metric in ADMISSION_REJECTIONS.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
    }


def test_a_post_without_a_token_is_a_401_and_no_admission_rejection(user):
    client = Client(enforce_csrf_checks=True)
    before = rejections()

    for headers in ({}, {"HTTP_AUTHORIZATION": "Bearer pgs_wrong"}):
        response = client.post(
            "/api/analysis-jobs", json.dumps(JOB), content_type="application/json", **headers
        )
        assert response.status_code == 401
        assert response["WWW-Authenticate"].startswith("Bearer")

    assert rejections() == before


def test_a_session_still_needs_its_csrf_token(user):
    user.set_password("pw")
    user.save()
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    body = json.dumps(JOB)

    refused = client.post("/api/analysis-jobs", body, content_type="application/json")
    client.get("/dashboard/")  # its form sets the CSRF cookie
    token = client.cookies["csrftoken"].value
    admitted = client.post(
        "/api/analysis-jobs", body, content_type="application/json", HTTP_X_CSRFTOKEN=token
    )

    assert refused.status_code == 403
    assert admitted.status_code == 201, admitted.content


def test_wrong_tokens_are_limited_per_address(settings, token):
    settings.AUTH_FAILURE_LIMIT = 3
    guesser = Client(REMOTE_ADDR="203.0.113.7")
    neighbour = Client(REMOTE_ADDR="203.0.113.8")
    wrong = {"HTTP_AUTHORIZATION": "Bearer pgs_guess"}
    right = {"HTTP_AUTHORIZATION": f"Bearer {token}"}

    statuses = [guesser.get("/api/anfragen", **wrong).status_code for _ in range(4)]
    with_the_right_token = guesser.get("/api/anfragen", **right)

    assert statuses == [401, 401, 401, 429]
    assert with_the_right_token.status_code == 429
    assert with_the_right_token.json()["error"] == "too_many_auth_failures"
    assert int(with_the_right_token["Retry-After"]) > 0
    assert neighbour.get("/api/anfragen", **right).status_code == 200
    # Kept in PostgreSQL, where every web process reads it.
    assert AuthFailure.objects.get(address="203.0.113.7").failures == 3


def test_a_missing_token_is_not_a_failure(settings, user):
    settings.AUTH_FAILURE_LIMIT = 1
    client = Client()
    assert [client.get("/api/anfragen").status_code for _ in range(3)] == [401] * 3
    assert not AuthFailure.objects.exists()


@pytest.mark.parametrize(
    ("url", "form"),
    [
        ("/accounts/login/", "ThrottledAuthenticationForm"),
        ("/admin/login/", "ThrottledAdminAuthenticationForm"),
    ],
)
def test_failed_logins_are_limited_per_address(settings, url, form):
    settings.AUTH_FAILURE_LIMIT = 2
    root = UserFactory(username="root", is_staff=True, is_superuser=True)
    root.set_password("right")
    root.save()
    client = Client(REMOTE_ADDR="198.51.100.1")

    wrong = [client.post(url, {"username": "root", "password": "nope"}) for _ in range(2)]
    right = client.post(url, {"username": "root", "password": "right"})

    assert [r.status_code for r in wrong] == [200, 200]
    assert type(wrong[0].context["form"]).__name__ == form
    assert right.status_code == 429
    assert b"too many failed logins" in right.content
    assert int(right["Retry-After"]) > 0
    assert "_auth_user_id" not in client.session
    other = Client(REMOTE_ADDR="198.51.100.2")
    assert other.post(url, {"username": "root", "password": "right"}).status_code == 302


def lock_out(client: Client, password: str = "right") -> None:
    root = UserFactory(username="root", is_staff=True, is_superuser=True)
    root.set_password(password)
    root.save()
    for _ in range(2):
        client.post("/accounts/login/", {"username": "root", "password": "nope"})
    assert (
        client.post("/accounts/login/", {"username": "root", "password": password}).status_code
        == 429
    )


def test_an_operator_sees_a_lockout_in_the_admin_and_resets_it(settings, admin_client):
    settings.AUTH_FAILURE_LIMIT = 2
    locked = Client(REMOTE_ADDR="198.51.100.7")
    lock_out(locked)

    listing = admin_client.get("/admin/accounts/authfailure/")
    assert b"198.51.100.7" in listing.content and b"Locked out until" in listing.content
    pk = AuthFailure.objects.get(address="198.51.100.7").pk
    response = admin_client.post(
        "/admin/accounts/authfailure/", {"action": "reset", "_selected_action": [pk]}
    )

    assert response.status_code == 302
    assert not AuthFailure.objects.exists()
    right = locked.post("/accounts/login/", {"username": "root", "password": "right"})
    assert right.status_code == 302


def test_an_operator_lists_and_resets_a_lockout_with_a_command(settings):
    settings.AUTH_FAILURE_LIMIT = 2
    locked = Client(REMOTE_ADDR="198.51.100.8")
    lock_out(locked)
    AuthFailure.objects.create(scope="token", address="192.0.2.1", window_start=timezone.now())

    listed, reset, again = io.StringIO(), io.StringIO(), io.StringIO()
    call_command("reset_auth_failures", "--list", stdout=listed)
    call_command("reset_auth_failures", "--address", "198.51.100.8", stdout=reset)
    call_command("reset_auth_failures", "--address", "198.51.100.8", stdout=again)

    assert "198.51.100.8\tlogin\t2 failure(s)" in listed.getvalue()
    assert "locked out until" in listed.getvalue()
    assert "forgot 1 failure count(s) of 198.51.100.8" in reset.getvalue()
    assert "forgot 0" in again.getvalue()
    assert list(AuthFailure.objects.values_list("address", flat=True)) == ["192.0.2.1"]
    assert (
        locked.post("/accounts/login/", {"username": "root", "password": "right"}).status_code
        == 302
    )
