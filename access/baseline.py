"""The rights every user and group held when write authentication began (`RIGHTS_BASELINE`).

The governance chain records every change the application makes to sensitive rights from the moment
it existed; rights granted before that (a superuser created before the chain, a group's permissions
from an older version) appear in no event. `audit.verify.authority` replays the chain to decide who held a
right at each point, so a store upgraded to write authentication needs one starting point: the rights
as the tables hold them at the upgrade, chained (and tagged) once, right after the upgrade's
`WRITE_AUTH_STARTED` (`audit.transparency.adoption`). A new installation needs none: its chain records
every right from the first migration on. Written by the migration `access.0004_rights_baseline`."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from access.selectors import sensitive_permissions_of_group, sensitive_rights_of_user
from audit.models import GovernanceEvent
from audit.models import GovernanceEventType as T
from audit.write import record_governance_event


def needed() -> bool:
    """Whether the store was upgraded to write authentication and has no baseline yet."""
    events = GovernanceEvent.objects
    return (
        events.filter(event_type=T.WRITE_AUTH_STARTED).exists()
        and not events.filter(event_type=T.RIGHTS_BASELINE).exists()
    )


def rights_now() -> dict:
    """Every user's sensitive rights (superuser, active, sensitive permissions held directly, governed
    groups) and every group's sensitive permissions, as the tables hold them now."""
    groups = {}
    for group in Group.objects.order_by("name"):
        granted = sensitive_permissions_of_group(group)
        if granted:
            groups[group.name] = granted
    users = {}
    for user in get_user_model().objects.order_by("pk"):
        rights = sensitive_rights_of_user(user)
        if rights["superuser"] or rights["directPermissions"] or rights["groups"]:
            users[user.get_username()] = {
                "superuser": rights["superuser"],
                "active": bool(user.is_active),
                "permissions": rights["directPermissions"],
                "groups": rights["groups"],
            }
    return {"users": users, "groups": groups}


def record_baseline(*, actor: str = "migrate") -> GovernanceEvent | None:
    """Chain the baseline when `needed()`; None otherwise."""
    if not needed():
        return None
    return record_governance_event(event_type=T.RIGHTS_BASELINE, actor=actor, details=rights_now())
