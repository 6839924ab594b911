"""The accounts admin, and the rule for the whole admin: staff only."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.urls import reverse
from django.utils import timezone

from accounts.models import ApiToken, AuthFailure, Tenant, User
from accounts.services import api_token_create
from tests.factories import TenantFactory, UserFactory

pytestmark = pytest.mark.django_db

ACCOUNTS_MODELS = sorted(
    (model for model in admin.site._registry if model._meta.app_label == "accounts"),
    key=lambda model: model._meta.model_name,
)


@pytest.fixture
def staff_client(client):
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    return client


@pytest.fixture
def token(db):
    user = UserFactory(username="alice", tenant=TenantFactory(slug="acme"))
    api_token_create(user=user)
    AuthFailure.objects.create(
        scope="login", address="198.51.100.1", window_start=timezone.now(), failures=3
    )
    return ApiToken.objects.get(user=user)


def every_admin_url() -> list[str]:
    urls = [reverse("admin:index"), reverse("admin:queueing_sweeps")]
    for model in admin.site._registry:
        opts = model._meta
        urls.append(reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"))
    return urls


@pytest.mark.parametrize("who", ["anonymous", "non-staff"])
def test_only_staff_get_the_admin(client, token, who):
    if who == "non-staff":
        client.force_login(token.user)

    for url in every_admin_url():
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith(f"{reverse('admin:login')}?next="), url
    login = client.get(reverse("admin:index"), follow=True)
    assert login.status_code == 200 and b"Log in" in login.content


@pytest.mark.parametrize("model", ACCOUNTS_MODELS, ids=lambda m: m._meta.model_name)
def test_every_accounts_page_renders_with_rows(staff_client, token, model):
    name = model._meta.model_name
    changelist = reverse(f"admin:accounts_{name}_changelist")
    assert staff_client.get(changelist).status_code == 200
    assert staff_client.get(changelist, {"q": "alice"}).status_code == 200
    row = model.objects.order_by("pk").last()
    assert (
        staff_client.get(reverse(f"admin:accounts_{name}_change", args=[row.pk])).status_code == 200
    )


def test_filters_by_tenant(staff_client, token):
    UserFactory(username="bob", tenant=TenantFactory(slug="globex"))
    acme = Tenant.objects.get(slug="acme")

    users = staff_client.get(
        reverse("admin:accounts_user_changelist"), {"tenant__id__exact": acme.id}
    )
    tokens = staff_client.get(
        reverse("admin:accounts_apitoken_changelist"), {"user__tenant__id__exact": acme.id}
    )
    tenants = staff_client.get(reverse("admin:accounts_tenant_changelist"))

    assert [u.username for u in users.context["cl"].result_list] == ["alice"]
    assert tokens.context["cl"].result_count == 1
    counts = {t.slug: t.user_count for t in tenants.context["cl"].result_list}
    assert (counts["acme"], counts["globex"]) == (1, 1)


def test_a_user_is_created_with_a_tenant(staff_client, token):
    acme = Tenant.objects.get(slug="acme")

    response = staff_client.post(
        reverse("admin:accounts_user_add"),
        {
            "username": "carol",
            "usable_password": "true",
            "password1": "a-long-passphrase-42",
            "password2": "a-long-passphrase-42",
            "tenant": acme.id,
        },
    )

    assert response.status_code == 302
    assert User.objects.get(username="carol").tenant == acme


def test_tokens_are_not_added_here_and_their_hash_is_read_only(staff_client, token):
    assert staff_client.get(reverse("admin:accounts_apitoken_add")).status_code == 403
    page = staff_client.get(reverse("admin:accounts_apitoken_change", args=[token.pk]))
    assert (
        b'name="token_hash"' not in page.content and token.token_hash.encode() not in page.content
    )
    # Revocation goes through the service (the "Revoke" action), not a field edit.
    assert b'name="revoked_at_0"' not in page.content


def test_revoke_action_revokes_once_and_the_token_stops_working(staff_client, token):
    from accounts.services import api_token_authenticate

    user = token.user
    plaintext = api_token_create(user=user)
    fresh = ApiToken.objects.filter(user=user).latest("id")
    url = reverse("admin:accounts_apitoken_changelist")
    for expected in (
        "Revoked 1 token(s); 0 were already revoked.",
        "Revoked 0 token(s); 1 were already revoked.",
    ):
        response = staff_client.post(
            url, {"action": "revoke", "_selected_action": [fresh.pk]}, follow=True
        )
        assert expected in response.content.decode()
    assert api_token_authenticate(token=plaintext) is None
    token.refresh_from_db()
    assert token.revoked_at is None


def test_a_tenants_slug_is_fixed_once_created(staff_client, token):
    acme = Tenant.objects.get(slug="acme")
    change = reverse("admin:accounts_tenant_change", args=[acme.pk])

    response = staff_client.post(change, {"slug": "renamed", "name": "Acme Corp"})

    assert response.status_code == 302
    acme.refresh_from_db()
    assert (acme.slug, acme.name) == ("acme", "Acme Corp")
    added = staff_client.post(
        reverse("admin:accounts_tenant_add"), {"slug": "initech", "name": "Initech"}
    )
    assert added.status_code == 302 and Tenant.objects.filter(slug="initech").exists()
