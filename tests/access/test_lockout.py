"""Bounded guessing: after AXES_FAILURE_LIMIT failures the admin login, the REST API, the SSE views and
the WebSocket handshake refuse the client address (and a named user), in the contract's error shape
(429 `locked_out`) or with close code 4429, and the lockout and its lifting are governance events."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from axes.models import AccessAttempt
from channels.testing import WebsocketCommunicator
from django.core.management import call_command
from django.test import AsyncClient

from audit.models import GovernanceEvent, GovernanceEventType
from config.asgi import application
from tests.factories import issue_token, make_recorded_run
from tests.surfaces.chat.transports import TIMEOUT

LIMIT = 3
SESSIONS = "/api/diagnosis/sessions/"
WRONG = "Token deadbeef.this-is-not-a-token"


@pytest.fixture(autouse=True)
def _limit(settings):
    settings.AXES_FAILURE_LIMIT = LIMIT


async def _handshake(headers):
    """A handshake as daphne passes it: with the client's address, and a user agent."""
    comm = WebsocketCommunicator(application, "/ws/chat/", headers=[*headers, (b"user-agent", b"script/1.0")])
    comm.scope["client"] = ("127.0.0.9", 50000)
    connected, _ = await comm.connect(timeout=TIMEOUT)
    assert connected
    return comm


def _lockouts() -> list[GovernanceEvent]:
    return list(GovernanceEvent.objects.filter(event_type=GovernanceEventType.LOCKED_OUT))


def _assert_locked_out(response) -> None:
    assert response.status_code == 429
    body = response.json()
    assert body["error"]["code"] == "locked_out"
    assert "Too many failed authentication attempts" in body["error"]["message"]
    assert int(response["Retry-After"]) == 15 * 60


def test_admin_login_locks_out_after_the_limit_even_with_the_right_password(client, staff_user):
    for _ in range(LIMIT - 1):
        page = client.post("/admin/login/", {"username": "staff", "password": "wrong"})
        assert page.status_code == 200  # the form again, with its error
    locked = client.post("/admin/login/", {"username": "staff", "password": "wrong"})
    assert locked.status_code == 429 and b"Too many failed" in locked.content
    right = client.post("/admin/login/", {"username": "staff", "password": "pw-staff-1"})
    assert right.status_code == 429 and "_auth_user_id" not in client.session
    (event,) = _lockouts()
    assert event.subject_user == "staff" and event.details["clientAddress"] == "127.0.0.1"
    assert event.details["path"] == "/admin/login/"


def test_api_tokens_lock_out_the_address_then_a_valid_token_is_refused_too(api_client, user):
    good = issue_token(user)
    api_client.credentials(HTTP_AUTHORIZATION=WRONG)
    for _ in range(LIMIT - 1):
        assert api_client.get(SESSIONS).status_code == 401
    _assert_locked_out(api_client.get(SESSIONS))
    api_client.credentials(HTTP_AUTHORIZATION=f"Token {good}")
    _assert_locked_out(api_client.get(SESSIONS))  # no guess is confirmed while locked out
    assert len(_lockouts()) == 1  # one event per lockout, not per refused request

    # Lifting it (axes_reset, as an administrator would) is recorded, and the token works again.
    call_command("axes_reset", verbosity=0)
    lifted = GovernanceEvent.objects.filter(event_type=GovernanceEventType.LOCKOUT_LIFTED)
    assert lifted.count() >= 1
    assert api_client.get(SESSIONS).status_code == 200


def test_a_revoked_tokens_owner_is_locked_out_from_other_addresses_too(api_client, user):
    token = issue_token(user)
    from access.models import ApiToken

    ApiToken.objects.filter(prefix=token[:8]).update(revoked_at="2026-01-01T00:00:00Z")
    for i in range(LIMIT):
        api_client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
        api_client.get(SESSIONS, REMOTE_ADDR=f"10.0.0.{i + 1}")
    fresh = issue_token(user)
    api_client.credentials(HTTP_AUTHORIZATION=f"Token {fresh}")
    _assert_locked_out(api_client.get(SESSIONS, REMOTE_ADDR="10.0.0.99"))  # per user, any address
    (event,) = _lockouts()
    assert event.subject_user == user.username


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_sse_locks_out_with_the_error_shape(user):
    run = await sync_to_async(make_recorded_run)(user)
    url = f"/api/diagnosis/{run.session_id}/runs/{run.run_id}/events"
    client = AsyncClient()
    for _ in range(LIMIT - 1):
        assert (await client.get(url, headers={"Authorization": WRONG})).status_code == 401
    _assert_locked_out(await client.get(url, headers={"Authorization": WRONG}))
    good = await sync_to_async(issue_token)(user)
    _assert_locked_out(await client.get(url, headers={"Authorization": f"Token {good}"}))


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_websocket_handshakes_lock_out_with_close_code_4429(user):
    headers = [(b"authorization", WRONG.encode())]
    for _ in range(LIMIT - 1):
        comm = await _handshake(headers)
        assert await comm.receive_output(timeout=TIMEOUT) == {"type": "websocket.close", "code": 4401}
    good = await sync_to_async(issue_token)(user)
    for attempt in (headers, [(b"authorization", f"Token {good}".encode())]):
        comm = await _handshake(attempt)
        frame = await comm.receive_json_from(timeout=TIMEOUT)
        assert frame["type"] == "error" and frame["code"] == "locked_out"
        assert await comm.receive_output(timeout=TIMEOUT) == {"type": "websocket.close", "code": 4429}
    attempt = await AccessAttempt.objects.aget(path_info="/ws/chat/")
    assert attempt.ip_address == "127.0.0.9" and attempt.user_agent == "script/1.0"
    assert len(await sync_to_async(_lockouts)()) == 1
