"""Demo accounts for a development machine: `admin`, `staff` and `auditor`, passwords printed once;
then the runbook corpus (`diagnosis/runbooks`) is loaded into the knowledge base (idempotent)."""

import secrets
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from reasoning.signals import AUDITOR_GROUP

RUNBOOKS_DIR = Path(__file__).resolve().parents[2] / "runbooks"

DEMO_ACCOUNTS = (
    # username, is_staff, is_superuser, auditor
    ("admin", True, True, False),
    ("staff", True, False, False),
    ("auditor", True, False, True),
)


class Command(BaseCommand):
    help = "Create the demo accounts (DEBUG only); each new password is printed once and never stored."

    def handle(self, *args, **options):
        if not settings.DEBUG:
            raise CommandError("bootstrap_demo only runs with DEBUG on; it creates well-known accounts.")
        User = get_user_model()
        auditors = Group.objects.get(name=AUDITOR_GROUP)
        created = []
        for username, is_staff, is_superuser, auditor in DEMO_ACCOUNTS:
            if User.objects.filter(username=username).exists():
                continue
            password = secrets.token_urlsafe(12)
            user = User.objects.create_user(
                username, password=password, is_staff=is_staff, is_superuser=is_superuser
            )
            if auditor:
                user.groups.add(auditors)
            created.append((username, password))
        if created:
            self.stdout.write("Demo accounts (passwords shown only now; `manage.py changepassword` resets):")
            for username, password in created:
                self.stdout.write(f"  {username:8} {password}")
        else:
            self.stdout.write("Demo accounts exist already (admin, staff, auditor).")
        call_command("load_knowledge", str(RUNBOOKS_DIR), stdout=self.stdout)
