"""Creates the approver role after every migrate (as `reasoning.signals` creates the auditors').

Django creates permissions in its own post_migrate handler, after all migrations ran; connecting here
(sender = this app) runs after that handler, so the permission exists; `get_or_create` is idempotent.
Membership of the group is governed (`SENSITIVE_PERMISSIONS` names its permission, so `access.signals`
records every change to it in the governance chain).
"""

from django.apps import apps as global_apps
from django.db.models.signals import post_migrate
from django.dispatch import receiver

APPROVERS_GROUP = "Approvers"
APPROVE_PERMISSION = "diagnosis.approve_tool_call"
# An approver reads the run page (the call, its arguments, the run's record) before deciding.
VIEW_RUNS_PERMISSION = "diagnosis.view_diagnosisrun"


@receiver(post_migrate, dispatch_uid="diagnosis.create_approvers_group")
def create_approvers_group(sender, using="default", apps=global_apps, **kwargs) -> None:
    if getattr(sender, "name", None) != "diagnosis":
        return
    from django.contrib.auth.management import create_permissions

    create_permissions(sender, verbosity=0, using=using, apps=apps)
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    group, _ = Group.objects.using(using).get_or_create(name=APPROVERS_GROUP)
    for name in (APPROVE_PERMISSION, VIEW_RUNS_PERMISSION):
        app_label, codename = name.split(".")
        permission = Permission.objects.using(using).get(content_type__app_label=app_label, codename=codename)
        group.permissions.add(permission)
