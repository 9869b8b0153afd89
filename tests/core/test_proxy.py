"""Only the proxy may speak for clients, and the chat WebSocket only over TLS (`core.proxy`), through
the real ASGI application (`config.asgi.application`) with the peer address each scope names.

* a failed token authentication from a peer outside `TRUSTED_PROXIES` is counted (axes' row) under the
  peer's own address even with `X-Forwarded-For` and `TRUSTED_PROXY_COUNT=1`; from a trusted proxy the
  forwarded address counts;
* with `WEBSOCKET_REQUIRE_TLS` a handshake is closed with 4426 unless it arrived over TLS: at the socket
  (`wss`), or per `X-Forwarded-Proto: https` from a trusted proxy (from any other peer that header is
  ignored); such a handshake goes on to authentication (anonymous: 4401);
* `TRUSTED_PROXIES` entries: CIDRs, IPv4-mapped IPv6 peers, no peer at all, and the system check that
  refuses a typo;
* `/healthz` answers without authentication and names nothing but components and up/down, and does
  not start the duties itself.
"""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async
from axes.models import AccessAttempt
from channels.testing import ApplicationCommunicator

from agent.checks import check_trusted_proxies
from agent.runtime import supervisor
from config.asgi import application
from core.proxy import CLOSE_TLS_REQUIRED, is_trusted_proxy

pytestmark = [pytest.mark.django_db(transaction=True)]

TIMEOUT = 10


def _http_scope(peer: str, path: str, headers: list[tuple[bytes, bytes]]) -> dict:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver"), *headers],
        "client": (peer, 40000),
        "server": ("127.0.0.1", 8001),
    }


async def _get(peer: str, path: str, headers: list[tuple[bytes, bytes]]) -> tuple[int, bytes]:
    comm = ApplicationCommunicator(application, _http_scope(peer, path, headers))
    await comm.send_input({"type": "http.request", "body": b"", "more_body": False})
    start = await comm.receive_output(TIMEOUT)
    body = b""
    while True:
        message = await comm.receive_output(TIMEOUT)
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await comm.wait(TIMEOUT)
    return start["status"], body


async def _ws_close_code(peer: str | None, headers: list[tuple[bytes, bytes]], scheme: str = "ws") -> int:
    scope = {
        "type": "websocket",
        "asgi": {"version": "3.0"},
        "scheme": scheme,
        "path": "/ws/chat/",
        "raw_path": b"/ws/chat/",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1"), (b"origin", b"http://127.0.0.1"), *headers],
        "subprotocols": [],
        "client": (peer, 40000) if peer else None,
        "server": ("127.0.0.1", 8001),
    }
    comm = ApplicationCommunicator(application, scope)
    await comm.send_input({"type": "websocket.connect"})
    assert (await comm.receive_output(TIMEOUT))["type"] == "websocket.accept"
    closed = await comm.receive_output(TIMEOUT)
    assert closed["type"] == "websocket.close"
    await comm.send_input({"type": "websocket.disconnect", "code": closed["code"]})
    await comm.wait(TIMEOUT)
    await supervisor.stop_background()
    return closed["code"]


@pytest.fixture
def proxied(settings):
    settings.TRUSTED_PROXIES = ["127.0.0.1/32", "10.20.0.0/16"]
    settings.TRUSTED_PROXY_COUNT = 1
    settings.LOCKOUT_ANONYMOUS_FAILURE_LIMIT = 100
    return settings


@pytest.mark.asyncio
async def test_a_direct_client_is_counted_as_itself_and_a_trusted_proxys_client_as_forwarded(proxied):
    spoof = [(b"x-forwarded-for", b"5.5.5.5"), (b"x-forwarded-proto", b"https")]
    auth = [(b"authorization", b"Token not-a-real-key")]
    status, _ = await _get("192.0.2.7", "/api/diagnosis/sessions/", [*spoof, *auth])
    assert status == 401
    status, _ = await _get("10.20.3.4", "/api/diagnosis/sessions/", [(b"x-forwarded-for", b"6.6.6.6"), *auth])
    assert status == 401
    rows = AccessAttempt.objects.values_list("ip_address", flat=True)
    addresses = await sync_to_async(lambda: sorted(rows))()
    assert addresses == ["192.0.2.7", "6.6.6.6"]
    await supervisor.stop_background()


@pytest.mark.asyncio
async def test_websocket_without_tls_is_closed_4426_and_tls_goes_on_to_authentication(proxied):
    proxied.WEBSOCKET_REQUIRE_TLS = True
    https = [(b"x-forwarded-proto", b"https")]
    assert await _ws_close_code("192.0.2.7", []) == CLOSE_TLS_REQUIRED
    # A direct client cannot claim TLS: its X-Forwarded-Proto is dropped.
    assert await _ws_close_code("192.0.2.7", https) == CLOSE_TLS_REQUIRED
    assert await _ws_close_code(None, https) == CLOSE_TLS_REQUIRED
    # The trusted proxy's word, or TLS at the socket: on to authentication (anonymous here).
    assert await _ws_close_code("127.0.0.1", https) == 4401
    assert await _ws_close_code("192.0.2.7", [], scheme="wss") == 4401
    assert await _ws_close_code("127.0.0.1", [(b"x-forwarded-proto", b"http")]) == CLOSE_TLS_REQUIRED
    proxied.WEBSOCKET_REQUIRE_TLS = False  # development: plain ws:// is allowed
    assert await _ws_close_code("192.0.2.7", []) == 4401


def test_trusted_proxy_addresses_and_the_check_of_the_setting(settings):
    settings.TRUSTED_PROXIES = ["127.0.0.1", "10.0.0.0/8", "fd00::/8"]
    assert is_trusted_proxy("127.0.0.1")
    assert is_trusted_proxy("10.200.1.1")
    assert is_trusted_proxy("::ffff:10.1.1.1")  # an IPv4 peer on a dual-stack socket
    assert is_trusted_proxy("fd00::5")
    assert not is_trusted_proxy("127.0.0.2")
    assert not is_trusted_proxy("192.0.2.1")
    assert not is_trusted_proxy(None)
    assert not is_trusted_proxy("not-an-address")
    assert check_trusted_proxies() == []
    settings.TRUSTED_PROXIES = ["10.0.0.0/8", "10.0.0.300", "proxy.example"]
    [error] = check_trusted_proxies()
    assert error.id == "diagnosis.E002"
    assert "'10.0.0.300'" in error.msg and "'proxy.example'" in error.msg


@pytest.mark.asyncio
async def test_healthz_needs_no_login_names_only_up_or_down_and_does_not_start_the_duties():
    await supervisor.stop_background()
    status, body = await _get("192.0.2.7", "/healthz", [])
    answer = json.loads(body)
    # Nothing started the duties in this process: not ready, and the probe did not start them.
    assert status == 503
    assert answer == {"status": "down", "database": "up", "duties": {}}
    assert supervisor.duty_status() == {}
    supervisor.ensure_background()
    status, body = await _get("192.0.2.7", "/healthz", [])
    answer = json.loads(body)
    assert status == 200 and answer["status"] == "up" and answer["database"] == "up"
    assert {"runs:control", "runs:sweeper"} <= set(answer["duties"])
    assert set(answer["duties"].values()) == {"up"}
    await supervisor.stop_background()
