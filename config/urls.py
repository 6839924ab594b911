"""URL map: admin, the JSON API (with OpenAPI docs at /api/docs), dashboard, metrics,
health (/healthz, /readyz)."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponsePermanentRedirect
from django.templatetags.static import static
from django.urls import path
from django.views.generic import RedirectView

from accounts.forms import ThrottledAdminAuthenticationForm
from accounts.views import login_view, throttle_status
from config.api import api, register_routers
from config.dashboard import (
    analysis_detail_view,
    analysis_submit_view,
    dashboard_view,
    inquiry_detail_view,
    inquiry_file_view,
    inquiry_submit_view,
    workers_view,
)
from queueing.health import healthz_view, readyz_view
from queueing.metrics import metrics_view

register_routers()
admin.site.site_header = admin.site.site_title = "pgstage admin"
admin.site.index_title = "Operations"
# Failed logins count against the client's address on both login pages.
admin.site.login_form = ThrottledAdminAuthenticationForm
# The app list beside every page takes a fifth of a 1,400 px screen from the tables; it
# is one click away (Home).
admin.site.enable_nav_sidebar = False


def favicon_view(request: HttpRequest) -> HttpResponsePermanentRedirect:
    """Browsers ask for ``/favicon.ico`` on pages that name no icon (the API's docs, a
    JSON answer opened in a tab): the site's icon, never a 404."""
    return HttpResponsePermanentRedirect(static("pgstage/favicon.svg"))


urlpatterns = [
    path("", RedirectView.as_view(pattern_name="dashboard"), name="home"),
    path("favicon.ico", favicon_view, name="favicon"),
    # Before the admin's own URLs, which would answer this path with a plain 200.
    path("admin/login/", throttle_status(admin.site.login)),
    path("admin/", admin.site.urls),
    path("api/", api.urls),
    path("dashboard/", dashboard_view, name="dashboard"),
    path("dashboard/analyses", analysis_submit_view, name="analysis-submit"),
    path("dashboard/analyses/<int:job_id>", analysis_detail_view, name="analysis-detail"),
    path("dashboard/inquiries", inquiry_submit_view, name="inquiry-submit"),
    path("dashboard/inquiries/<int:anfrage_id>", inquiry_detail_view, name="inquiry-detail"),
    path(
        "dashboard/inquiries/<int:anfrage_id>/files/<int:file_id>",
        inquiry_file_view,
        name="inquiry-file",
    ),
    path("dashboard/workers", workers_view, name="dashboard-workers"),
    path("accounts/login/", login_view, name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(next_page="login"), name="logout"),
    path("metrics", metrics_view, name="metrics"),
    path("healthz", healthz_view, name="healthz"),
    path("readyz", readyz_view, name="readyz"),
]
