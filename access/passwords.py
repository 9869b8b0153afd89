"""Who may sign in with a local password (`LOCAL_PASSWORD_LOGIN`), and what the login page offers.

`all` (default): everyone with a usable password. `breakglass`: the team signs in through the identity
provider; a local password is accepted only from an active superuser named in `BREAK_GLASS_USERNAMES`,
and every other username is refused (`REFUSED`) before its password is checked, so nothing is guessed
and nothing is counted. A password session from before the switch ends at its next request, and the
password backend refuses an unlisted username whoever calls it.
Details: docs/security.md, *7. Single sign-on (OpenID Connect) and break-glass passwords*.
"""

from __future__ import annotations

from django.conf import settings
from django.urls import reverse

MODES = ("all", "breakglass")
REFUSED_CODE = "password_login_disabled"


def mode() -> str:
    return str(settings.LOCAL_PASSWORD_LOGIN or "all").strip().lower()


def breakglass_only() -> bool:
    """Anything but `all` restricts: a typo is stopped by the check access.E001, never read as `all`."""
    return mode() != "all"


def break_glass_names() -> set[str]:
    return {str(name).strip() for name in settings.BREAK_GLASS_USERNAMES if str(name).strip()}


def may_try_password(username: str | None) -> bool:
    """Whether a password for `username` is checked at all."""
    return not breakglass_only() or (username or "") in break_glass_names()


def is_break_glass(user) -> bool:
    return bool(
        user is not None
        and user.is_active
        and user.is_superuser
        and user.get_username() in break_glass_names()
    )


def password_session_allowed(user) -> bool:
    """Whether a session signed in with a password may go on for `user` now."""
    return not breakglass_only() or is_break_glass(user)


def provider_name() -> str:
    return str(settings.OIDC_PROVIDER_NAME or "single sign-on")


def refused_message() -> str:
    if settings.OIDC_ENABLED:
        return (
            f"Password sign-in is turned off for this account: use “Sign in with {provider_name()}”. "
            "Only break-glass administrator accounts sign in with a password here."
        )
    return "Password sign-in is turned off for this account: only break-glass administrator accounts use it."


def login_context(request) -> dict:
    """Template context processor: `sso` for the login page (`templates/admin/login.html`)."""
    enabled = bool(settings.OIDC_ENABLED)
    return {
        "sso": {
            "enabled": enabled,
            "provider": provider_name(),
            "url": reverse("oidc_authentication_init") if enabled else "",
            "breakglass_only": breakglass_only(),
        }
    }
