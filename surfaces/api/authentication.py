"""`Authorization: Token <token>` for the REST API, the SSE views and the WebSocket handshake.

`authenticate_token(request, token_text)` is the one decision, used by `ApiTokenAuthentication` (DRF)
and `surfaces.chat.auth`: the token is found by its clear prefix and its digest compared in constant
time; unknown, revoked or expired tokens and inactive users are failures counted by `access.lockout`
(per address, or in the owner's token counter per address, which alone, once locked, refuses their valid
tokens there: 429; their password or TOTP counters never do). Success sets the token row as
`request.auth` (`otp_verified` serves the step-up). Messages say which case, never echoing the token.
Details: docs/security.md, *1. No unlimited guessing* and *2. API tokens*.
"""

from __future__ import annotations

from django.http import HttpRequest
from django.utils import timezone
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed

from access import lockout
from access.models import ApiToken
from access.selectors import find_token
from core.errors import ClientRefusal

KEYWORD = "Token"
INVALID = "Invalid token."
MAX_TOKEN_CHARS = 200


def token_from_header(header: bytes | str | None) -> str | None:
    """The token of an `Authorization: Token <token>` header; None for another scheme or no header.
    A malformed Token header (no token, spaces, too long) raises `AuthenticationFailed`."""
    if not header:
        return None
    text = header.decode("latin1") if isinstance(header, bytes) else header
    parts = text.split()
    if not parts or parts[0].lower() != KEYWORD.lower():
        return None
    if len(parts) != 2 or len(parts[1]) > MAX_TOKEN_CHARS:
        raise AuthenticationFailed("Invalid token header: expected `Token <token>`.")
    return parts[1]


def _fail(request: HttpRequest, detail: str, username: str | None = None) -> None:
    lockout.refuse(request, username=username)  # LockedOut while (username or none, address) is locked
    raise AuthenticationFailed(detail)


def authenticate_token(request: HttpRequest, token: str) -> tuple[object, ApiToken]:
    """(user, token row) for `token`, or `AuthenticationFailed` / `LockedOut` (see the module)."""
    found = find_token(token=token)
    if found is None:
        _fail(request, INVALID)  # the address's anonymous counter
    username = lockout.counter_name(found.user.get_username(), lockout.TOKEN)
    if lockout.is_locked(request, username=username):
        raise lockout.LockedOut(request, username)
    if found.revoked_at is not None:
        _fail(request, "Token revoked.", username)
    if found.expires_at <= timezone.now():
        _fail(request, "Token expired.", username)
    if not found.user.is_active:
        _fail(request, "User inactive or deleted.", username)
    return found.user, found


class ApiTokenAuthentication(BaseAuthentication):
    """DRF authentication by `access.models.ApiToken` (replaces DRF's plaintext `TokenAuthentication`)."""

    keyword = KEYWORD

    def authenticate(self, request):
        token = token_from_header(get_authorization_header(request))
        if token is None:
            return None
        try:
            return authenticate_token(getattr(request, "_request", request), token)
        except ClientRefusal as exc:  # locked out: DRF must see an APIException
            # core.api imports rest_framework.views, which imports this class
            # (DEFAULT_AUTHENTICATION_CLASSES): imported here, not at the top, to keep that import acyclic.
            from core.api import Refused

            raise Refused(exc) from exc

    def authenticate_header(self, request) -> str:
        return self.keyword
