"""`manage.py user_groups USERNAME [--add GROUP]... [--remove GROUP]... [--staff | --no-staff]`: put a user
in (or take them out of) the role groups, and print the groups they are in afterwards.

The production accounts are made by command (docs/deployment.md, "Accounts"): `createsuperuser
--noinput` for each account (then `changepassword`, or no password for token-only scripts), and this
command for what they may do. Only existing groups are accepted ("Staff viewers", "Reviewers",
"Reasoning Auditors", "Approvers" are created by `migrate`), so a typo never creates a new, unfollowed
group. `--staff` also sets `is_staff` (needed to sign in to the admin console), `--no-staff` clears it.
Each change is a governance event (access.signals) that names `manage.py user_groups` as its actor.
"""

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from access.middleware import acting_as

ACTOR = "manage.py user_groups"


class Command(BaseCommand):
    help = (
        "Add USERNAME to (--add GROUP) or remove them from (--remove GROUP) existing groups such as "
        '"Staff viewers", "Reviewers", "Reasoning Auditors" and "Approvers"; --staff / --no-staff sets '
        "or clears is_staff (the admin console). Prints the user's groups afterwards."
    )

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--add", action="append", default=[], metavar="GROUP")
        parser.add_argument("--remove", action="append", default=[], metavar="GROUP")
        staff = parser.add_mutually_exclusive_group()
        staff.add_argument("--staff", dest="staff", action="store_true", default=None)
        staff.add_argument("--no-staff", dest="staff", action="store_false")

    def handle(self, *args, **options):
        user = get_user_model().objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"no user {options['username']!r} (create it first, docs/deployment.md)")
        wanted = [*options["add"], *options["remove"]]
        groups = {g.name: g for g in Group.objects.filter(name__in=wanted)}
        unknown = sorted(set(wanted) - set(groups))
        if unknown:
            existing = ", ".join(
                repr(n) for n in Group.objects.order_by("name").values_list("name", flat=True)
            )
            raise CommandError(f"no group {', '.join(map(repr, unknown))}; existing groups: {existing}")
        with acting_as(ACTOR), transaction.atomic():
            if options["add"]:
                user.groups.add(*(groups[name] for name in options["add"]))
            if options["remove"]:
                user.groups.remove(*(groups[name] for name in options["remove"]))
            if options["staff"] is not None and user.is_staff != options["staff"]:
                user.is_staff = options["staff"]
                user.save(update_fields=["is_staff"])
        names = ", ".join(user.groups.order_by("name").values_list("name", flat=True)) or "-"
        self.stdout.write(f"{user.get_username()}: staff={'yes' if user.is_staff else 'no'} groups={names}")
