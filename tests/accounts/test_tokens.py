from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from accounts.models import ApiToken, Tenant, User
from accounts.services import api_token_authenticate, hash_token
from tests.factories import TenantFactory, UserFactory

pytestmark = pytest.mark.django_db


def test_command_creates_tenant_user_and_prints_the_token_last():
    out = io.StringIO()
    call_command("create_api_token", tenant="acme", user="alice", stdout=out, stderr=io.StringIO())
    token = out.getvalue().strip().splitlines()[-1]
    user = User.objects.get(username="alice")
    assert user.tenant == Tenant.objects.get(slug="acme")
    assert api_token_authenticate(token=token) == user
    # Only the hash is stored.
    assert ApiToken.objects.get().token_hash == hash_token(token)
    assert not ApiToken.objects.filter(token_hash=token).exists()


def test_command_is_idempotent_for_tenant_and_user():
    for _ in range(2):
        call_command(
            "create_api_token",
            tenant="acme",
            user="bob",
            stdout=io.StringIO(),
            stderr=io.StringIO(),
        )
    assert Tenant.objects.filter(slug="acme").count() == 1
    assert ApiToken.objects.filter(user__username="bob").count() == 2


def test_command_refuses_a_user_of_another_tenant():
    UserFactory(username="carol", tenant=TenantFactory(slug="globex"))
    with pytest.raises(CommandError, match="belongs to another tenant"):
        call_command("create_api_token", tenant="acme", user="carol", stdout=io.StringIO())
    assert not Tenant.objects.filter(slug="acme").exists()
    assert not ApiToken.objects.exists()


@pytest.mark.parametrize("tenant", ["Not A Slug", "", "a/b"])
def test_command_refuses_bad_tenant_slugs(tenant):
    with pytest.raises(CommandError, match="slug"):
        call_command("create_api_token", tenant=tenant, user="dave", stdout=io.StringIO())
    assert not User.objects.filter(username="dave").exists()


def test_revoked_and_unknown_tokens_do_not_authenticate():
    from django.utils import timezone

    from accounts.services import api_token_create

    user = UserFactory()
    token = api_token_create(user=user)
    assert api_token_authenticate(token="pgs_nope") is None
    ApiToken.objects.update(revoked_at=timezone.now())
    assert api_token_authenticate(token=token) is None


def test_api_answers_401_json_without_a_token(client):
    response = client.get("/api/analysis-runs")
    assert response.status_code == 401
    assert response.json()["error"] == "unauthenticated"
