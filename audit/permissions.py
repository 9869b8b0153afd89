"""DRF permission of the session-audits endpoint: superusers only, checked on the session object after it
was found visible, so the order is 401 → 404 → 403 (see docs/api.md)."""

from rest_framework.permissions import BasePermission


class IsSuperuser(BasePermission):
    message = "Session audits are for superusers only."

    def has_permission(self, request, view) -> bool:
        return bool(request.user and request.user.is_authenticated)

    def has_object_permission(self, request, view, obj) -> bool:
        return bool(request.user.is_active and request.user.is_superuser)
