"""The second factor for reading reasoning content (`REASONING_REQUIRE_OTP`).

`otp_satisfied(request)` is the one rule, asked by the reasoning permission (API, answering 403
`otp_required`) and again by `reasoning.services.read_reasoning` (API and admin panel), so no path reads
reasoning on a password alone:

* a request authenticated by an API token: the token was issued after a TOTP check (`otp_verified`);
* a session (admin, cookie API calls): django-otp's `OTPMiddleware` says this session passed a TOTP
  check (`request.user.is_verified()`; the admin's *Verify second factor* page, `access.views`).

With `REASONING_REQUIRE_OTP` off (the default in DEBUG/development and tests) every request satisfies it.
"""

from __future__ import annotations

from django.conf import settings

from access.models import ApiToken

OTP_REQUIRED = "otp_required"
OTP_MESSAGE = (
    "Reading reasoning requires a verified second factor: verify a TOTP code for this session, or use "
    "an API token issued after TOTP verification (manage.py issue_token USER --otp CODE)."
)


def otp_required() -> bool:
    return bool(getattr(settings, "REASONING_REQUIRE_OTP", False))


def otp_satisfied(request) -> bool:
    if not otp_required():
        return True
    auth = getattr(request, "auth", None)
    if isinstance(auth, ApiToken):
        return auth.otp_verified
    user = getattr(request, "user", None)
    is_verified = getattr(user, "is_verified", None)
    return bool(callable(is_verified) and is_verified())


def session_verified(request) -> bool:
    """Whether this *session* passed a TOTP check (what a token issued now may carry)."""
    user = getattr(request, "user", None)
    is_verified = getattr(user, "is_verified", None)
    return bool(callable(is_verified) and is_verified())
