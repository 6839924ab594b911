"""Admin for tenants, users and API tokens (operator-owned rows, editable here).

Tokens are only created by ``manage.py create_api_token`` (the plaintext is shown once,
only its hash is stored), so the admin cannot add one; it can rename or revoke one.
Revoking needs the change permission on tokens; posted without it, an action is a 403
(as in ``queueing.admin``, which this package may not import). The failed-authentication
counts are listed with their lockouts, and resetting one needs the delete permission.
"""

from __future__ import annotations

from django.contrib import admin
from django.contrib.admin import helpers
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group
from django.core.exceptions import BadRequest, PermissionDenied, ValidationError
from django.db.models import Count

from accounts.models import ApiToken, AuthFailure, Tenant, User
from accounts.services import api_token_revoke
from accounts.throttle import auth_failures_reset, locked_until


class RefusedActions:
    """An action the user may not run, posted anyway, is a 403 (Django would ignore it
    silently and answer the list); one posted for ids that are not the table's, a 400."""

    def changelist_view(self, request, extra_context=None):
        action = request.POST.get("action") if request.method == "POST" else None
        declared = {name for _, name, _ in self._get_base_actions()}
        if action in declared and action not in self.get_actions(request):
            raise PermissionDenied
        if action in declared:
            # Selected ids that are no ids of the table: a 400, not Django's 500 from the
            # database (the same check as queueing.admin's).
            for value in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
                try:
                    self.opts.pk.to_python(value)
                except ValidationError:
                    raise BadRequest(f"{value!r} is not an id of this table") from None
        return super().changelist_view(request, extra_context)


@admin.register(Tenant)
class TenantAdmin(RefusedActions, admin.ModelAdmin):
    list_display = ["slug", "name", "users", "created_at"]
    search_fields = ["slug", "name"]
    date_hierarchy = "created_at"

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(user_count=Count("users"))

    def get_readonly_fields(self, request, obj=None):
        # The slug is part of every stage key and storage key of the tenant's inquiries:
        # renaming it would orphan their stored files and procrastinate jobs.
        return ["slug", "created_at"] if obj is not None else ["created_at"]

    @admin.display(description="users", ordering="user_count")
    def users(self, obj: Tenant) -> int:
        return obj.user_count


admin.site.unregister(Group)


@admin.register(Group)
class PgstageGroupAdmin(RefusedActions, GroupAdmin):
    """Django's own group admin, whose delete refused is a 403 as everywhere else."""


@admin.register(User)
class PgstageUserAdmin(RefusedActions, UserAdmin):
    list_display = ["username", "email", "tenant", "is_staff", "is_active", "last_login"]
    list_filter = ["tenant", "is_staff", "is_superuser", "is_active"]
    list_select_related = ["tenant"]
    search_fields = [*UserAdmin.search_fields, "tenant__slug"]
    date_hierarchy = "date_joined"
    fieldsets = (*UserAdmin.fieldsets, ("Tenancy", {"fields": ["tenant"]}))
    add_fieldsets = (*UserAdmin.add_fieldsets, ("Tenancy", {"fields": ["tenant"]}))


@admin.register(ApiToken)
class ApiTokenAdmin(RefusedActions, admin.ModelAdmin):
    list_display = ["prefix", "user", "name", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["revoked_at", "user__tenant"]
    list_select_related = ["user"]
    search_fields = ["prefix", "user__username", "name"]
    date_hierarchy = "created_at"
    fields = ["user", "name", "prefix", "created_at", "last_used_at", "revoked_at"]
    readonly_fields = ["user", "prefix", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    @admin.action(description="Revoke the selected tokens", permissions=["change"])
    def revoke(self, request, queryset):
        revoked = sum(api_token_revoke(token_id=pk) for pk in queryset.values_list("pk", flat=True))
        already = queryset.count() - revoked
        self.message_user(request, f"Revoked {revoked} token(s); {already} were already revoked.")


@admin.register(AuthFailure)
class AuthFailureAdmin(RefusedActions, admin.ModelAdmin):
    """Failed logins and token authentications per client address, and whether each is
    locked out now. *Reset* forgets an address's failures, lifting its lockout at once
    (also ``manage.py reset_auth_failures``); it needs the delete permission."""

    list_display = ["address", "scope", "failures", "window_start", "locked"]
    list_filter = ["scope"]
    search_fields = ["address"]
    ordering = ["-failures", "address"]
    readonly_fields = ["scope", "address", "window_start", "failures"]
    actions = ["reset"]

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    @admin.display(description="locked out until")
    def locked(self, obj: AuthFailure) -> str:
        until = locked_until(obj)
        return "-" if until is None else until.isoformat(timespec="seconds")

    @admin.action(
        description="Reset: forget the failures, lifting the lockout", permissions=["delete"]
    )
    def reset(self, request, queryset):
        pairs = list(queryset.values_list("address", "scope"))
        reset = sum(auth_failures_reset(address=a, scope=s) for a, s in pairs)
        self.message_user(request, f"Reset {reset} address(es); they may sign in again.")
