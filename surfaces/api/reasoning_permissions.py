"""The role of the reasoning endpoint: the auditor's permission, checked on the run object.

It is checked on the object on purpose (`ReasoningApi.object_checked`, `core.api.RolePermission`): only
after the session and run were found visible, so the order is 401 → 400 → 404 → 403 and a user without
the permission never learns whether a run exists in a session they cannot see (docs/api.md).
"""

from rest_framework.exceptions import PermissionDenied

from access.stepup import OTP_MESSAGE, OTP_REQUIRED, otp_satisfied
from core.api import RolePermission
from reasoning.models import REASONING_PERMISSION


class CanReadReasoningContent(RolePermission):
    """Allows reading provider reasoning and assistant text: `reasoning.view_reasoning_content` (held by
    the group "Reasoning Auditors"; superusers hold every permission), and, when `REASONING_REQUIRE_OTP`
    is on, a verified second factor (`access.stepup`; 403 `otp_required` otherwise)."""

    message = "Reading reasoning requires the permission reasoning.view_reasoning_content."

    def has_object_permission(self, request, view, obj) -> bool:
        if not self.allows(request.user):
            return False
        if not otp_satisfied(request):
            raise PermissionDenied(OTP_MESSAGE, code=OTP_REQUIRED)
        return True

    def allows(self, user) -> bool:
        return bool(user.is_active and user.has_perm(REASONING_PERMISSION))
