"""Load and transport limits against a real daphne process on loopback.

* **200 concurrent chats**: 200 users (tokens) each start one chat at the same moment, half over SSE
  (`POST /api/chat`), half over the WebSocket, against one daphne subprocess on the test database with
  the offline demo provider and the shipped runbooks. Every client reads its stream to the `outcome`.
  Then every run must be terminal in the database and, for every run, the trace's persisted counts
  must equal what the recorder expected (events, steps, tools), with no audit write failure. Bounded:
  200 runs, a 60 s client deadline; the figures (wall time, throughput, errors, latency percentiles)
  are printed and written to `test-artifacts/load-report-<vendor>.json` for docs/reliability.md.
* **WebSocket frames daphne itself refuses**: a 2 MiB frame (over daphne's 1 MiB limit) fails that
  connection (1009, or a dropped TCP connection while the client still writes) without a run being
  created, and the server keeps serving: the next socket chats. (Frames over the consumer's own 64 KiB
  limit and malformed frames get an `error` frame on a socket that stays open:
  tests/surfaces/chat/test_ws.py.)
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from io import StringIO

import httpx
import pytest
import websockets
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection

from audit.read import get_trace
from diagnosis.models import DiagnosisRun
from tests.factories import issue_token
from tests.surfaces.chat.support import ARTIFACTS, DaphneServer, parse_sse

pytestmark = [pytest.mark.load, pytest.mark.django_db(transaction=True)]

CHATS = 200
DEADLINE_SECONDS = 60
QUERIES = [
    "Disk full on /var/log, what now?",
    "nginx answers 502 Bad Gateway after the deploy",
    "MySQL replication lag keeps growing on db-3",
    "Kafka consumer lag is growing",
]


@pytest.fixture
def tokens(db):
    users = get_user_model().objects.bulk_create(
        [get_user_model()(username=f"load-{i:03d}", is_active=True) for i in range(CHATS)]
    )
    return [issue_token(u) for u in users]


@pytest.fixture
def server(db):
    call_command("load_knowledge", "runbooks", stdout=StringIO())
    daphne = DaphneServer(
        env={
            "LLM_PROVIDER": "demo",
            "RUN_SWEEP_INTERVAL_SECONDS": "0",
            "CHAT_SSE_HEARTBEAT_SECONDS": "5",
        },
        name="load",
    ).start()
    yield daphne
    daphne.stop()


async def _sse_chat(client: httpx.AsyncClient, key: str, query: str) -> dict:
    started = time.monotonic()
    result = {"transport": "sse", "runId": None, "status": None, "error": None}
    async with client.stream(
        "POST", "/api/chat", json={"query": query}, headers={"Authorization": f"Token {key}"}
    ) as response:
        if response.status_code != 200:
            result["error"] = f"HTTP {response.status_code}"
            return result
        text = ""
        async for chunk in response.aiter_text():
            text += chunk
            if "event: outcome" in text and text.endswith("\n\n"):
                break
    events, _ = parse_sse(text)
    for event in events:
        if event.event == "run":
            result["runId"] = event.data["runId"]
        elif event.event == "error":
            result["error"] = event.data["code"]
        elif event.event == "outcome":
            result["status"] = event.data["status"]
    result["seconds"] = time.monotonic() - started
    return result


async def _ws_chat(url: str, key: str, query: str) -> dict:
    started = time.monotonic()
    result = {"transport": "ws", "runId": None, "status": None, "error": None}
    async with websockets.connect(
        url, additional_headers={"Authorization": f"Token {key}"}, open_timeout=DEADLINE_SECONDS
    ) as ws:
        await ws.send(json.dumps({"type": "chat", "query": query}))
        async for message in ws:
            frame = json.loads(message)
            if frame["type"] == "run":
                result["runId"] = frame["runId"]
            elif frame["type"] == "error":
                result["error"] = frame["code"]
            elif frame["type"] == "outcome":
                result["status"] = frame["status"]
                break
    result["seconds"] = time.monotonic() - started
    return result


async def _load(base_url: str, keys: list[str]) -> tuple[list, float]:
    ws_url = base_url.replace("http://", "ws://") + "/ws/chat/"
    limits = httpx.Limits(max_connections=CHATS, max_keepalive_connections=CHATS)
    async with httpx.AsyncClient(base_url=base_url, timeout=DEADLINE_SECONDS, limits=limits) as client:
        jobs = [
            _sse_chat(client, key, QUERIES[i % len(QUERIES)])
            if i % 2 == 0
            else _ws_chat(ws_url, key, QUERIES[i % len(QUERIES)])
            for i, key in enumerate(keys)
        ]
        began = time.monotonic()
        results = await asyncio.wait_for(
            asyncio.gather(*jobs, return_exceptions=True), timeout=DEADLINE_SECONDS
        )
        return results, time.monotonic() - began


def test_200_concurrent_chats_all_finish_and_lose_no_record(server, tokens):
    results, wall = asyncio.run(_load(server.url, tokens))

    failures = [r for r in results if isinstance(r, BaseException) or r["error"] or r["status"] is None]
    finished = [r for r in results if not isinstance(r, BaseException)]
    run_ids = [r["runId"] for r in finished if r["runId"]]
    runs = {run.run_id: run for run in DiagnosisRun.objects.filter(run_id__in=run_ids)}
    complete, lost = 0, []
    for run in runs.values():
        summary = get_trace(run=run).summary
        if summary.persisted == summary.expected and summary.audit_write_failures == 0:
            complete += 1
        else:
            lost.append((run.run_id, summary.gaps))
    latencies = sorted(r["seconds"] for r in finished if "seconds" in r)
    report = {
        "database": connection.vendor,
        "runs": CHATS,
        "concurrency": CHATS,
        "transports": {"sse": CHATS // 2, "websocket": CHATS - CHATS // 2},
        "wallSeconds": round(wall, 2),
        "runsPerSecond": round(CHATS / wall, 1),
        "errors": len(failures),
        "terminal": sum(1 for run in runs.values() if run.is_terminal),
        # Runs the server created, whether or not their client saw the stream to its end.
        "runsInDatabase": DiagnosisRun.objects.count(),
        "persistedEqualsExpected": complete,
        "statuses": {
            s: sum(1 for r in finished if r["status"] == s) for s in ("SUCCESS", "FAILED", "CANCELLED")
        },
        "latencySeconds": {
            "p50": round(statistics.median(latencies), 2) if latencies else None,
            "p95": round(latencies[int(len(latencies) * 0.95) - 1], 2) if latencies else None,
            "max": round(latencies[-1], 2) if latencies else None,
        },
    }
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / f"load-report-{connection.vendor}.json").write_text(json.dumps(report, indent=2))
    print("LOAD", json.dumps(report))

    assert not failures, failures[:5]
    assert len(run_ids) == len(set(run_ids)) == len(runs) == CHATS
    assert report["terminal"] == CHATS and report["statuses"]["SUCCESS"] == CHATS
    assert complete == CHATS, lost[:5]
    assert "Traceback" not in server.output()


def test_a_frame_over_daphnes_limit_closes_that_socket_only(server, tokens):
    async def scenario():
        url = server.url.replace("http://", "ws://") + "/ws/chat/"
        headers = {"Authorization": f"Token {tokens[0]}"}
        async with websockets.connect(url, additional_headers=headers, max_size=None) as ws:
            with pytest.raises(websockets.ConnectionClosed) as closed:
                # The reset can reach the client while it is still writing the frame (send raises).
                await ws.send(json.dumps({"type": "chat", "query": "x" * (2 * 1024 * 1024)}))
                await asyncio.wait_for(ws.recv(), 10)
        # daphne (autobahn) fails the connection: a 1009 close frame, or, while the client is still
        # writing the frame, just the dropped TCP connection (no close frame reaches the client).
        code = closed.value.rcvd.code if closed.value.rcvd else None
        async with websockets.connect(url, additional_headers=headers) as ws:
            await ws.send(json.dumps({"type": "chat", "query": "Disk full on /var/log, what now?"}))
            frames = []
            async for message in ws:
                frames.append(json.loads(message))
                if frames[-1]["type"] == "outcome":
                    break
        return code, frames

    code, frames = asyncio.run(scenario())
    assert code in (None, 1009)  # "message too big", from daphne's WebSocket layer
    assert frames[0]["type"] == "run" and frames[-1]["status"] == "SUCCESS"
    assert DiagnosisRun.objects.count() == 1  # only the second socket's chat
