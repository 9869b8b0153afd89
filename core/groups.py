"""The role groups: their names, the one spelling code, settings and tests import, and the one way they
are made to hold their permissions (`ensure_groups`, run by `access.groups` after every migrate).

Importing this module loads no Django app (`config.settings` reads `GOVERNED` from it); `ensure_groups`
imports what it needs when it runs. It knows no app of the project: which group holds which permission is
the table its caller passes (`access.groups.GRANTS`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

REASONING_AUDITORS = "Reasoning Auditors"
APPROVERS = "Approvers"
REVIEWERS = "Reviewers"
STAFF_VIEWERS = "Staff viewers"
# The groups whose membership the governance log always records (the default of
# settings.GOVERNED_GROUPS), whether they exist yet or not.
GOVERNED = (REASONING_AUDITORS, APPROVERS, REVIEWERS, STAFF_VIEWERS)


@dataclass(frozen=True, slots=True)
class GroupGrant:
    """What one group is made to hold.

    `views_of`: app labels; when given, the group's permissions are *set* to exactly every `view_*`
    permission of those apps except the codenames in `withheld` (re-synchronised on each migrate).
    `permissions`: "app_label.codename" each *added* in order (what an administrator gave the group
    besides stays)."""

    name: str
    permissions: tuple[str, ...] = ()
    views_of: tuple[str, ...] = ()
    withheld: frozenset[str] = frozenset()

    @property
    def app_labels(self) -> tuple[str, ...]:
        """The apps whose permissions the grant names."""
        named = (p.split(".", 1)[0] for p in self.permissions)
        return tuple(dict.fromkeys((*self.views_of, *named)))


def ensure_groups(grants: Iterable[GroupGrant], *, using: str, apps: Any) -> None:
    """Create each group of `grants` (in order) unless it exists and give it its permissions; idempotent.

    The permissions of the apps named are created first (`create_permissions`), so it may run in any
    app's `post_migrate`, before or after Django's own handler for those apps. `apps`: the registry
    `post_migrate` passes (the migrated state)."""
    from django.apps import apps as global_apps
    from django.contrib.auth.management import create_permissions

    grants = list(grants)
    for label in dict.fromkeys(label for grant in grants for label in grant.app_labels):
        if global_apps.is_installed(label):
            create_permissions(global_apps.get_app_config(label), verbosity=0, using=using, apps=apps)
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    permissions = Permission.objects.using(using)
    for grant in grants:
        group, _ = Group.objects.using(using).get_or_create(name=grant.name)
        if grant.views_of:
            views = permissions.filter(
                content_type__app_label__in=grant.views_of, codename__startswith="view_"
            ).exclude(codename__in=grant.withheld)
            group.permissions.set(list(views))
        for name in grant.permissions:
            app_label, codename = name.split(".")
            group.permissions.add(permissions.get(content_type__app_label=app_label, codename=codename))
