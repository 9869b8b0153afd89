"""`manage.py user_groups USERNAME [--create] [--add GROUP]... [--remove GROUP]... [--staff | --no-staff]`:
put a user in (or take them out of) the role groups, and print the groups they are in afterwards.

`--create` makes a missing user, with the password in `DJANGO_USER_PASSWORD` (validated) or none;
only existing groups are accepted, so a typo never creates an unfollowed group; `--staff` / `--no-staff`
set or clear `is_staff`. Each change is a governance event naming `manage.py user_groups` as its actor.
Details: docs/deployment.md, *5. Accounts*.
"""

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from access.middleware import acting_as
from core.env import env
from core.groups import APPROVERS, REASONING_AUDITORS, REVIEWERS, STAFF_VIEWERS

ACTOR = "manage.py user_groups"


class Command(BaseCommand):
    help = (
        "Add USERNAME to (--add GROUP) or remove them from (--remove GROUP) existing groups such as "
        f'"{STAFF_VIEWERS}", "{REVIEWERS}", "{REASONING_AUDITORS}" and "{APPROVERS}"; '
        "--staff / --no-staff sets or clears is_staff (the admin console). "
        "Prints the user's groups afterwards."
    )

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--create", action="store_true", help="create the user if there is none")
        parser.add_argument("--add", action="append", default=[], metavar="GROUP")
        parser.add_argument("--remove", action="append", default=[], metavar="GROUP")
        staff = parser.add_mutually_exclusive_group()
        staff.add_argument("--staff", dest="staff", action="store_true", default=None)
        staff.add_argument("--no-staff", dest="staff", action="store_false")

    def handle(self, *args, **options):
        User = get_user_model()
        user = User.objects.filter(username=options["username"]).first()
        if user is None and not options["create"]:
            raise CommandError(f"no user {options['username']!r} (--create makes it)")
        wanted = [*options["add"], *options["remove"]]
        groups = {g.name: g for g in Group.objects.filter(name__in=wanted)}
        unknown = sorted(set(wanted) - set(groups))
        if unknown:
            existing = ", ".join(
                repr(n) for n in Group.objects.order_by("name").values_list("name", flat=True)
            )
            raise CommandError(f"no group {', '.join(map(repr, unknown))}; existing groups: {existing}")
        with acting_as(ACTOR), transaction.atomic():
            if user is None:
                user = self._create(User, options["username"])
            if options["add"]:
                user.groups.add(*(groups[name] for name in options["add"]))
            if options["remove"]:
                user.groups.remove(*(groups[name] for name in options["remove"]))
            if options["staff"] is not None and user.is_staff != options["staff"]:
                user.is_staff = options["staff"]
                user.save(update_fields=["is_staff"])
        names = ", ".join(user.groups.order_by("name").values_list("name", flat=True)) or "-"
        self.stdout.write(f"{user.get_username()}: staff={'yes' if user.is_staff else 'no'} groups={names}")

    def _create(self, User, username: str):
        from django.contrib.auth.password_validation import validate_password
        from django.core.exceptions import ValidationError

        password = env.str("DJANGO_USER_PASSWORD", default="")
        user = User(username=username)
        if password:
            try:
                validate_password(password, user)
            except ValidationError as exc:
                raise CommandError("DJANGO_USER_PASSWORD: " + " ".join(exc.messages)) from exc
            user.set_password(password)
        else:
            user.set_unusable_password()
        user.save()
        return user
