"""URL map: admin, the JSON API (with OpenAPI docs at /api/docs), dashboard, metrics."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

from config.api import api, register_routers

register_routers()

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", api.urls),
]
