"""The login forms of the dashboard and the admin, rate-limited per client address."""

from __future__ import annotations

from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError

from accounts import throttle

THROTTLED = "throttled"


class ThrottledLoginMixin:
    """Refuse every login from an address over its failure limit (even a correct one, so
    guessing stops paying off) and count each refused login against its address."""

    request = None
    throttled: throttle.Throttled | None = None

    def clean(self):
        address = throttle.client_address(self.request)
        self.throttled = throttle.auth_throttle_check(scope=throttle.LOGIN, address=address)
        if self.throttled is not None:
            raise ValidationError(self.throttled.message, code=THROTTLED)
        try:
            return super().clean()
        except ValidationError:
            throttle.auth_failure_record(scope=throttle.LOGIN, address=address)
            raise


class ThrottledAuthenticationForm(ThrottledLoginMixin, AuthenticationForm):
    pass


class ThrottledAdminAuthenticationForm(ThrottledLoginMixin, AdminAuthenticationForm):
    pass
