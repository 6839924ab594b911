"""factory-boy factories shared by every test package (domain factories live beside
their tests, e.g. tests/pipeline/factories.py)."""

from __future__ import annotations

import factory

from accounts.models import Tenant, User
from accounts.services import api_token_create


class TenantFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Tenant
        django_get_or_create = ("slug",)

    slug = factory.Sequence(lambda n: f"tenant-{n}")
    name = factory.LazyAttribute(lambda o: o.slug.title())


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = User
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    tenant = factory.SubFactory(TenantFactory)


def auth_header(user: User) -> dict[str, str]:
    """Headers for the Django test client: ``client.get(url, headers=auth_header(u))``."""
    return {"Authorization": f"Bearer {api_token_create(user=user)}"}
