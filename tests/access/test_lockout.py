"""Bounded guessing without locking out the team (issue 33 item 4, docs/security.md section 1).

A user's passwords, TOTP codes and tokens (whose prefix names their owner) count per (username,
address), each kind in its own counter (tests/access/test_credentials.py); anonymous guesses (unknown
tokens) per address with their own, higher limit; wrong webhook and `/metrics` tokens in counters of
their own. A locked counter refuses only its own attempts, uncounted, in the contract's error shape (429
`locked_out` with `Retry-After`) or a readable page, or close code 4429; the lockout and its lifting are
governance events. All through real requests and the real axes backend.
"""

from __future__ import annotations

import datetime as dt
import time

import pytest
from asgiref.sync import sync_to_async
from axes.models import AccessAttempt
from channels.testing import WebsocketCommunicator
from django.core.management import call_command
from django.test import AsyncClient, Client
from django.utils import timezone
from rest_framework.test import APIClient

from access.models import ApiToken
from audit.models import GovernanceEvent, GovernanceEventType
from config.asgi import application
from tests.factories import issue_token, make_recorded_run, totp_code, totp_device
from tests.surfaces.chat.transports import TIMEOUT

LIMIT = 5  # the defaults: five per (user, address) ...
ANONYMOUS_LIMIT = 8  # ... and more per address for anonymous guesses (20 by default; fewer requests here)
SESSIONS = "/api/diagnosis/sessions/"
WRONG = "Token deadbeef.this-is-not-a-token"
NAT = "203.0.113.7"  # the corporate NAT every request of these tests comes from
COOL_OFF = 15 * 60


@pytest.fixture(autouse=True)
def _limits(settings):
    settings.LOCKOUT_FAILURE_LIMIT = LIMIT
    settings.LOCKOUT_ANONYMOUS_FAILURE_LIMIT = ANONYMOUS_LIMIT


def _api(token: str | None = None, address: str = NAT) -> APIClient:
    client = APIClient(REMOTE_ADDR=address)
    if token:
        client.credentials(HTTP_AUTHORIZATION=token if " " in token else f"Token {token}")
    return client


def _login(username: str, password: str, address: str = NAT, client: Client | None = None):
    client = client or Client(REMOTE_ADDR=address)
    return client, client.post("/admin/login/", {"username": username, "password": password})


def _logged_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def _lockouts() -> list[GovernanceEvent]:
    return list(
        GovernanceEvent.objects.filter(event_type=GovernanceEventType.LOCKED_OUT).order_by("sequence_no")
    )


def _assert_locked_out(response, *, what: str = "", wait: int = COOL_OFF) -> None:
    assert response.status_code == 429, response.content[:300]
    body = response.json()
    assert body["error"]["code"] == "locked_out"
    assert "Too many failed authentication attempts" in body["error"]["message"]
    assert what in body["error"]["message"]
    assert "Try again in" in body["error"]["message"]
    assert wait - 5 <= int(response["Retry-After"]) <= wait


def _failures(**filters) -> int:
    return sum(AccessAttempt.objects.filter(**filters).values_list("failures_since_start", flat=True))


# --------------------------------------------------------------------------------------------------
# The issue's tests
# --------------------------------------------------------------------------------------------------
def test_five_unknown_tokens_then_another_users_token_and_the_admins_password_succeed(user, superuser):
    for _ in range(5):
        assert _api(WRONG).get(SESSIONS).status_code == 401
    assert _api(issue_token(user)).get(SESSIONS).status_code == 200
    client, response = _login("root", "pw-root-1")
    assert response.status_code == 302 and _logged_in(client)
    assert _failures(username="root") == 0  # a correct password is never a failure


def test_anonymous_guesses_lock_only_the_addresss_anonymous_attempts(user, superuser):
    for _ in range(ANONYMOUS_LIMIT - 1):
        assert _api(WRONG).get(SESSIONS).status_code == 401
    _assert_locked_out(_api(WRONG).get(SESSIONS), what="with unknown tokens from this address")
    # Locked: further unknown tokens are refused (429 with Retry-After) and not counted.
    _assert_locked_out(_api("Token 0badc0de.another-guess").get(SESSIONS))
    assert _failures(username=None, ip_address=NAT) == ANONYMOUS_LIMIT
    # Everyone with a credential behind that address still gets in.
    assert _api(issue_token(user)).get(SESSIONS).status_code == 200
    client, response = _login("root", "pw-root-1")
    assert response.status_code == 302 and _logged_in(client)
    # Another address's anonymous guesses are their own.
    assert _api(WRONG, address="198.51.100.1").get(SESSIONS).status_code == 401
    (event,) = _lockouts()
    assert event.subject_user == "" and event.details["counter"] == "anonymous"
    assert event.details["clientAddress"] == NAT and event.details["failures"] == ANONYMOUS_LIMIT


def test_five_wrong_passwords_for_one_user_lock_only_that_user(user, staff_user, superuser):
    for i in range(LIMIT - 1):
        _, page = _login("staff", "wrong")
        assert page.status_code == 200
        left = LIMIT - 1 - i
        assert f"{left} tr{'y' if left == 1 else 'ies'} left" in page.content.decode()  # the form says so
    _, locked = _login("staff", "wrong")
    assert locked.status_code == 429
    page = locked.content.decode()
    what = "with this account&#x27;s password from this address"  # the apostrophe escaped in the page
    assert f"Too many failed authentication attempts {what}" in page
    assert "Try again in 15 minutes" in page and 'href="/admin/login/"' in page  # a way back
    # A styled page of the product (the admin's stylesheet), with the wait on its own line.
    assert "/static/admin/css/base.css" in page and "Diagnosis agent" in page
    assert '<p class="dc-lockout-wait" id="lockout-wait"><strong>Try again in 15 minutes.</strong>' in page
    assert locked["Content-Type"].startswith("text/html") and int(locked["Retry-After"]) <= COOL_OFF

    # That user's right password from that address is refused, and not recorded as a failure.
    client, right = _login("staff", "pw-staff-1")
    assert right.status_code == 429 and not _logged_in(client)
    assert _failures(username="staff") == LIMIT
    # Everyone else behind the address gets in: the admin's password, another user's token.
    client, admin = _login("root", "pw-root-1")
    assert admin.status_code == 302 and _logged_in(client)
    assert _api(issue_token(user)).get(SESSIONS).status_code == 200
    # And so does that user from another address.
    client, elsewhere = _login("staff", "pw-staff-1", address="198.51.100.1")
    assert elsewhere.status_code == 302 and _logged_in(client)
    (event,) = _lockouts()
    assert event.subject_user == "staff" and event.details["clientAddress"] == NAT
    assert event.details["path"] == "/admin/login/" and event.details["counter"] == "password"


# --------------------------------------------------------------------------------------------------
# Named token failures, webhook and metrics counters, TOTP codes
# --------------------------------------------------------------------------------------------------
def test_a_revoked_token_locks_its_owner_at_that_address_only(user, other_user):
    token = issue_token(user)
    ApiToken.objects.filter(prefix=token[:8]).update(revoked_at="2026-01-01T00:00:00Z")
    for _ in range(LIMIT - 1):
        assert _api(token).get(SESSIONS).status_code == 401
    _assert_locked_out(_api(token).get(SESSIONS), what="with this account's API tokens from this address")
    fresh = issue_token(user)
    _assert_locked_out(_api(fresh).get(SESSIONS))  # no guess about this account is confirmed here
    assert _api(fresh, address="198.51.100.1").get(SESSIONS).status_code == 200
    assert _api(issue_token(other_user)).get(SESSIONS).status_code == 200
    assert _api(WRONG).get(SESSIONS).status_code == 401  # the address's anonymous counter is untouched
    (event,) = _lockouts()
    assert event.subject_user == user.username and event.details["counter"] == "token"


def test_an_anonymous_guess_cannot_pick_its_counter_with_a_posted_username(user):
    for i in range(ANONYMOUS_LIMIT):
        _api(WRONG).post(SESSIONS, {"username": f"name{i}"}, format="multipart")
    assert _failures(username=None, ip_address=NAT) == ANONYMOUS_LIMIT
    assert not AccessAttempt.objects.exclude(username=None).exists()
    _assert_locked_out(_api(WRONG).get(SESSIONS))


def test_webhook_guesses_have_their_own_counter(settings, user, superuser):
    settings.AIOPS_WEBHOOK_TOKEN = "the-webhook-token"
    webhook = "/api/aiops/alertmanager"
    statuses = [
        _api("Bearer guess").post(webhook, {}, format="json").status_code for _ in range(ANONYMOUS_LIMIT)
    ]
    assert statuses == [401] * (ANONYMOUS_LIMIT - 1) + [429]
    _assert_locked_out(_api("Bearer guess").post(webhook, {}, format="json"), what="webhook token")
    assert _api(issue_token(user)).get(SESSIONS).status_code == 200
    assert _api(WRONG).get(SESSIONS).status_code == 401  # not the anonymous counter
    _, response = _login("root", "pw-root-1")
    assert response.status_code == 302
    (event,) = _lockouts()
    assert event.details["counter"] == "webhook" and event.subject_user == ""


def test_metrics_guesses_have_their_own_counter_and_the_429_says_how_long(settings, user):
    settings.METRICS_TOKEN = "the-metrics-token"
    scrape = Client(REMOTE_ADDR=NAT, HTTP_AUTHORIZATION="Bearer guess")
    statuses = [scrape.get("/metrics").status_code for _ in range(ANONYMOUS_LIMIT)]
    assert statuses == [401] * (ANONYMOUS_LIMIT - 1) + [429]
    locked = scrape.get("/metrics", HTTP_AUTHORIZATION="Bearer the-metrics-token")
    assert locked.status_code == 429 and int(locked["Retry-After"]) > COOL_OFF - 5
    assert b"wrong metrics token" in locked.content and b"Try again in 15 minutes" in locked.content
    assert _api(issue_token(user)).get(SESSIONS).status_code == 200
    elsewhere = Client(REMOTE_ADDR="198.51.100.1", HTTP_AUTHORIZATION="Bearer the-metrics-token")
    assert elsewhere.get("/metrics").status_code == 200


def test_retry_after_is_the_time_left_not_the_whole_cool_off(user):
    for _ in range(ANONYMOUS_LIMIT):
        _api(WRONG).get(SESSIONS)
    AccessAttempt.objects.update(attempt_time=timezone.now() - dt.timedelta(minutes=10))
    _assert_locked_out(_api(WRONG).get(SESSIONS), wait=5 * 60)
    assert "Try again in 5 minutes" in _api(WRONG).get(SESSIONS).json()["error"]["message"]


def test_wrong_totp_codes_lock_that_user_at_that_address_only(settings, client, auditor, staff_user):
    settings.OTP_TOTP_THROTTLE_FACTOR = 0  # django-otp's delay after a wrong code: tested on its own
    device = totp_device(auditor)
    client.force_login(auditor)
    wrong = "123456" if totp_code(device) != "123456" else "654321"
    page = client.post("/admin/verify-otp/", {"otp_token": wrong}, REMOTE_ADDR=NAT)
    assert page.status_code == 200 and f"{LIMIT - 1} tries left" in page.content.decode()
    for _ in range(LIMIT - 1):
        last = client.post("/admin/verify-otp/", {"otp_token": wrong}, REMOTE_ADDR=NAT)
    assert last.status_code == 429 and int(last["Retry-After"]) <= COOL_OFF
    right = client.post(
        "/admin/verify-otp/", {"otp_token": totp_code(device, at=time.time())}, REMOTE_ADDR=NAT
    )
    assert right.status_code == 429 and _failures(username="auditor (totp code)") == LIMIT  # not counted
    other, response = _login("staff", "pw-staff-1")
    assert response.status_code == 302 and _logged_in(other)


# --------------------------------------------------------------------------------------------------
# Lifting, SSE, WebSocket
# --------------------------------------------------------------------------------------------------
def test_lifting_a_lockout_is_recorded_and_the_counter_works_again(user):
    for _ in range(ANONYMOUS_LIMIT):
        _api(WRONG).get(SESSIONS)
    _assert_locked_out(_api(WRONG).get(SESSIONS))
    call_command("axes_reset", verbosity=0)
    (lifted,) = GovernanceEvent.objects.filter(event_type=GovernanceEventType.LOCKOUT_LIFTED)
    assert lifted.details["counter"] == "anonymous" and lifted.details["failures"] == ANONYMOUS_LIMIT
    assert _api(WRONG).get(SESSIONS).status_code == 401


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_sse_locks_out_anonymous_guesses_with_the_error_shape(user):
    run = await sync_to_async(make_recorded_run)(user)
    url = f"/api/diagnosis/{run.session_id}/runs/{run.run_id}/events"
    client = AsyncClient()
    for _ in range(ANONYMOUS_LIMIT - 1):
        assert (await client.get(url, headers={"Authorization": WRONG})).status_code == 401
    locked = await client.get(url, headers={"Authorization": WRONG})
    assert locked.status_code == 429 and locked.json()["error"]["code"] == "locked_out"
    assert int(locked["Retry-After"]) > COOL_OFF - 5


async def _handshake(headers):
    """A handshake as daphne passes it: with the client's address, and a user agent."""
    comm = WebsocketCommunicator(application, "/ws/chat/", headers=[*headers, (b"user-agent", b"script/1.0")])
    comm.scope["client"] = ("127.0.0.9", 50000)
    connected, _ = await comm.connect(timeout=TIMEOUT)
    assert connected
    return comm


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_websocket_handshakes_lock_out_anonymous_guesses_only(user):
    headers = [(b"authorization", WRONG.encode())]
    for _ in range(ANONYMOUS_LIMIT - 1):
        comm = await _handshake(headers)
        assert await comm.receive_output(timeout=TIMEOUT) == {"type": "websocket.close", "code": 4401}
    comm = await _handshake(headers)
    frame = await comm.receive_json_from(timeout=TIMEOUT)
    assert frame["type"] == "error" and frame["code"] == "locked_out"
    assert await comm.receive_output(timeout=TIMEOUT) == {"type": "websocket.close", "code": 4429}
    # A valid token from the same address is accepted: nothing is sent until the client asks.
    good = await sync_to_async(issue_token)(user)
    comm = await _handshake([(b"authorization", f"Token {good}".encode())])
    assert await comm.receive_nothing(timeout=0.5)
    await comm.disconnect()
    attempt = await AccessAttempt.objects.aget(path_info="/ws/chat/")
    assert attempt.ip_address == "127.0.0.9" and attempt.user_agent == "script/1.0"
    assert attempt.username is None
    assert len(await sync_to_async(_lockouts)()) == 1
