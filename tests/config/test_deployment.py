"""The shipped deployment, end to end (issue 37): nginx with `deploy/nginx/diagnosis.conf` and TLS in
front of two daphne processes started from `deploy/systemd/diagnosis@.service`'s command line, DEBUG
off, in the environment of `deploy/diagnosis.env.example`, on MariaDB and Redis (tests/config/support.py
says what is substituted). Through the proxy:

* `/healthz` is up with every duty; plain HTTP only redirects, to the TLS port (`Host` keeps the port),
  and a `ws://` upgrade on it is refused; static files come from nginx; the CSP names `wss://host:port`;
* a staff user signs in to the admin (CSRF over TLS); chats complete over SSE and over WSS;
* a run started on one process is reattached to and cancelled through the other (strict round robin of
  the upstream, checked in the processes' own access logs), stopping at once;
* `/metrics` is 401 without the token (or a wrong one) and 200 with it; on a daphne port it is not
  redirected;
* the client's real address is recorded, whatever `X-Forwarded-For` it sends through the proxy or
  straight to a daphne port (from another loopback address than the proxy's; there a spoofed
  `X-Forwarded-Proto: https` does not stop the HTTPS redirect, and where the app does not redirect, a
  third process with `SECURE_SSL_REDIRECT=false`, it records the client as itself); straight to daphne a
  `ws://` handshake is closed 4426;
* a SIGKILLed process's run is swept by the other and its record verifies;
* SIGTERM stops a process and its duties cleanly; after a restart of both, a queued AI Ops analysis is
  claimed within seconds with no request sent.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest
import websockets
from axes.models import AccessAttempt
from websockets.sync.client import connect as ws_connect

from access.lockout import METRICS
from agent.aiops import intake
from agent.runtime.sweeper import LEASE_EXPIRED
from audit.verify.runs import verify_run
from diagnosis.models import DiagnosisRun, RunStatus
from tests.config.support import (
    HOST,
    PASSWORD,
    TIMEOUT,
    UnitDaphne,
    direct_client,
    free_port,
    wss_connect,
)
from tests.factories import issue_token
from tests.surfaces.chat.support import iter_sse, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.mariadb]

# The proxy connects to daphne from 127.0.0.1 (TRUSTED_PROXIES' default); a client that reaches daphne
# itself comes from another loopback address.
DIRECT_SOURCE = "127.0.0.2"


def _owner_pid(run_id: str) -> int:
    run = DiagnosisRun.objects.get(run_id=run_id)
    return int(run.lease_owner.split(":")[1])


def _start_slow_chat(client: httpx.Client, token: str):
    """A chat whose answer streams slowly; returns (stream context, its events iterator, run frame)."""
    context = client.stream(
        "POST",
        "/api/chat",
        json={"query": "Replication lag on db-3"},
        headers={"Authorization": f"Token {token}"},
    )
    response = context.__enter__()
    assert response.status_code == 200, response.read()
    events = iter_sse(response)
    head = []
    for event in events:
        head.append(event)
        if event.event == "progress" and event.data.get("stage") == "MODEL_STEP":
            break
    return context, events, head[0].data


def test_the_shipped_deployment_works_as_documented(deployment, provider, django_user_model):
    d = deployment
    # The accounts, by the documented commands, in the deployment's environment (its password hasher).
    d.manage("createsuperuser", "--noinput", "--username", "root", "--email", "root@example.com")
    d.manage("user_groups", "ops", "--create", "--add", "Staff viewers", "--add", "Approvers", "--staff")
    staff = django_user_model.objects.get(username="ops")
    assert staff.is_staff and not staff.is_superuser
    assert set(staff.groups.values_list("name", flat=True)) == {"Staff viewers", "Approvers"}
    token = issue_token(staff)
    auth = {"Authorization": f"Token {token}"}

    with d.client() as client:
        # Readiness through the proxy: database, Redis and every duty of the process that answered.
        health = client.get("/healthz")
        assert health.status_code == 200, health.text
        body = health.json()
        assert body["database"] == body["redis"] == "up"
        assert {"runs:control", "runs:sweeper", "runs:queue-worker", "audit:checkpoint"} <= set(
            body["duties"]
        )
        assert set(body["duties"].values()) == {"up"}

        # Static files are nginx's; pages carry the CSP of the address the browser used.
        css = client.get("/static/admin/css/base.css")
        assert css.status_code == 200 and css.headers["server"].startswith("nginx")
        page = client.get("/admin/login/")
        assert page.status_code == 200
        assert f"wss://{HOST}:{d.tls_port}" in page.headers["content-security-policy"]
        assert page.headers["strict-transport-security"].startswith("max-age=")

        # Sign in to the admin (CSRF over TLS, Secure cookies).
        login = client.post(
            "/admin/login/?next=/admin/",
            data={
                "username": "ops",
                "password": PASSWORD,
                "csrfmiddlewaretoken": client.cookies["csrftoken"],
                "next": "/admin/",
            },
            headers={"Referer": f"{d.url}/admin/login/", "Origin": d.url},
        )
        assert login.status_code == 302 and login.headers["location"] == "/admin/", login.text[-3000:]
        assert "secure" in login.headers["set-cookie"].lower()
        assert client.get("/admin/").status_code == 200

        # A chat over SSE.
        with client.stream("POST", "/api/chat", json={"query": "Replication lag on db-3"}, headers=auth) as r:
            assert r.status_code == 200
            events = list(iter_sse(r))
        assert events[-1].event == "outcome" and events[-1].data["status"] == "SUCCESS"

    # A chat over WSS.
    with wss_connect(
        f"wss://{HOST}:{d.tls_port}/ws/chat/", cert=d.cert, headers=auth, open_timeout=TIMEOUT
    ) as ws:
        ws.send(json.dumps({"type": "chat", "query": "Replication lag on db-3"}))
        frames = []
        while not frames or frames[-1]["type"] != "outcome":
            frames.append(json.loads(ws.recv(timeout=TIMEOUT)))
    assert frames[-1]["status"] == "SUCCESS"

    # Plain HTTP only redirects, to the TLS port; a WebSocket upgrade there is refused.
    plain = httpx.get(f"http://{HOST}:{d.http_port}/admin/login/?x=1", timeout=TIMEOUT)
    assert plain.status_code == 301
    assert plain.headers["location"] == f"https://{HOST}:{d.tls_port}/admin/login/?x=1"
    with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
        ws_connect(f"ws://{HOST}:{d.http_port}/ws/chat/", additional_headers=auth, open_timeout=TIMEOUT)
    assert refused.value.response.status_code == 426

    # /metrics: refused without the token, scraped with it; on a daphne port it is not redirected.
    metrics_token = d.env["METRICS_TOKEN"]
    with d.client() as client:
        assert client.get("/metrics").status_code == 401
        scraped = client.get("/metrics", headers={"Authorization": f"Bearer {metrics_token}"})
        assert scraped.status_code == 200 and "diagnosis_" in scraped.text
        assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    with direct_client(d.ports[0], DIRECT_SOURCE) as direct:
        internal = direct.get("/metrics", headers={"Authorization": f"Bearer {metrics_token}"})
        assert internal.status_code == 200 and "diagnosis_" in internal.text
        assert direct.get("/healthz").status_code == 200

    # Only the proxy speaks for clients: a spoofed X-Forwarded-For is ignored on both paths.
    spoof = {
        "X-Forwarded-For": "5.5.5.5",
        "X-Forwarded-Proto": "https",
        "Authorization": "Token not-a-real-key",
    }
    with d.client() as client:
        assert client.get("/api/diagnosis/sessions/", headers=spoof).status_code == 401
    with direct_client(d.ports[1], DIRECT_SOURCE) as direct:
        # Straight to daphne, a spoofed X-Forwarded-Proto does not make plain HTTP count as TLS: the
        # request is redirected before anything reads its address.
        redirected = direct.get("/api/diagnosis/sessions/", headers=spoof)
        assert redirected.status_code == 301
        assert redirected.headers["location"] == f"https://{HOST}/api/diagnosis/sessions/"
    # Even where the application does not redirect (SECURE_SSL_REDIRECT=false: the proxy redirects), a
    # client that reaches daphne itself is recorded as itself.
    lenient = UnitDaphne(free_port(), {**d.env, "SECURE_SSL_REDIRECT": "false"}, d.tmp / "daphne-lenient.log")
    try:
        lenient.start()
        with direct_client(lenient.port, DIRECT_SOURCE) as direct:
            assert direct.get("/api/diagnosis/sessions/", headers=spoof).status_code == 401
    finally:
        lenient.stop()
    # Each failure is counted against the address it really came from, never the spoofed one: the wrong
    # /metrics token and the proxied unknown token at the proxy's address (each in its own counter), the
    # direct one at the direct client's.
    attempts = {
        (ip, username or "") for ip, username in AccessAttempt.objects.values_list("ip_address", "username")
    }
    assert attempts == {("127.0.0.1", METRICS), ("127.0.0.1", ""), (DIRECT_SOURCE, "")}
    # Straight to daphne, ws:// is closed with 4426 (TLS required), whatever the client claims.
    with (
        ws_connect(
            f"ws://127.0.0.1:{d.ports[0]}/ws/chat/",
            additional_headers={**auth, "X-Forwarded-Proto": "https"},
            source_address=(DIRECT_SOURCE, 0),
            open_timeout=TIMEOUT,
        ) as ws,
        pytest.raises(websockets.exceptions.ConnectionClosed) as closed,
    ):
        ws.recv(timeout=TIMEOUT)
    assert closed.value.rcvd.code == 4426

    # Reattach and cancel across processes. nginx's round robin alternates the two upstreams, so the
    # chat goes to one, the reattach to the other, the probe to the first and the cancel to the other;
    # the processes' own access logs say who served what.
    # (The slow chat's first frames arrive while its answer still streams: the proxy does not buffer SSE.)
    provider.delay, provider.pieces = 0.5, 60
    with d.client() as client:
        context, stream, run = _start_slow_chat(client, token)
        try:
            owner = d.by_pid(_owner_pid(run["runId"]))
            other = next(x for x in d.daphnes if x is not owner)
            base = f"/api/diagnosis/{run['sessionId']}/runs/{run['runId']}"
            with client.stream("GET", f"{base}/events", params={"after": 0}, headers=auth) as attached:
                assert attached.status_code == 200
                replay = iter_sse(attached)
                assert next(replay).event == "run"
                assert client.get("/healthz").status_code == 200
                began = time.monotonic()
                cancelled = client.post(f"{base}/cancel", headers=auth)
                assert cancelled.status_code == 202, cancelled.text
                tail_b = list(replay)
            tail_a = list(stream)
        finally:
            context.__exit__(None, None, None)
    assert time.monotonic() - began < 8
    for tail in (tail_a, tail_b):
        assert tail[-1].event == "outcome" and tail[-1].data["status"] == "CANCELLED"
    assert f"{base}/events" in other.output() and f"{base}/cancel" in other.output()
    assert f"{base}/cancel" not in owner.output()
    assert verify_run(run["runId"]).ok

    # A SIGKILLed process's run is swept by the other, and its record verifies.
    with d.client() as client:
        context, stream, run = _start_slow_chat(client, token)
        victim = d.by_pid(_owner_pid(run["runId"]))
        survivor = next(x for x in d.daphnes if x is not victim)
        victim.kill9()
        context.__exit__(None, None, None)
    wait_for(
        lambda: DiagnosisRun.objects.get(run_id=run["runId"]).status == RunStatus.FAILED,
        TIMEOUT,
        message="the survivor's sweeper to fail the killed process's run",
    )
    swept = DiagnosisRun.objects.get(run_id=run["runId"])
    assert swept.error_code == LEASE_EXPIRED
    assert verify_run(swept.run_id).ok
    provider.delay, provider.pieces = 0.0, 4

    # SIGTERM stops a process and its duties cleanly; after restarting both, a queued analysis is
    # claimed within seconds with no request sent to either.
    assert survivor.terminate() == 0
    assert "background duties stopped" in survivor.output()
    queued = intake.start_staff_analysis(user=staff, query="Nginx returns 502 after deploy").run_id
    assert DiagnosisRun.objects.get(run_id=queued).status == RunStatus.PENDING
    requests_before = [x.output().count('"GET ') + x.output().count('"POST ') for x in d.daphnes]
    for daphne in d.daphnes:
        daphne.start()
    began = time.monotonic()
    wait_for(
        lambda: DiagnosisRun.objects.get(run_id=queued).status != RunStatus.PENDING,
        10,
        message="a restarted process to claim the queued analysis",
    )
    assert time.monotonic() - began < 10
    assert [x.output().count('"GET ') + x.output().count('"POST ') for x in d.daphnes] == requests_before
    wait_for(
        lambda: DiagnosisRun.objects.get(run_id=queued).is_terminal, 30, message="the analysis to finish"
    )
