from __future__ import annotations

from django.contrib import admin
from django.contrib.auth.admin import UserAdmin

from accounts.models import ApiToken, Tenant, User


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]


@admin.register(User)
class PgstageUserAdmin(UserAdmin):
    list_display = ["username", "tenant", "is_staff", "is_active"]
    list_filter = ["tenant", "is_staff", "is_active"]
    fieldsets = (*UserAdmin.fieldsets, ("Tenancy", {"fields": ["tenant"]}))


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["prefix", "user", "name", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["revoked_at"]
    search_fields = ["prefix", "user__username"]
    readonly_fields = ["prefix", "token_hash", "created_at", "last_used_at"]
