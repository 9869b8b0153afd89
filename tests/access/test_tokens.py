"""API tokens: stored as digests only, shown once, expiring, revocable by their owner (API) and by
admins (admin action), and working alike on REST, SSE and the WebSocket handshake; the command that
issues them; the migration of former DRF tokens."""

from __future__ import annotations

import datetime as dt
import hashlib
from io import StringIO

import pytest
from asgiref.sync import sync_to_async
from django.core.management import call_command
from django.db import connection
from django.test import AsyncClient
from django.utils import timezone

from access.models import ApiToken
from access.services import issue_token as issue
from audit.models import GovernanceEvent, GovernanceEventType
from tests.factories import issue_token, make_recorded_run
from tests.surfaces.chat.transports import TIMEOUT, ws_connect

SESSIONS = "/api/diagnosis/sessions/"


def _all_stored_text() -> str:
    """Every column of every token row, as stored."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM access_api_token")
        return repr(cursor.fetchall())


def test_a_token_is_stored_only_as_its_digest_and_shown_once(db, user):
    issued = issue(user=user, actor="tests")
    stored = _all_stored_text()
    secret = issued.plaintext.split(".", 1)[1]
    assert issued.plaintext not in stored and secret not in stored
    assert issued.token.digest == hashlib.sha256(issued.plaintext.encode()).hexdigest()
    assert issued.token.prefix == issued.plaintext[:8]
    ttl = issued.token.expires_at - issued.token.created_at
    assert ttl == dt.timedelta(hours=24 * 30)  # API_TOKEN_TTL_HOURS default


def test_rest_accepts_a_valid_token_and_refuses_expired_revoked_and_inactive(api_client, user):
    valid, expired, revoked = (issue_token(user) for _ in range(3))
    ApiToken.objects.filter(prefix=expired[:8]).update(expires_at=timezone.now() - dt.timedelta(seconds=1))
    issue_revoked = ApiToken.objects.get(prefix=revoked[:8])
    from access.services import revoke_token

    assert revoke_token(token=issue_revoked, actor="tests")
    api_client.credentials(HTTP_AUTHORIZATION=f"Token {valid}")
    assert api_client.get(SESSIONS).status_code == 200
    for token, message in ((expired, "Token expired."), (revoked, "Token revoked.")):
        api_client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
        response = api_client.get(SESSIONS)
        assert response.status_code == 401
        assert response.json() == {"error": {"code": "authentication_failed", "message": message}}
        assert response["WWW-Authenticate"] == "Token"
    # A token of the right prefix with a wrong secret is simply invalid.
    api_client.credentials(HTTP_AUTHORIZATION=f"Token {valid[:9]}{'A' * 43}")
    assert api_client.get(SESSIONS).json()["error"]["message"] == "Invalid token."


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_sse_accepts_a_valid_token_and_refuses_expired_and_revoked(user):
    run = await sync_to_async(make_recorded_run)(user)
    url = f"/api/diagnosis/{run.session_id}/runs/{run.run_id}/events"
    valid, expired, revoked = [await sync_to_async(issue_token)(user) for _ in range(3)]
    await ApiToken.objects.filter(prefix=expired[:8]).aupdate(
        expires_at=timezone.now() - dt.timedelta(hours=1)
    )
    await ApiToken.objects.filter(prefix=revoked[:8]).aupdate(revoked_at=timezone.now())
    ok = await AsyncClient().get(url, headers={"Authorization": f"Token {valid}"})
    assert ok.status_code == 200 and ok["Content-Type"].startswith("text/event-stream")
    async for _chunk in ok.streaming_content:
        pass
    for token in (expired, revoked):
        refused = await AsyncClient().get(url, headers={"Authorization": f"Token {token}"})
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "authentication_failed"


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_websocket_accepts_a_valid_token_and_refuses_expired_and_revoked(user):
    valid, expired, revoked = [await sync_to_async(issue_token)(user) for _ in range(3)]
    await ApiToken.objects.filter(prefix=expired[:8]).aupdate(
        expires_at=timezone.now() - dt.timedelta(hours=1)
    )
    await ApiToken.objects.filter(prefix=revoked[:8]).aupdate(revoked_at=timezone.now())
    comm = await ws_connect(headers=[(b"authorization", f"Token {valid}".encode())])
    await comm.send_to(text_data='{"type": "dance"}')
    assert (await comm.receive_json_from(timeout=TIMEOUT))["code"] == "unknown_type"  # authenticated
    await comm.disconnect()
    for token in (expired, revoked):
        comm = await ws_connect(headers=[(b"authorization", f"Token {token}".encode())])
        assert await comm.receive_output(timeout=TIMEOUT) == {"type": "websocket.close", "code": 4401}


def test_owner_lists_issues_and_revokes_tokens_through_the_api(api_client, user, other_user):
    api_client.force_login(user)
    created = api_client.post("/api/auth/tokens/", {"name": "ci", "ttlHours": 2}, format="json")
    assert created.status_code == 201
    body = created.json()
    token = body.pop("token")
    assert body["name"] == "ci" and body["prefix"] == token[:8] and body["otpVerified"] is False
    assert body["active"] is True
    listed = api_client.get("/api/auth/tokens/").json()
    assert [t["id"] for t in listed] == [body["id"]]
    assert "token" not in listed[0] and "digest" not in listed[0]

    # The new token works, and cannot mint further tokens.
    script = type(api_client)()
    script.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert script.get(SESSIONS).status_code == 200
    assert script.post("/api/auth/tokens/", {}, format="json").status_code == 403

    # Another user's token does not exist for this user.
    foreign = issue(user=other_user, actor="tests").token
    assert api_client.post(f"/api/auth/tokens/{foreign.pk}/revoke").status_code == 404

    revoked = api_client.post(f"/api/auth/tokens/{body['id']}/revoke")
    assert revoked.status_code == 200 and revoked.json()["active"] is False
    assert script.get(SESSIONS).status_code == 401
    kinds = list(
        GovernanceEvent.objects.filter(subject_user=user.username).values_list("event_type", flat=True)
    )
    assert kinds == [GovernanceEventType.TOKEN_ISSUED, GovernanceEventType.TOKEN_REVOKED]


def test_admins_see_every_token_and_revoke_them(client, superuser, user):
    issued = issue(user=user, actor="tests")
    client.force_login(superuser)
    page = client.get("/admin/access/apitoken/")
    assert page.status_code == 200 and issued.token.prefix in page.content.decode()
    assert issued.token.digest not in page.content.decode()
    response = client.post(
        "/admin/access/apitoken/",
        {"action": "revoke", "_selected_action": [issued.token.pk]},
        follow=True,
    )
    assert response.status_code == 200
    issued.token.refresh_from_db()
    assert issued.token.revoked_at is not None and issued.token.revoked_by == superuser.username


def test_issue_token_command_prints_the_token_once_with_its_ttl(api_client, user):
    out, err = StringIO(), StringIO()
    call_command("issue_token", user.username, "--ttl-hours", "1", stdout=out, stderr=err)
    token = out.getvalue().strip()
    row = ApiToken.objects.get(prefix=token[:8])
    assert dt.timedelta(minutes=59) < row.expires_at - timezone.now() <= dt.timedelta(hours=1)
    assert token not in err.getvalue() and row.prefix in err.getvalue()
    api_client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert api_client.get(SESSIONS).status_code == 200


@pytest.mark.django_db(transaction=True)
def test_former_drf_tokens_are_hashed_in_and_their_plaintext_erased(user):
    """The data migration (access 0002) on a database that still has DRF's `authtoken_token`."""
    import importlib

    from django.apps import apps as global_apps
    from rest_framework.test import APIClient

    migration = importlib.import_module("access.migrations.0002_import_drf_tokens")
    key = "0123456789abcdef0123456789abcdef01234567"  # DRF's format: 40 hex characters
    with connection.cursor() as cursor:
        key_column = connection.ops.quote_name("key")
        cursor.execute(
            f"CREATE TABLE authtoken_token ({key_column} varchar(40) PRIMARY KEY, user_id integer, "
            "created datetime)"
        )
        cursor.execute(
            "INSERT INTO authtoken_token VALUES (%s, %s, %s)", [key, user.pk, "2026-01-02 03:04:05"]
        )
    try:
        with connection.schema_editor() as editor:
            migration.import_drf_tokens(global_apps, editor)
        with connection.cursor() as cursor:
            cursor.execute("SELECT COUNT(*) FROM authtoken_token")
            assert cursor.fetchone()[0] == 0  # no plaintext key left
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE authtoken_token")
    row = ApiToken.objects.get(user=user)
    assert row.imported and row.prefix == key[:8] and key not in _all_stored_text()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert client.get(SESSIONS).status_code == 200  # it keeps working until it expires
