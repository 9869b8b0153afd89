"""Demo accounts for a development machine: `admin`, `staff` and `auditor`, passwords printed once; the
auditor's TOTP device (second factor for reading reasoning, docs/security.md, on under `make run`:
scripts/run-env.sh), its secret printed once; then the runbook corpus (`runbooks`) is loaded into the
knowledge base (idempotent)."""

import base64
import secrets
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django_otp.plugins.otp_totp.models import TOTPDevice

from core.groups import REASONING_AUDITORS, STAFF_VIEWERS

RUNBOOKS_DIR = Path(settings.BASE_DIR) / "runbooks"

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
        auditors = Group.objects.get(name=REASONING_AUDITORS)
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
        # Admin console read access for the non-superuser demo staff (idempotent, also for older accounts).
        viewers = Group.objects.get(name=STAFF_VIEWERS)
        console_staff = [name for name, staff, superuser, _ in DEMO_ACCOUNTS if staff and not superuser]
        for user in User.objects.filter(username__in=console_staff):
            user.groups.add(viewers)
        if created:
            self.stdout.write("Demo accounts (passwords shown only now; `manage.py changepassword` resets):")
            for username, password in created:
                self.stdout.write(f"  {username:8} {password}")
        else:
            self.stdout.write("Demo accounts exist already (admin, staff, auditor).")
        self._auditor_totp(User)
        call_command("load_knowledge", str(RUNBOOKS_DIR), stdout=self.stdout)
        self._demo_runs(User)

    def _auditor_totp(self, User) -> None:
        """The demo auditor's TOTP device, created once; its secret is printed only then."""
        auditor = User.objects.filter(username="auditor").first()
        if auditor is None:
            return
        if TOTPDevice.objects.filter(user=auditor).exists():
            if settings.REASONING_REQUIRE_OTP:
                self.stdout.write(
                    "The auditor reads reasoning after a TOTP code (REASONING_REQUIRE_OTP is on). Its key "
                    "was printed when the device was made; lost? Delete the device (admin › OTP_TOTP › "
                    "TOTP devices) and run bootstrap_demo again for a new one."
                )
            return
        device = TOTPDevice.objects.create(user=auditor, name="demo authenticator", confirmed=True)
        secret = base64.b32encode(device.bin_key).decode().rstrip("=")
        self.stdout.write(
            "TOTP for auditor (shown only now; add it to an authenticator app, or compute a code with "
            "`oathtool --totp -b SECRET`):"
        )
        self.stdout.write(f"  secret {secret}")
        self.stdout.write(f"  {device.config_url}")
        if settings.REASONING_REQUIRE_OTP:
            self.stdout.write(
                "  The step-up is on, as in production: the auditor enters a code at /admin/verify-otp/ "
                "before reading reasoning (REASONING_REQUIRE_OTP=false turns it off for development)."
            )
        else:
            self.stdout.write("  (REASONING_REQUIRE_OTP is off: reasoning is read with a password alone)")

    def _demo_runs(self, User) -> None:
        """On a database without runs, a few runs of the offline demo model for `staff`, so that the
        admin and the trace API have something to show on first start (two answered runbook questions,
        small talk, and a question outside the runbooks that the guards block)."""
        from agent.runtime.demo import DEMO_QUESTIONS, DemoModelClient
        from agent.runtime.executor import run_to_completion
        from diagnosis.models import DiagnosisRun

        staff = User.objects.filter(username="staff").first()
        if staff is None or DiagnosisRun.objects.exists():
            return
        self.stdout.write("Demo runs (offline demo model, user staff):")
        for question in DEMO_QUESTIONS:
            outcome = run_to_completion(user=staff, query=question, client=DemoModelClient(delta_delay=0))
            self.stdout.write(
                f"  {outcome.run_id} {outcome.status} {outcome.release_decision or '-':9} {question}"
            )
        # Anchored now, as a server's checkpointer would within a minute: the development server starts
        # its duties only with its first connection, and `verify_audit` before it would (rightly) report
        # finished runs not anchored within AUDIT_ANCHOR_DEADLINE_SECONDS.
        call_command("audit_checkpoint", stdout=self.stdout)
