"""Admin of API tokens: every user's tokens, never their text or digest; superusers revoke them (the
`revoke` action, `access.services.revoke_token`, one governance event each). Tokens are issued by
`manage.py issue_token` or `POST /api/auth/tokens/`, not here, so the plaintext is never in a page
an admin could reload. The access review page (`access.review`) hangs under this app. The admin's login
form says how many tries are left before a lockout (`surfaces.admin.login_form.LoginForm`). Superusers see
which account each single sign-on identity (issuer, subject) signs in to (`OidcIdentityAdmin`, read-only)."""

from __future__ import annotations

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.template.response import TemplateResponse
from django.urls import path

from access.models import ApiToken, OidcIdentity
from access.review import access_review, parse_since, to_csv
from access.services import revoke_token
from core.admin_base import ReadOnlyAdmin
from surfaces.admin.login_form import LoginForm

admin.site.login_form = LoginForm


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnlyAdmin):
    list_display = (
        "prefix",
        "user",
        "name",
        "otp_verified",
        "created_at",
        "expires_at",
        "revoked_at",
        "revoked_by",
        "imported",
    )
    list_filter = ("otp_verified", "imported", "revoked_at")
    search_fields = ("=prefix", "user__username", "name")
    exclude = ("digest",)
    ordering = ("-created_at",)
    actions = ["revoke"]

    def has_module_permission(self, request) -> bool:
        return request.user.is_active and request.user.is_superuser

    def has_view_permission(self, request, obj=None) -> bool:
        return request.user.is_active and request.user.is_superuser

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request, queryset):
        if not request.user.is_superuser:
            raise PermissionDenied
        revoked = sum(revoke_token(token=t, actor=request.user.get_username()) for t in queryset)
        self.message_user(request, f"{revoked} token(s) revoked.", messages.SUCCESS)

    def get_actions(self, request):
        actions = admin.ModelAdmin.get_actions(self, request)
        actions.pop("delete_selected", None)
        return actions

    def get_urls(self):
        return [
            path(
                "access-review/",
                self.admin_site.admin_view(self.access_review_view),
                name="access_review",
            ),
            *super().get_urls(),
        ]

    def access_review_view(self, request):
        """Per sensitive permission: holders during the period, users, grants never used (`?since=`)."""
        if not (request.user.is_active and request.user.is_superuser):
            raise PermissionDenied
        try:
            since = parse_since(request.GET.get("since"))
        except ValueError:
            since = parse_since(None)
            self.message_user(
                request, "Not an ISO date or datetime; showing the last 90 days.", messages.WARNING
            )
        review = access_review(since=since)
        if request.GET.get("format") == "csv":
            response = HttpResponse(to_csv(review), content_type="text/csv; charset=utf-8")
            response["Content-Disposition"] = 'attachment; filename="access-review.csv"'
            return response
        context = {
            **self.admin_site.each_context(request),
            "title": "Access review",
            "review": review,
            "since": since,
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/access/access_review.html", context)


@admin.register(OidcIdentity)
class OidcIdentityAdmin(ReadOnlyAdmin):
    """The OpenID Connect identities and the accounts they sign in to (`access.oidc`); superusers only."""

    list_display = ("user", "subject", "issuer", "created_at", "last_login_at")
    list_filter = ("issuer",)
    search_fields = ("=subject", "user__username")
    ordering = ("-id",)

    def has_module_permission(self, request) -> bool:
        return request.user.is_active and request.user.is_superuser

    def has_view_permission(self, request, obj=None) -> bool:
        return request.user.is_active and request.user.is_superuser
