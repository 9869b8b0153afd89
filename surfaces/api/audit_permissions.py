"""The roles of the audit endpoints: session audits (superusers only), evidence and checkpoints (staff
and reasoning auditors), legal holds (`audit.place_legal_hold`) and reviews (`audit.review_run`).

Each is a `core.api.RolePermission`: on a view that finds an object (`object_checked`) it is checked on
that object after it was found visible, so the order is 401 → 404 → 403 (see docs/api.md); elsewhere
right after authentication, which `core.api.ApiView` requires before any of them."""

from core.api import RolePermission


class IsSuperuser(RolePermission):
    message = "Session audits are for superusers only."

    def allows(self, user) -> bool:
        return bool(user.is_active and user.is_superuser)


class CanReadEvidence(RolePermission):
    """Evidence bundles and checkpoints: staff (who see every run) and reasoning auditors (who may be
    non-staff and then see their own sessions only)."""

    message = "Evidence and checkpoints are for staff and reasoning auditors."

    def allows(self, user) -> bool:
        from reasoning.models import REASONING_PERMISSION

        return bool(user.is_active and (user.is_staff or user.has_perm(REASONING_PERMISSION)))


class CanPlaceLegalHold(RolePermission):
    """Legal holds: `audit.place_legal_hold`."""

    message = "Legal holds need the permission audit.place_legal_hold."

    def allows(self, user) -> bool:
        return bool(user.is_active and user.has_perm("audit.place_legal_hold"))


class CanReviewRun(RolePermission):
    """Reviews: `audit.review_run` ("Reviewers", "Reasoning Auditors")."""

    message = "Reviews need the permission audit.review_run."

    def allows(self, user) -> bool:
        from audit.write.reviews import may_review

        return may_review(user)
