"""Reads of access governance: a token by its plaintext (constant-time), a user's tokens, the groups and
users that hold a sensitive permission."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.db.models import Q, QuerySet

from access.models import ApiToken
from access.tokens import digest_of, prefix_of


def find_token(*, token: str) -> ApiToken | None:
    """The stored token whose digest is this text's, whatever its state (expired, revoked, inactive
    user: the caller decides). Candidates are found by the clear prefix, the digest compared with
    `hmac.compare_digest`, so no timing reveals how much of a guess was right."""
    digest = digest_of(token)
    found = None
    for candidate in ApiToken.objects.select_related("user").filter(prefix=prefix_of(token)):
        if hmac.compare_digest(candidate.digest, digest):
            found = candidate
    return found


def tokens_of(*, user) -> QuerySet[ApiToken]:
    """A user's tokens, newest first (active, expired and revoked; digests are never shown)."""
    return ApiToken.objects.filter(user=user).order_by("-created_at", "-id")


def sensitive_permissions() -> list[str]:
    """`app_label.codename` of the permissions the governance log and the access review follow."""
    return list(settings.SENSITIVE_PERMISSIONS)


def sensitive_permission_filter() -> Q:
    q = Q(pk__in=[])
    for name in sensitive_permissions():
        app_label, codename = name.split(".", 1)
        q |= Q(content_type__app_label=app_label, codename=codename)
    return q


def permission_name(permission: Permission) -> str:
    return f"{permission.content_type.app_label}.{permission.codename}"


def is_sensitive(permission: Permission) -> bool:
    return permission_name(permission) in sensitive_permissions()


def governed_group_names() -> list[str]:
    """Groups whose membership is always recorded (`GOVERNED_GROUPS`), existing yet or not."""
    return list(settings.GOVERNED_GROUPS)


def is_governed_group(group: Group, granted: list[str] | None = None) -> bool:
    """A group named in `GOVERNED_GROUPS` or holding a sensitive permission (`granted`: its sensitive
    permissions when the caller has them already)."""
    if group.name in governed_group_names():
        return True
    return bool(sensitive_permissions_of_group(group) if granted is None else granted)


def sensitive_rights_of_user(user) -> dict:
    """What sensitive rights `user` holds now: superuser and staff flags, sensitive permissions held
    directly or through a group, and membership of governed groups. Empty values: none."""
    direct = sorted(
        permission_name(p)
        for p in user.user_permissions.select_related("content_type").filter(sensitive_permission_filter())
    )
    via_groups = sorted(
        {
            permission_name(p)
            for p in Permission.objects.select_related("content_type")
            .filter(sensitive_permission_filter())
            .filter(group__user=user)
        }
    )
    governed = governed_group_names()
    groups = sorted(
        user.groups.filter(
            Q(name__in=governed) | Q(permissions__in=Permission.objects.filter(sensitive_permission_filter()))
        )
        .values_list("name", flat=True)
        .distinct()
    )
    return {
        "superuser": bool(user.is_superuser),
        "staff": bool(user.is_staff),
        "sensitivePermissions": sorted(set(direct) | set(via_groups)),
        "directPermissions": direct,
        "groups": groups,
    }


def holds_sensitive_rights(rights: dict) -> bool:
    return bool(rights["superuser"] or rights["staff"] or rights["sensitivePermissions"] or rights["groups"])


def sensitive_permissions_of_group(group: Group) -> list[str]:
    """The sensitive permissions a group grants (a group holding one is a sensitive group)."""
    return sorted(
        permission_name(p)
        for p in group.permissions.select_related("content_type").filter(sensitive_permission_filter())
    )


def holders_now(*, permission: str) -> set[str]:
    """Usernames of active users holding `permission` now: directly, through a group, or as superusers."""
    app_label, codename = permission.split(".", 1)
    User = get_user_model()
    perm = Q(content_type__app_label=app_label, codename=codename)
    ids = Permission.objects.filter(perm).values_list("pk", flat=True)
    users = User.objects.filter(is_active=True).filter(
        Q(is_superuser=True) | Q(user_permissions__in=ids) | Q(groups__permissions__in=ids)
    )
    return set(users.values_list("username", flat=True).distinct())
