"""Login views: Django's own, answering 429 (with ``Retry-After``) while the client's
address is over its failure limit."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps

from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse

from accounts.forms import ThrottledAuthenticationForm


def throttle_status(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Wrap a login view whose form is a ``ThrottledLoginMixin``: a throttled attempt
    re-renders the form with its message, as 429 with ``Retry-After``."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        response = view(request, *args, **kwargs)
        form = (getattr(response, "context_data", None) or {}).get("form")
        throttled = getattr(form, "throttled", None)
        if throttled is not None:
            response.status_code = 429
            response["Retry-After"] = str(throttled.retry_after)
        return response

    return wrapper


login_view = throttle_status(
    auth_views.LoginView.as_view(
        authentication_form=ThrottledAuthenticationForm, redirect_authenticated_user=True
    )
)
