"""The second factor for reading reasoning content (`REASONING_REQUIRE_OTP`).

`otp_satisfied(request)` is the one rule, asked by the reasoning permission (API: 403 `otp_required`)
and again by `access.reasoning_reads.read_reasoning`, so no path reads reasoning on a password alone: a
token issued after a TOTP check, or a session verified by TOTP or by an accepted IdP second factor
(`session_verified`). `token_needs_otp(user)` is the rule for issuing tokens. With the setting off (the
default in development and tests) every request satisfies it.
Details: docs/security.md, *3. Step-up for reasoning* and *2. API tokens*.
"""

from __future__ import annotations

from django.conf import settings

from access import sso
from access.models import ApiToken
from reasoning.models import REASONING_PERMISSION

OTP_REQUIRED = "otp_required"
ISSUE_OTP_MESSAGE = (
    "This user may read reasoning: a token for them is issued only after a TOTP check. Verify a TOTP "
    "code for this session (/admin/verify-otp/) and issue it again, or use manage.py issue_token USER "
    "--otp CODE."
)
OTP_MESSAGE = (
    "Reading reasoning requires a verified second factor: verify a TOTP code for this session, or use "
    "an API token issued after TOTP verification (manage.py issue_token USER --otp CODE)."
)

# The same rule said to a person in the browser (the admin's reasoning panel): what to do there, not
# which command to run on the server.
BROWSER_OTP_MESSAGE = (
    "Reading reasoning needs a second factor for this session. Enter the 6-digit code from your "
    "authenticator app; you come back here and the reasoning opens. No authenticator yet? Ask an "
    "administrator to register one for you."
)


def otp_required() -> bool:
    return bool(settings.REASONING_REQUIRE_OTP)


def otp_satisfied(request) -> bool:
    if not otp_required():
        return True
    auth = getattr(request, "auth", None)
    if isinstance(auth, ApiToken):
        return auth.otp_verified
    return session_verified(request)


def session_verified(request) -> bool:
    """Whether this *session* passed a second factor: a TOTP check (django-otp), or the identity
    provider's accepted `amr`/`acr` at single sign-on (what a token issued now may carry)."""
    user = getattr(request, "user", None)
    is_verified = getattr(user, "is_verified", None)
    if callable(is_verified) and is_verified():
        return True
    return sso.session_second_factor(request)


def token_needs_otp(user) -> bool:
    """Whether a token for `user` may be issued only after a TOTP check (see the module docstring)."""
    return otp_required() and bool(user.is_active and user.has_perm(REASONING_PERMISSION))
