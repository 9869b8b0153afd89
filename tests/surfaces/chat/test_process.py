"""Runs outlive their connections and their processes: daphne subprocesses on the test database.

* a client that drops its SSE stream mid-run leaves the run running to a complete trace;
* a worker killed with SIGKILL mid-tool leaves a run the sweeper fails (`LEASE_EXPIRED`, tools closed);
* two daphne processes sharing MariaDB and Redis: a run started through one is attached to and
  cancelled through the other.

The model is the local fake OpenAI-compatible server (real `openai` SDK in the subprocess) with a slow
scripted stream; the slow tool comes from `tests.surfaces.chat.asgi`.
"""

from __future__ import annotations

import datetime as dt
import time
from io import StringIO

import httpx
import pytest
import redis
from django.core.management import call_command
from django.utils import timezone

from agent.runtime.sweeper import LEASE_EXPIRED
from audit.models import EventType, ToolInvocation, ToolStatus, TraceEvent
from audit.read import get_trace
from diagnosis.models import DiagnosisRun, RunStatus
from tests.factories import issue_token
from tests.surfaces.chat.support import DaphneServer, ScriptedProvider, iter_sse, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

TIMEOUT = 20
REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture
def token(user):
    return issue_token(user)


@pytest.fixture
def servers():
    started: list[DaphneServer] = []

    def start(**kwargs) -> DaphneServer:
        server = DaphneServer(**kwargs).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def _env(provider: ScriptedProvider, **extra: str) -> dict[str, str]:
    return {**provider.env(provider.base_url), "RUN_SWEEP_INTERVAL_SECONDS": "0", **extra}


def _headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Token {token}"}


def _run(run_id: str) -> DiagnosisRun:
    return DiagnosisRun.objects.get(run_id=run_id)


def test_dropping_the_stream_mid_run_leaves_the_run_running(servers, provider, token, knowledge):
    provider.delay = 0.15
    provider.pieces = 10
    server = servers(env=_env(provider), name="drop")
    with (
        httpx.Client(base_url=server.url, timeout=TIMEOUT) as client,
        client.stream(
            "POST", "/api/chat", json={"query": "Replication lag on db-3"}, headers=_headers(token)
        ) as r,
    ):
        assert r.status_code == 200
        seen = []
        for event in iter_sse(r):
            seen.append(event)
            if event.event == "progress" and event.data["stage"] == "MODEL_STEP":
                break  # leave while the agent model answers: the connection closes here
    run_id = seen[0].data["runId"]
    assert _run(run_id).status == RunStatus.RUNNING
    wait_for(lambda: _run(run_id).status == RunStatus.SUCCESS, TIMEOUT, message="the run to finish")
    run = _run(run_id)
    assert run.release_decision == "PUBLISHED" and run.lease_owner == ""
    summary = get_trace(run=run).summary
    assert summary.audit_complete, summary.gaps
    assert summary.persisted == summary.expected

    # Reattaching later (from the same process) replays everything, ending with the outcome.
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as client:
        response = client.get(
            f"/api/diagnosis/{run.session_id}/runs/{run_id}/events", headers=_headers(token)
        )
    events = list(iter_sse(response))
    assert events[0].event == "run" and events[-1].event == "outcome"
    assert events[-1].data["content"] == run.content


def test_a_killed_workers_run_is_swept(servers, provider, token):
    provider.tools = (("slow_probe", {"seconds": 60}),)
    server = servers(
        env=_env(provider, RUN_LEASE_SECONDS="2"), app="tests.surfaces.chat.asgi:application", name="kill"
    )
    with (
        httpx.Client(base_url=server.url, timeout=TIMEOUT) as client,
        client.stream("POST", "/api/chat", json={"query": "Probe db-3 slowly"}, headers=_headers(token)) as r,
    ):
        events = []
        for event in iter_sse(r):
            events.append(event)
            if event.event == "tool" and event.data["status"] == "RUNNING":
                break
        server.kill9()  # mid-tool, no chance to clean up
    run_id = events[0].data["runId"]
    run = _run(run_id)
    assert run.status == RunStatus.RUNNING and run.lease_owner
    tool = ToolInvocation.objects.get(run_id=run_id)
    assert tool.status == ToolStatus.RUNNING

    # Before the lease expires the sweeper leaves the run alone.
    if run.lease_expires_at > timezone.now() + dt.timedelta(milliseconds=300):
        call_command("sweep_runs", stdout=StringIO())
        assert _run(run_id).status == RunStatus.RUNNING
    wait_for(lambda: _run(run_id).lease_expires_at < timezone.now(), 10, message="the lease to expire")
    out = StringIO()
    call_command("sweep_runs", stdout=out)
    assert "swept 1 run(s)" in out.getvalue()

    run = _run(run_id)
    assert (run.status, run.error_code) == (RunStatus.FAILED, LEASE_EXPIRED)
    tool.refresh_from_db()
    assert (tool.status, tool.error_code, tool.duration_ms) == (ToolStatus.FAILED, LEASE_EXPIRED, None)
    finished = TraceEvent.objects.get(run_id=run_id, event_type=EventType.RUN_FINISHED)
    assert finished.status == RunStatus.FAILED
    summary = get_trace(run=run).summary
    assert summary.audit_complete and summary.chain_valid, summary.gaps
    assert summary.persisted == summary.expected


def _redis_available() -> bool:
    try:
        return bool(redis.Redis.from_url(REDIS_URL, socket_timeout=1).ping())
    except redis.RedisError:
        return False


@pytest.mark.mariadb
def test_two_processes_attach_and_cancel_each_others_runs(servers, provider, token):
    if not _redis_available():
        pytest.skip("needs Redis on 127.0.0.1:6379 (scripts/redis.sh)")
    provider.tools = (("slow_probe", {"seconds": 60}),)
    env = _env(provider, REDIS_URL=REDIS_URL, RUN_LEASE_SECONDS="30")
    a = servers(env=env, app="tests.surfaces.chat.asgi:application", name="a")
    b = servers(env=env, app="tests.surfaces.chat.asgi:application", name="b")
    with (
        httpx.Client(timeout=TIMEOUT) as client,
        client.stream(
            "POST", f"{a.url}/api/chat", json={"query": "Probe db-3 slowly"}, headers=_headers(token)
        ) as on_a,
    ):
        stream_a = iter_sse(on_a)
        head = []
        for event in stream_a:
            head.append(event)
            if event.event == "tool":
                break
        run = head[0].data
        base = f"{b.url}/api/diagnosis/{run['sessionId']}/runs/{run['runId']}"
        with client.stream("GET", f"{base}/events", params={"after": 0}, headers=_headers(token)) as on_b:
            stream_b = iter_sse(on_b)
            # The replay holds what was recorded so far: the head's sequenced frames (STARTED stages are
            # live only).
            recorded = [(e.event, e.id) for e in head if e.id is not None]
            replayed = [next(stream_b) for _ in recorded]
            assert [(e.event, e.id) for e in replayed] == recorded
            # Cancel through B; A owns the run and must stop now, not at its next heartbeat (10 s).
            began = time.monotonic()
            response = client.post(f"{base}/cancel", headers=_headers(token))
            assert response.status_code == 202 and response.json()["status"] == "RUNNING"
            tail_b = list(stream_b)
        tail_a = list(stream_a)
    elapsed = time.monotonic() - began
    assert elapsed < 8, elapsed
    for tail in (tail_a, tail_b):
        assert tail[-1].event == "outcome" and tail[-1].data["status"] == "CANCELLED"
        assert ("tool", "INTERRUPTED") in [(e.event, e.data.get("status")) for e in tail]
        # Every frame that maps to a timeline event carries its id, live ones included.
        assert all(e.id is not None for e in tail if e.event in ("run", "tool", "outcome")), tail
    final = _run(run["runId"])
    assert final.status == RunStatus.CANCELLED
    owner = TraceEvent.objects.get(run_id=final.run_id, event_type=EventType.RUN_STARTED).details[
        "leaseOwner"
    ]
    assert owner.split(":")[1] == str(a.proc.pid)  # executed by A, cancelled through B
    assert ToolInvocation.objects.get(run_id=final.run_id).status == ToolStatus.INTERRUPTED
    summary = get_trace(run=final).summary
    assert summary.audit_complete, summary.gaps
