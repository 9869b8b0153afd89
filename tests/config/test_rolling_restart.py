"""A rolling restart under load loses no chat (issue 48): the shipped nginx in front of two daphne
processes started by the unit's command line, Redis, MariaDB; 50 chats (40 over SSE, 10 over WSS)
and 10 AI Ops analyses in flight while the two processes are stopped with SIGTERM and started again,
one after the other, as `systemctl restart diagnosis@A`, then `…@B`, would.

Every chat ends SUCCESS on the client without an error frame (a dropped stream re-attaches after its last
sequence number, as the chat page does), every analysis ends SUCCESS, every run verifies, and no tool was
executed twice: the analyses' `query_metrics` calls reach a counting Prometheus stand-in (one query per
analysis, each unique), the chats' `lookup_knowledge` calls are counted in the record and by the
provider (one tool step asked per chat). Runs were really handed over (RUN_INTERRUPTED `handover`, then
RUN_RESUMED under a new epoch by the other process), some with a model stream cut and asked again.
"""

from __future__ import annotations

import collections
import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import httpx
import pytest
from django.core.management import call_command

from agent.aiops import intake
from agent.runtime import prompts
from audit.models import AgentStep, EventType, ToolInvocation, TraceEvent
from audit.verify.runs import verify_run
from diagnosis.models import DiagnosisRun, RunStatus
from tests.config.support import (
    HOST,
    TIMEOUT,
    Deployment,
    direct_client,
    require_deployment_services,
    wss_connect,
)
from tests.factories import issue_token
from tests.fakes.openai_server import (
    Stream,
    finish_chunk,
    serving,
    text_chunks,
    tool_call_chunks,
    usage,
)
from tests.surfaces.chat.support import EVIDENCE_ID, GUARD_MODEL, ROUTER_MODEL, _text, iter_sse, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.mariadb, pytest.mark.serial]

CHATS, WS_CHATS, ANALYSES = 50, 10, 10
MARK = re.compile(r"load-\d+")
EVIDENCE = re.compile(rf"{EVIDENCE_ID.pattern}|prom:[0-9a-f]+")


# -------------------------------------------------------------------------------------------------
# What the runs talk to
# -------------------------------------------------------------------------------------------------
class CountingPrometheus:
    """A Prometheus HTTP API stand-in on 127.0.0.1 that counts every query it executes."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        lock = threading.Lock()
        counts = self.counts

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                url = urlparse(self.path)
                if url.path == "/-/ready":
                    return self._send(200, b"Prometheus Server is Ready.\n", "text/plain")
                query = (parse_qs(url.query).get("query") or [""])[0]
                with lock:
                    counts[query] += 1
                now = time.time()
                if url.path == "/api/v1/query_range":
                    result = {
                        "resultType": "matrix",
                        "result": [{"metric": {"q": query}, "values": [[now, "1"]]}],
                    }
                else:
                    result = {
                        "resultType": "vector",
                        "result": [{"metric": {"q": query}, "value": [now, "1"]}],
                    }
                self._send(
                    200, json.dumps({"status": "success", "data": result}).encode(), "application/json"
                )

            def _send(self, status: int, body: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> CountingPrometheus:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class LoadProvider:
    """Router: DIAGNOSIS; guard: supported; planner: a one-step plan. The chat agent asks for
    `lookup_knowledge`, the AI Ops executor for `query_metrics` of a query unique to its analysis; after
    the results, an answer citing them, streamed slowly (`pieces` pieces `delay` s apart) so that the
    restarts find runs streaming, between steps and in their tools. Counts the tool steps it asked for
    by the load marker (`load-N`) of the run."""

    delay: float = 0.2
    pieces: int = 25
    tool_steps: collections.Counter[str] = field(default_factory=collections.Counter)
    answers: collections.Counter[str] = field(default_factory=collections.Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, request):
        if request.model == ROUTER_MODEL:
            return _text(request, json.dumps({"intent": "DIAGNOSIS", "confidence": 0.9, "reason": "load"}))
        if request.model == GUARD_MODEL:
            return _text(request, json.dumps({"supported": True, "unsupportedClaims": [], "reason": "load"}))
        messages = request.messages
        role = prompts.role_of(messages)
        said = " ".join(str(m.get("content") or "") for m in messages if m.get("role") == "user")
        marker = MARK.search(said).group(0)
        if role == "planner":
            plan = {"steps": [{"check": "is the service up", "tool": "query_metrics", "why": "load"}]}
            return _text(request, json.dumps(plan))
        tool_text = " ".join(str(m.get("content") or "") for m in messages if m.get("role") == "tool")
        if not tool_text:
            with self.lock:
                self.tool_steps[marker] += 1
            if role == "executor":
                call = ("call_m", "query_metrics", json.dumps({"query": f'up{{marker="{marker}"}}'}))
            else:
                call = ("call_k", "lookup_knowledge", json.dumps({"query": "replication lag"}))
            chunks = [*tool_call_chunks([call], fragments=2), finish_chunk("tool_calls")]
            return Stream(chunks=chunks, usage=usage(300, 20), usage_if_requested=True)
        with self.lock:
            self.answers[marker] += 1
        cite = EVIDENCE.search(tool_text).group(0)
        text = f"Check the replica's SQL thread first [{cite}]. Then compare binlog positions [{cite}]."
        chunks = [*text_chunks(text, self.pieces), finish_chunk("stop")]
        return Stream(chunks=chunks, delay=self.delay, usage=usage(900, 60), usage_if_requested=True)

    def env(self, base_url: str) -> dict[str, str]:
        from tests.surfaces.chat.support import ScriptedProvider

        return ScriptedProvider().env(base_url)


# -------------------------------------------------------------------------------------------------
# Clients that behave like the chat page
# -------------------------------------------------------------------------------------------------
@dataclass
class Seen:
    """What one client saw of its chat."""

    run_id: str = ""
    outcome: dict | None = None
    errors: list = field(default_factory=list)
    reconnects: int = 0
    refused: int = 0  # 503 service_draining answers, sent again after Retry-After


def _sse_chat(d: Deployment, token: str, n: int) -> Seen:
    seen, last, session = Seen(), 0, ""
    auth = {"Authorization": f"Token {token}"}
    with d.client(timeout=60) as client:
        request = ("POST", "/api/chat", {"json": {"query": f"Replication lag on db-3 [load-{n}]"}})
        deadline = time.monotonic() + 120
        while seen.outcome is None and time.monotonic() < deadline:
            method, path, kwargs = request
            try:
                with client.stream(method, path, headers=auth, **kwargs) as response:
                    if response.status_code == 503:
                        seen.refused += 1
                        time.sleep(float(response.headers.get("retry-after") or 1))
                        continue
                    assert response.status_code == 200, response.read()
                    for event in iter_sse(response):
                        last = max(last, event.id or 0)
                        if event.event == "run":
                            seen.run_id, session = event.data["runId"], event.data["sessionId"]
                        elif event.event == "error":
                            seen.errors.append(event.data)
                        elif event.event == "outcome":
                            seen.outcome = event.data
            except httpx.TransportError:
                pass  # the process serving the stream stopped: re-attach below
            if seen.outcome is None:
                assert seen.run_id, "the stream dropped before the run started"
                seen.reconnects += 1
                time.sleep(0.5)
                request = (
                    "GET",
                    f"/api/diagnosis/{session}/runs/{seen.run_id}/events",
                    {"params": {"after": last}},
                )
    return seen


def _ws_chat(d: Deployment, token: str, n: int) -> Seen:
    seen, last = Seen(), 0
    first = {"type": "chat", "query": f"Replication lag on db-3 [load-{n}]"}
    deadline = time.monotonic() + 120
    while seen.outcome is None and time.monotonic() < deadline:
        try:
            with wss_connect(
                f"wss://{HOST}:{d.tls_port}/ws/chat/",
                cert=d.cert,
                headers={"Authorization": f"Token {token}"},
                open_timeout=TIMEOUT,
            ) as ws:
                if seen.run_id:
                    ws.send(json.dumps({"type": "attach", "runId": seen.run_id, "after": last}))
                else:
                    ws.send(json.dumps(first))
                while seen.outcome is None:
                    frame = json.loads(ws.recv(timeout=60))
                    if isinstance(frame.get("sequenceNo"), int):
                        last = max(last, frame["sequenceNo"])
                    if frame["type"] == "run":
                        seen.run_id = frame["runId"]
                    elif frame["type"] == "error":
                        seen.errors.append(frame)
                    elif frame["type"] == "outcome":
                        seen.outcome = frame
        except Exception:  # closed (1012 from a draining process, or its shutdown): reconnect
            if seen.outcome is None:
                seen.reconnects += 1
                time.sleep(0.5)
    return seen


# -------------------------------------------------------------------------------------------------
# The test
# -------------------------------------------------------------------------------------------------
def _ready(daphne) -> bool:
    """The restarted process itself answers its readiness probe (not the proxy, which may ask the other)."""
    with direct_client(daphne.port, "127.0.0.1") as client:
        return client.get("/healthz").status_code == 200


@pytest.fixture
def load_provider():
    with serving(LoadProvider()) as provider:
        yield provider


def test_a_rolling_restart_under_load_fails_no_chat_and_runs_no_tool_twice(
    tmp_path, load_provider, django_user_model
):
    require_deployment_services()
    call_command("load_knowledge", "runbooks", stdout=open("/dev/null", "w"))  # noqa: SIM115
    staff = django_user_model.objects.create_user("ops", password="pw-ops-Staff-1", is_staff=True)
    token = issue_token(staff)
    with CountingPrometheus() as prometheus:
        d = Deployment(
            tmp_path,
            load_provider,
            {
                "PROMETHEUS_URL": prometheus.url,
                "AIOPS_WORKER_CONCURRENCY": "5",
                # Leases long enough for a loaded machine (a renewal starved past the lease is swept).
                "RUN_LEASE_SECONDS": "20",
                # A short drain, so the restarts find runs to hand over (production: 30 s and 10 s).
                "RUN_DRAIN_GRACE_SECONDS": "1",
                "RUN_HANDOVER_WINDOW_SECONDS": "1.5",
                "RUN_ADOPT_INTERVAL_SECONDS": "0.25",
                "CHAT_THROTTLE_RATE": "",
                "CHAT_MAX_ACTIVE_RUNS_PER_USER": str(CHATS),
            },
        )
        try:
            for daphne in d.daphnes:
                daphne.start()
            d.nginx.start(d.tls_port)
            began = time.monotonic()
            with ThreadPoolExecutor(CHATS) as pool:
                futures = [
                    pool.submit(_ws_chat if n < WS_CHATS else _sse_chat, d, token, n) for n in range(CHATS)
                ]
                analyses = [
                    intake.start_staff_analysis(
                        user=staff, query=f"HighLatency on web-{n} [load-{100 + n}]"
                    ).run_id
                    for n in range(ANALYSES)
                ]
                wait_for(lambda: sum(load_provider.answers.values()) >= 20, 60, message="answers streaming")
                exits = []
                for daphne in d.daphnes:  # `systemctl restart diagnosis@A`, then B
                    exits.append(daphne.terminate(timeout=30))
                    daphne.start()
                    wait_for(lambda d=daphne: _ready(d), 30, message="the restarted process to be ready")
                seen = [f.result(timeout=180) for f in futures]
            wait_for(
                lambda: (
                    not DiagnosisRun.objects.filter(
                        run_id__in=analyses, status__in=("PENDING", "RUNNING")
                    ).exists()
                ),
                120,
                message="the analyses to finish",
            )
            elapsed = time.monotonic() - began
        finally:
            d.stop()

    assert exits == [0, 0]
    # Every chat: SUCCESS on the client, no error frame.
    assert [s.errors for s in seen if s.errors] == []
    assert [s.outcome["status"] for s in seen] == ["SUCCESS"] * CHATS
    runs = {s.run_id for s in seen} | set(analyses)
    assert len(runs) == CHATS + ANALYSES
    statuses = collections.Counter(
        DiagnosisRun.objects.filter(run_id__in=runs).values_list("status", flat=True)
    )
    failed = list(
        DiagnosisRun.objects.filter(run_id__in=runs)
        .exclude(status=RunStatus.SUCCESS)
        .values_list("agent_flow", "status", "error_code", "error_message")
    )
    assert statuses == {RunStatus.SUCCESS: CHATS + ANALYSES}, failed
    # Runs were handed over (stopped at a boundary or with a stream cut) and resumed by the other process.
    handovers = TraceEvent.objects.filter(
        run_id__in=runs, event_type=EventType.RUN_INTERRUPTED, details__handover=True
    )
    handed = set(handovers.values_list("run_id", flat=True))
    assert handed, "no run was handed over: the restarts found nothing in flight"
    assert handed & set(analyses), "no analysis was handed over (they go back to the queue)"
    assert handed - set(analyses), "no chat was handed over (the adoption duty takes them)"
    resumed = set(
        TraceEvent.objects.filter(run_id__in=runs, event_type=EventType.RUN_RESUMED).values_list(
            "run_id", flat=True
        )
    )
    assert resumed == handed
    assert not TraceEvent.objects.filter(run_id__in=runs, event_type=EventType.WRITE_FENCED).exists()
    # No tool executed twice: one query per analysis reached Prometheus; one tool step asked and one
    # execution recorded per run.
    markers = [f"load-{n}" for n in range(CHATS)] + [f"load-{100 + n}" for n in range(ANALYSES)]
    assert dict(load_provider.tool_steps) == dict.fromkeys(markers, 1)
    assert dict(prometheus.counts) == {f'up{{marker="load-{100 + n}"}}': 1 for n in range(ANALYSES)}
    per_run = collections.Counter(
        ToolInvocation.objects.filter(run_id__in=runs).values_list("run_id", flat=True)
    )
    assert per_run == dict.fromkeys(runs, 1)
    # A cut stream was recorded as such and asked again; nothing else was asked twice.
    cut = AgentStep.objects.filter(run_id__in=runs, finish_reason="handover").count()
    assert sum(load_provider.answers.values()) == len(runs) + cut
    # Every run verifies.
    assert [r for r in sorted(runs) if not verify_run(r).ok] == []
    print(
        f"\nrolling restart: {len(runs)} runs in {elapsed:.1f} s, {len(handed)} handed over "
        f"({len(handed & set(analyses))} of them analyses) "
        f"({cut} model streams cut and asked again), {sum(s.reconnects for s in seen)} client re-attaches, "
        f"{sum(s.refused for s in seen)} requests refused while draining and sent again"
    )
