"""The site's response headers: a strict Content-Security-Policy on every response."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse


def content_security_policy(get_response: Callable[[HttpRequest], HttpResponse]):
    """Every response carries ``settings.CONTENT_SECURITY_POLICY`` (unless a view set its
    own): scripts, styles, images and fetches from this origin only, no inline script or
    style, no plugins, no framing, forms posting only here."""
    policy = settings.CONTENT_SECURITY_POLICY

    def middleware(request: HttpRequest) -> HttpResponse:
        response = get_response(request)
        if policy:
            response.headers.setdefault("Content-Security-Policy", policy)
        return response

    return middleware
