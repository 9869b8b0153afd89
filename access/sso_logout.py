"""Signing out of a single sign-on session (`OIDC_LOGOUT`). This service's session always ends. With
`provider` (the default) and a provider that has an `end_session_endpoint`, the browser is then sent there
(OpenID Connect RP-Initiated Logout 1.0: `id_token_hint`, `client_id`, `post_logout_redirect_uri`,
`state`) so the provider's session ends too, and comes back to `/oidc/signed-out/`; otherwise only this
session ends and the signed-out page says so and why (`local`, no endpoint, the provider unreachable).
Details: docs/security.md, *7. Single sign-on (OpenID Connect) and break-glass passwords*, Sign-out.
"""

from __future__ import annotations

import hmac
import logging
import secrets
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import auth
from django.contrib.auth import BACKEND_SESSION_KEY

from access import oidc_provider
from access.sso import BACKEND, ID_TOKEN_KEY, enabled

logger = logging.getLogger(__name__)

PROVIDER, LOCAL = "provider", "local"
MODES = (PROVIDER, LOCAL)
SIGNED_OUT_KEY = "access_sso_signed_out"  # in the new, anonymous session: what the signed-out page says
# Why only this service's session ended (the signed-out page's words for each are in its template).
LOCAL_ONLY, NO_ENDPOINT, UNREACHABLE, UNCONFIRMED = "local", "no_endpoint", "unreachable", "unconfirmed"


def is_sso_session(request) -> bool:
    """Whether `request`'s user signed in through the identity provider (while single sign-on is on)."""
    user = getattr(request, "user", None)
    return bool(
        enabled()
        and user is not None
        and user.is_authenticated
        and request.session.get(BACKEND_SESSION_KEY) == BACKEND
    )


def _end_session_endpoint() -> tuple[str, str]:
    """(the provider's end-session URL, "") or ("", why only this session ends)."""
    if str(settings.OIDC_LOGOUT) != PROVIDER:
        return "", LOCAL_ONLY
    try:
        url = oidc_provider.endpoint("end_session_endpoint")
    except oidc_provider.Unreachable:
        return "", UNREACHABLE
    except oidc_provider.Refused as exc:
        logger.warning("single sign-on sign-out: %s", exc)
        return "", NO_ENDPOINT
    return (url, "") if url else ("", NO_ENDPOINT)


def sign_out(request, *, return_url: str) -> str | None:
    """End `request`'s single sign-on session; the provider's end-session URL to send the browser to
    (coming back to `return_url`), or None when only this session ended (the reason kept for the
    signed-out page)."""
    id_token = request.session.get(ID_TOKEN_KEY)
    user_pk = request.user.pk
    url, why = _end_session_endpoint()
    auth.logout(request)  # flushes the session: a new, anonymous one follows
    state = secrets.token_urlsafe(24) if url else ""
    request.session[SIGNED_OUT_KEY] = {"state": state, "why": why}
    logger.info("single sign-on sign-out user=%s provider=%s", user_pk, why or "sent")
    if not url:
        return None
    params = {"client_id": settings.OIDC_RP_CLIENT_ID, "post_logout_redirect_uri": return_url, "state": state}
    if isinstance(id_token, str) and id_token:
        params["id_token_hint"] = id_token
    return url + ("&" if "?" in url else "?") + urlencode(params)


def signed_out(request, state: str | None) -> str | None:
    """What the signed-out page may say, once: "" = signed out of the provider too (it came back with
    this sign-out's `state`), a reason (above) when only this session ended, None when this browser did
    not just sign out of a single sign-on session here."""
    mark = request.session.pop(SIGNED_OUT_KEY, None)
    if not isinstance(mark, dict):
        return None
    expected = mark.get("state")
    if isinstance(expected, str) and expected:
        same = isinstance(state, str) and hmac.compare_digest(state.encode(), expected.encode())
        return "" if same else UNCONFIRMED
    return str(mark.get("why") or LOCAL_ONLY)
