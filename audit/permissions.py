"""DRF permissions of the audit endpoints: session audits (superusers only), evidence and checkpoints
(staff and reasoning auditors) and reviews (`audit.review_run`), checked on the object after it was
found visible where there is one, so the order is 401 → 404 → 403 (see docs/api.md)."""

from rest_framework.permissions import BasePermission


class IsSuperuser(BasePermission):
    message = "Session audits are for superusers only."

    def has_permission(self, request, view) -> bool:
        return bool(request.user and request.user.is_authenticated)

    def has_object_permission(self, request, view, obj) -> bool:
        return bool(request.user.is_active and request.user.is_superuser)


class CanReadEvidence(BasePermission):
    """Evidence bundles and checkpoints: staff (who see every run) and reasoning auditors (who may be
    non-staff and then see their own sessions only). Checked on the run after it was found visible
    (401 → 400 → 404 → 403, as for reasoning); on endpoints without an object, after authentication."""

    message = "Evidence and checkpoints are for staff and reasoning auditors."

    def has_permission(self, request, view) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            return False
        return view.object_checked or _may_read_evidence(user)

    def has_object_permission(self, request, view, obj) -> bool:
        return _may_read_evidence(request.user)


def _may_read_evidence(user) -> bool:
    from reasoning.models import REASONING_PERMISSION

    return bool(user.is_active and (user.is_staff or user.has_perm(REASONING_PERMISSION)))


class CanPlaceLegalHold(BasePermission):
    """Legal holds: `audit.place_legal_hold`, checked on the session after it was found visible."""

    message = "Legal holds need the permission audit.place_legal_hold."

    def has_permission(self, request, view) -> bool:
        return bool(request.user and request.user.is_authenticated)

    def has_object_permission(self, request, view, obj) -> bool:
        return bool(request.user.is_active and request.user.has_perm("audit.place_legal_hold"))


class CanReviewRun(BasePermission):
    """Reviews: `audit.review_run` ("Reviewers", "Reasoning Auditors"), checked on the run after it was
    found visible (401 → 400 → 404 → 403)."""

    message = "Reviews need the permission audit.review_run."

    def has_permission(self, request, view) -> bool:
        return bool(request.user and request.user.is_authenticated)

    def has_object_permission(self, request, view, obj) -> bool:
        from audit.reviews import may_review

        return may_review(request.user)
