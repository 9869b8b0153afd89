"""`Authorization: Token <token>` for the REST API, the SSE views and the WebSocket handshake.

`authenticate_token(request, token_text)` is the one decision, used by the DRF class
(`ApiTokenAuthentication`) and the WebSocket middleware (`surfaces.chat.auth`):

1. the token is found by its clear prefix and its digest compared in constant time
   (`access.selectors.find_token`); no match is a failure counted in the client address's *anonymous*
   counter (`access.lockout`), which, once locked, refuses that address's unknown tokens only (429
   `locked_out`, uncounted, so no guess is confirmed);
2. a match whose owner is locked out *from this address* is refused (`LockedOut`, 429 `locked_out`) —
   even a valid token, as axes refuses a right password of a locked-out user; other users' failures,
   and anonymous ones, never refuse it;
3. a match that is revoked, expired or whose user is inactive is a failure counted against (that user,
   the address) (a stolen-but-revoked token is guessing too);
4. otherwise the token's user, with the token row as `request.auth` (so `auth.otp_verified` can be read
   by the reasoning step-up, `access.stepup`).

Cost on success: the token's row (one indexed read) and axes' count of (owner, address).

Failures raise `AuthenticationFailed` (401 `authentication_failed`), or `LockedOut` when this failure
reached the limit. Messages say which case, never echoing the token.
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
    username = found.user.get_username()
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
