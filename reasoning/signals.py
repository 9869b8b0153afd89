"""Creates the auditor role after every migrate, and announces reasoning purges to the layers above.

A data migration cannot do this on a fresh database: Django creates permissions in its own post_migrate
handler, after all migrations ran. Connecting here (sender = this app) runs after that handler, so the
permission exists; `get_or_create` makes it idempotent.

`reasoning_purging` is sent by `reasoning.services.purge_reasoning` before it erases any row, with
`run_ids` (an iterable of the run ids whose rows are in its scope): whoever keeps another copy of those
runs' reasoning above this layer (the runtime's saved resume states) erases it there. It is sent with
`send`, so a receiver that raises stops the purge before anything was erased (fail-closed).
"""

from django.apps import apps as global_apps
from django.db.models.signals import post_migrate
from django.dispatch import Signal, receiver

from reasoning.models import REASONING_PERMISSION

AUDITOR_GROUP = "Reasoning Auditors"

reasoning_purging = Signal()


@receiver(post_migrate, dispatch_uid="reasoning.create_auditor_group")
def create_auditor_group(sender, using="default", apps=global_apps, **kwargs) -> None:
    if getattr(sender, "name", None) != "reasoning":
        return
    from django.contrib.auth.management import create_permissions

    # Make sure the permission exists even if auth's handler has not run for this app yet.
    create_permissions(sender, verbosity=0, using=using, apps=apps)
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    app_label, codename = REASONING_PERMISSION.split(".")
    permission = Permission.objects.using(using).get(content_type__app_label=app_label, codename=codename)
    group, _ = Group.objects.using(using).get_or_create(name=AUDITOR_GROUP)
    group.permissions.add(permission)
