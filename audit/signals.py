"""Creates the "Staff viewers" role after every migrate: read access to the console, nothing more; and
the reviewers' permission `audit.review_run` on the "Reviewers" group (created here) and on "Reasoning
Auditors" (created by `reasoning.signals`, or here when this app's signal comes first).

Staff accounts need the `view_*` permissions of the diagnosis, audit and reasoning models to browse runs
in the admin. This group holds exactly those, except two: `view_reasoning_content` (the auditors' group
has it) and `view_reasoningaccesslog` (the access log is for superusers only). Like the auditor group in
`reasoning.signals`, it is created in `post_migrate` because permissions do not exist during migrations on a
fresh database; the handler creates the permissions of the three apps itself first, so the order in which
Django sends the signal to the apps does not matter, and `get_or_create` + `set` make it idempotent.
"""

from django.apps import apps as global_apps
from django.db.models.signals import post_migrate
from django.dispatch import receiver

STAFF_VIEWERS_GROUP = "Staff viewers"
REVIEWERS_GROUP = "Reviewers"
# The groups that hold `audit.review_run` (audit.models.REVIEW_PERMISSION).
REVIEW_GROUPS = (REVIEWERS_GROUP, "Reasoning Auditors")
CONSOLE_APPS = ("diagnosis", "audit", "reasoning")
# Never granted by this group, whatever models the apps gain later.
WITHHELD_CODENAMES = frozenset({"view_reasoning_content", "view_reasoningaccesslog"})


@receiver(post_migrate, dispatch_uid="audit.create_staff_viewers_group")
def create_staff_viewers_group(sender, using="default", apps=global_apps, **kwargs) -> None:
    if getattr(sender, "name", None) != "audit":
        return
    from django.contrib.auth.management import create_permissions

    for label in CONSOLE_APPS:
        if global_apps.is_installed(label):
            create_permissions(global_apps.get_app_config(label), verbosity=0, using=using, apps=apps)
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    permissions = (
        Permission.objects.using(using)
        .filter(content_type__app_label__in=CONSOLE_APPS, codename__startswith="view_")
        .exclude(codename__in=WITHHELD_CODENAMES)
    )
    group, _ = Group.objects.using(using).get_or_create(name=STAFF_VIEWERS_GROUP)
    group.permissions.set(list(permissions))
    review = Permission.objects.using(using).get(content_type__app_label="audit", codename="review_run")
    for name in REVIEW_GROUPS:
        holder, _ = Group.objects.using(using).get_or_create(name=name)
        holder.permissions.add(review)
