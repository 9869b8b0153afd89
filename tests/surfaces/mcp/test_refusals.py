"""What `/mcp` checks before the MCP transport sees a request (`surfaces.mcp.asgi`): the Host and Origin
by Django's rule, the API token by the REST API's decision with its lockout counters, and the user's
rate (`MCP_SERVER_THROTTLE_RATE`)."""

from __future__ import annotations

import pytest

from surfaces.mcp.asgi import Refusal, authenticate, check_origin
from tests.surfaces.mcp.support import token_of

pytestmark = pytest.mark.django_db


def _scope(authorization: str | None = None, **headers: str) -> dict:
    pairs = [(b"host", b"127.0.0.1:8000")]
    if authorization is not None:
        pairs.append((b"authorization", authorization.encode()))
    pairs += [(name.encode(), value.encode()) for name, value in headers.items()]
    return {"type": "http", "path": "/mcp", "client": ("127.0.0.1", 5000), "headers": pairs}


def _refusal(scope) -> Refusal:
    with pytest.raises(Refusal) as refused:
        authenticate(scope)
    return refused.value


def test_each_user_has_their_own_rate_and_is_told_when_to_come_back(settings, user, other_user):
    settings.MCP_SERVER_THROTTLE_RATE = "2/min"
    mine, theirs = token_of(user), token_of(other_user)

    assert authenticate(_scope(f"Bearer {mine}")) == user
    assert authenticate(_scope(f"Token {mine}")) == user  # the REST API's spelling too
    over = _refusal(_scope(f"Bearer {mine}"))
    assert (over.status, over.outcome) == (429, "throttled") and 1 <= over.wait <= 60
    assert authenticate(_scope(f"Bearer {theirs}")) == other_user

    settings.MCP_SERVER_THROTTLE_RATE = ""  # off
    assert authenticate(_scope(f"Bearer {mine}")) == user


def test_unknown_tokens_are_counted_by_the_lockout_until_the_address_is_locked(settings, user):
    settings.LOCKOUT_ANONYMOUS_FAILURE_LIMIT = 3
    missing = _refusal(_scope())
    assert (missing.status, missing.outcome) == (401, "unauthenticated")  # no token: nothing to count
    for _ in range(2):
        wrong = _refusal(_scope("Bearer " + "0" * 40))
        assert (wrong.status, wrong.message) == (401, "Invalid token.")
    locked = _refusal(_scope("Bearer " + "1" * 40))  # the third failure locks the address at once
    assert (locked.status, locked.outcome) == (429, "locked_out") and locked.wait
    # The lockout of unknown tokens never refuses a user's valid token.
    assert authenticate(_scope(f"Bearer {token_of(user)}")) == user


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"origin": "http://127.0.0.1:8000"}, None),
        ({}, None),
        ({"origin": "http://evil.example"}, 403),
        ({"origin": "null"}, 403),
    ],
)
def test_a_foreign_origin_or_host_is_refused(settings, headers, status):
    settings.ALLOWED_HOSTS = ["127.0.0.1"]
    scope = _scope(**headers)
    if status is None:
        check_origin(scope)
    else:
        with pytest.raises(Refusal) as refused:
            check_origin(scope)
        assert refused.value.status == status
    rebound = dict(scope, headers=[(b"host", b"attacker.example")])
    with pytest.raises(Refusal) as refused:
        check_origin(rebound)
    assert refused.value.status == 400
