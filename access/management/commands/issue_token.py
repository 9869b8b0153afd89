"""`manage.py issue_token USERNAME [--ttl-hours H] [--name NAME] [--otp CODE]`: issue an API token and
print it once (it is stored only as a digest). With `--otp`, the code of the user's TOTP device is
checked first and the token carries that verification (it then satisfies `REASONING_REQUIRE_OTP`). While
`REASONING_REQUIRE_OTP` is on, a user who may read reasoning gets a token only with `--otp`."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django_otp.plugins.otp_totp.models import TOTPDevice

from access.services import TokenNeedsOtp, issue_token
from access.stepup import token_needs_otp
from access.totp import VERIFIED, check_code


class Command(BaseCommand):
    help = (
        "Issue an API token for USERNAME and print it once (only its SHA-256 digest is stored). "
        "Expires after --ttl-hours (default API_TOKEN_TTL_HOURS). --otp CODE checks a TOTP code of the "
        "user's device first; the token then carries the verification reading reasoning needs when "
        "REASONING_REQUIRE_OTP is on; while it is on, a user who may read reasoning gets a token only "
        "with --otp. List and revoke tokens in the admin (Access governance › API "
        "tokens) or with the API (/api/auth/tokens/)."
    )

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--ttl-hours", type=float, default=None)
        parser.add_argument("--name", default="", help="a label shown in token lists")
        parser.add_argument("--otp", metavar="CODE", help="a current TOTP code of the user's device")

    def handle(self, *args, **options):
        user = get_user_model().objects.filter(username=options["username"]).first()
        if user is None or not user.is_active:
            raise CommandError(f"no active user {options['username']!r}")
        verified = False
        if options["otp"] is None and token_needs_otp(user):
            raise CommandError(
                f"{user.get_username()} may read reasoning and REASONING_REQUIRE_OTP is on: a token for them "
                "is issued only after a TOTP check; give --otp CODE (a current code of their TOTP device)"
            )
        if options["otp"] is not None:
            devices = TOTPDevice.objects.devices_for_user(user, confirmed=True)
            if not devices.exists():
                raise CommandError(
                    f"{user.get_username()} has no confirmed TOTP device (add one in the admin: OTP_TOTP › "
                    "TOTP devices)"
                )
            checked = check_code(devices, options["otp"])
            if checked.outcome != VERIFIED:
                raise CommandError(f"{user.get_username()}'s TOTP code was refused: {checked.message()}")
            verified = True
        try:
            issued = issue_token(
                user=user,
                actor="manage.py issue_token",
                ttl_hours=options["ttl_hours"],
                name=options["name"],
                otp_verified=verified,
            )
        except TokenNeedsOtp as exc:
            raise CommandError(f"{user.get_username()}: {exc}") from exc
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        token = issued.token
        self.stdout.write(issued.plaintext)
        self.stderr.write(
            f"token {token.prefix}… for {user.get_username()}, expires {token.expires_at.isoformat()}"
            f"{', OTP-verified' if verified else ''} (shown only now; stored as a digest)"
        )
