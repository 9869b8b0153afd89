"""The role groups and what each holds, made so after every migrate: one table, one receiver.

A data migration cannot do this on a fresh database: Django creates permissions in its own post_migrate
handler, after all migrations ran. The receiver runs once per migrate (sender = this app) and creates the
permissions it names itself first (`core.groups.ensure_groups`), so the order in which Django sends the
signal to the apps does not matter; `get_or_create`, `add` and `set` make it idempotent.

* "Staff viewers": read access to the console, nothing more: exactly the `view_*` permissions of the
  diagnosis, audit and reasoning models except `view_reasoning_content` (the auditors' group has it) and
  `view_reasoningaccesslog` (the access log is for superusers only), re-synchronised on each migrate.
* "Reviewers" and "Reasoning Auditors": `audit.review_run` (reviews); the auditors also read reasoning.
* "Approvers": deciding tool calls that wait for approval, and reading the run page (the call, its
  arguments, the run's record) before deciding.

Each change is also a governance event (`access.signals`): these groups are governed
(`settings.GOVERNED_GROUPS`) and their permissions sensitive (`SENSITIVE_PERMISSIONS`).
"""

from django.apps import apps as global_apps
from django.db.models.signals import post_migrate
from django.dispatch import receiver

from audit.models import REVIEW_PERMISSION
from core.groups import APPROVERS, REASONING_AUDITORS, REVIEWERS, STAFF_VIEWERS, GroupGrant, ensure_groups
from diagnosis.models import APPROVE_PERMISSION
from reasoning.models import REASONING_PERMISSION

VIEW_RUNS_PERMISSION = "diagnosis.view_diagnosisrun"
CONSOLE_APPS = ("diagnosis", "audit", "reasoning")
# Never granted to "Staff viewers", whatever models the apps gain later.
WITHHELD_CODENAMES = frozenset({"view_reasoning_content", "view_reasoningaccesslog"})

# In the order the groups were first made (and their grants recorded in the governance chain).
GRANTS = (
    GroupGrant(APPROVERS, permissions=(APPROVE_PERMISSION, VIEW_RUNS_PERMISSION)),
    GroupGrant(STAFF_VIEWERS, views_of=CONSOLE_APPS, withheld=WITHHELD_CODENAMES),
    GroupGrant(REVIEWERS, permissions=(REVIEW_PERMISSION,)),
    GroupGrant(REASONING_AUDITORS, permissions=(REVIEW_PERMISSION, REASONING_PERMISSION)),
)


@receiver(post_migrate, dispatch_uid="access.create_role_groups")
def create_role_groups(sender, using="default", apps=global_apps, **kwargs) -> None:
    """With the application's own models, not the migrated state's that `post_migrate` passes: their
    changes fire the governance signals (`access.signals`), so every grant a group receives here is a
    chained PERMISSION_GRANTED, from which `audit.verify.authority` replays who held what (the migrated
    state's models are other classes, which no receiver follows)."""
    if getattr(sender, "name", None) != "access":
        return
    ensure_groups(GRANTS, using=using, apps=global_apps)
