"""What the reader sees is what was released: the release policy on every path (issue 13).

Under the default `CHAT_RELEASE=verified` no answer text leaves the server before RELEASE_DECISION: not
on the WebSocket, not on the SSE stream, not in a replay (`events?after=N`, WebSocket `attach`). The text
of a BLOCKED run's drafts never reaches any reader; neither does a first draft that failed the evidence
guard and was repaired. Progress frames arrive in the timeline's order. Under `CHAT_RELEASE=draft` the
drafts stream as `draft` frames and the run records that it sent them (`run.delivery`).

Runs execute for real: the runtime, the real `openai` SDK against the local fake provider, the real
database and the in-memory channel layer.
"""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async

from agent.runtime.events import CHAT_TIMELINE_TYPES
from agent.runtime.pipeline import BLOCKED_MESSAGE
from audit.models import EventType, TraceEvent
from audit.read import get_trace
from diagnosis.models import DiagnosisRun, ReleaseDecision
from tests.surfaces.chat.transports import (
    post_chat,
    settle,
    sse_read,
    token_client,
    ws_connect,
    ws_frames_until_outcome,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio,
    pytest.mark.usefixtures("chat_settings", "stop_chat_background"),
]

UNCITED = "DRAFT-UNCITED-7f3 just restart mysqld on db-3 and hope the lag goes away."
FIRST_DRAFT = "DRAFT-FIRST-91c restart the replica, nothing else to check."
REPAIRED = "Check the replica's SQL thread and long transactions first.{cite}"
OVERCLAIMED = "DRAFT-OVERCLAIM-4b2 the lag is always caused by the binlog format.{cite}"

# scenario -> (agent answers, semantic guard verdict, release, markers that must never reach a reader)
SCENARIOS = {
    "published": ([], True, ReleaseDecision.PUBLISHED, []),
    "blocked-uncited": ([UNCITED], True, ReleaseDecision.BLOCKED, ["DRAFT-UNCITED-7f3"]),
    "repaired-then-published": (
        [FIRST_DRAFT, REPAIRED],
        True,
        ReleaseDecision.PUBLISHED,
        ["DRAFT-FIRST-91c"],
    ),
    "blocked-by-semantic-guard": ([OVERCLAIMED], False, ReleaseDecision.BLOCKED, ["DRAFT-OVERCLAIM-4b2"]),
}
FINISHED_STAGES = {
    "published": ["ROUTING", "MODEL_STEP", "MODEL_STEP", "EVIDENCE_GUARD", "SEMANTIC_GUARD", "RELEASE"],
    "blocked-uncited": [
        "ROUTING", "MODEL_STEP", "MODEL_STEP", "EVIDENCE_GUARD", "MODEL_STEP", "EVIDENCE_GUARD", "RELEASE",
    ],
    "repaired-then-published": [
        "ROUTING", "MODEL_STEP", "MODEL_STEP", "EVIDENCE_GUARD", "MODEL_STEP", "EVIDENCE_GUARD",
        "SEMANTIC_GUARD", "RELEASE",
    ],
    "blocked-by-semantic-guard": [
        "ROUTING", "MODEL_STEP", "MODEL_STEP", "EVIDENCE_GUARD", "SEMANTIC_GUARD", "RELEASE",
    ],
}  # fmt: skip


def _script(llm_server, scenario: str) -> None:
    answers, supported, _, _ = SCENARIOS[scenario]
    llm_server.provider.answers = list(answers)
    llm_server.provider.supported = supported
    llm_server.provider.pieces = 6


async def _live_ws(user, query: str) -> list[dict]:
    comm = await ws_connect(user)
    await comm.send_json_to({"type": "chat", "query": query})
    frames = await ws_frames_until_outcome(comm)
    await comm.disconnect()
    return frames


async def _live_sse(user, query: str) -> list[dict]:
    client = await token_client(user)
    _, events = await sse_read(await post_chat(client, {"query": query}))
    return [{"type": e.event, **e.data} for e in events]


async def _replays(user, run: DiagnosisRun) -> dict[str, list[dict]]:
    """The run replayed after 0 over SSE (`events?after=0`) and over the WebSocket (`attach`)."""
    client = await token_client(user)
    _, events = await sse_read(
        await client.get(f"/api/diagnosis/{run.session_id}/runs/{run.run_id}/events", {"after": 0})
    )
    comm = await ws_connect(user)
    await comm.send_json_to({"type": "attach", "runId": run.run_id, "after": 0})
    attached = await ws_frames_until_outcome(comm, run_id=run.run_id)
    await comm.disconnect()
    return {"sse-replay": [{"type": e.event, **e.data} for e in events], "ws-attach": attached}


def _answer_text_before_outcome(frames: list[dict], texts: list[str]) -> list[dict]:
    before = frames[: next(i for i, f in enumerate(frames) if f["type"] == "outcome")]
    return [f for f in before if f["type"] == "draft" or any(t and t in json.dumps(f) for t in texts)]


@pytest.mark.parametrize("transport", ["ws", "sse"])
@pytest.mark.parametrize("scenario", SCENARIOS)
async def test_verified_release_sends_no_answer_text_before_the_release_on_any_path(
    user, llm_server, knowledge, scenario, transport
):
    _script(llm_server, scenario)
    _, _, release, markers = SCENARIOS[scenario]
    live = await (_live_ws if transport == "ws" else _live_sse)(user, "Replication lag on db-3")
    run_id = live[0]["runId"]
    await settle(run_id)
    run = await DiagnosisRun.objects.aget(run_id=run_id)
    assert run.release_decision == release
    assert run.content == (BLOCKED_MESSAGE if release == ReleaseDecision.BLOCKED else run.content)
    paths = {"live": live, **(await _replays(user, run))}
    for path, frames in paths.items():
        assert frames[-1]["type"] == "outcome" and frames[-1]["content"] == run.content, path
        # Nothing that quotes an answer (released or drafted) before the outcome, and no draft frame.
        assert not any(f["type"] == "draft" for f in frames), path
        assert _answer_text_before_outcome(frames, [run.content[:40], *markers]) == [], path
        # A withheld draft never reaches the reader on any path, outcome included.
        for marker in markers:
            assert marker not in json.dumps(frames), (path, marker)
        # Progress: the stages that finished, in the timeline's order, with its sequence numbers.
        finished = [f for f in frames if f["type"] == "progress" and f["status"] == "FINISHED"]
        assert [f["stage"] for f in finished] == FINISHED_STAGES[scenario], path
        assert finished[-1]["verdict"] == release
    # The live stream also says which stages started (model calls), and replays cannot (not persisted).
    assert ("MODEL_STEP", "STARTED") in [(f.get("stage"), f.get("status")) for f in live]
    stage_events = [
        e
        async for e in TraceEvent.objects.filter(run_id=run_id, event_type__in=CHAT_TIMELINE_TYPES)
        .exclude(event_type__in=(EventType.RUN_STARTED, EventType.TOOL_INVOCATION, EventType.RUN_FINISHED))
        .order_by("sequence_no")
    ]
    live_finished = [f for f in live if f["type"] == "progress" and f["status"] == "FINISHED"]
    assert [f["sequenceNo"] for f in live_finished] == [e.sequence_no for e in stage_events]
    # The record says what the reader could see: nothing before the outcome.
    assert run.release_mode == "verified" and run.draft_chars == 0
    assert run.first_output_at is not None and run.release_latency_ms is not None
    delivery = (await sync_to_async(get_trace)(run=run)).run
    assert delivery.unverified_text_delivered is False


async def test_draft_release_streams_drafts_and_records_that_a_blocked_draft_was_seen(
    user, llm_server, knowledge, chat_settings
):
    chat_settings.CHAT_RELEASE = "draft"
    chat_settings.CHAT_DRAFT_COALESCE_MS = 0
    _script(llm_server, "blocked-uncited")
    live = await _live_ws(user, "Replication lag on db-3")
    run_id = live[0]["runId"]
    await settle(run_id)
    run = await DiagnosisRun.objects.aget(run_id=run_id)
    assert run.release_decision == ReleaseDecision.BLOCKED and run.content == BLOCKED_MESSAGE
    drafts = [f for f in live if f["type"] == "draft"]
    # Both drafts (the first and the repair round's) were streamed in pieces, then withheld.
    assert "".join(f["text"] for f in drafts) == UNCITED * 2 and len(drafts) >= 6
    assert all(f["runId"] == run_id for f in drafts)
    assert run.release_mode == "draft" and run.draft_chars == len(UNCITED) * 2
    assert run.unverified_text_delivered is True
    # The first visible text was the first draft, well before the outcome.
    assert run.first_output_at < run.finished_at
    # Drafts are not persisted: a replay carries none, its outcome carries the released content.
    replays = await _replays(user, run)
    for path, frames in replays.items():
        assert not any(f["type"] == "draft" for f in frames), path
        assert "DRAFT-UNCITED-7f3" not in json.dumps(frames), path
    # The trace says so, and the summary digest binds it (the run verifies).
    client = await token_client(user)
    body = (await client.get(f"/api/diagnosis/{run.session_id}/trace", {"runId": run_id})).json()
    assert body["run"]["delivery"] == {
        "releaseMode": "draft",
        "unverifiedTextDelivered": True,
        "draftChars": len(UNCITED) * 2,
    }
    assert body["summary"]["rowsVerified"] is True and body["summary"]["auditComplete"] is True


@pytest.mark.parametrize("transport", ["ws", "sse"])
async def test_coalesced_drafts_carry_the_same_text_in_order_and_leave_the_outcome_unchanged(
    user, llm_server, knowledge, chat_settings, transport
):
    """With a window longer than the run, the first piece goes out at once (the run was quiet) and the
    rest is held until the next other event: the rest of each answer the model wrote is one `draft`
    frame, just before that step's FINISHED frame (never after)."""
    chat_settings.CHAT_RELEASE = "draft"
    chat_settings.CHAT_DRAFT_COALESCE_MS = 10**7
    _script(llm_server, "blocked-uncited")
    live = await (_live_ws if transport == "ws" else _live_sse)(user, "Replication lag on db-3")
    run_id = live[0]["runId"]
    await settle(run_id)
    run = await DiagnosisRun.objects.aget(run_id=run_id)
    drafts = [i for i, f in enumerate(live) if f["type"] == "draft"]
    texts = [live[i]["text"] for i in drafts]
    assert len(texts) == 3 and texts[0] + texts[1] == UNCITED and texts[2] == UNCITED
    for i in drafts[1:]:
        assert (live[i + 1]["stage"], live[i + 1]["status"]) == ("MODEL_STEP", "FINISHED")
    assert live[-1]["type"] == "outcome" and live[-1]["runId"] == run_id
    assert (live[-1]["releaseDecision"], live[-1]["content"]) == ("BLOCKED", BLOCKED_MESSAGE)
    assert run.draft_chars == len(UNCITED) * 2 and run.unverified_text_delivered is True


async def test_draft_chars_are_bound_into_the_chain(user, llm_server, knowledge, chat_settings):
    """Rewriting what the reader was sent (hiding a delivered draft) breaks the run's summary digest."""
    chat_settings.CHAT_RELEASE = "draft"
    _script(llm_server, "blocked-uncited")
    live = await _live_ws(user, "Replication lag on db-3")
    await settle(live[0]["runId"])
    run = await DiagnosisRun.objects.aget(run_id=live[0]["runId"])
    assert (await sync_to_async(get_trace)(run=run)).summary.rows_verified
    await DiagnosisRun.objects.filter(pk=run.pk).aupdate(draft_chars=0)
    run = await DiagnosisRun.objects.aget(pk=run.pk)
    summary = (await sync_to_async(get_trace)(run=run)).summary
    assert not summary.rows_verified
    assert any("terminal summary" in gap for gap in summary.gaps), summary.gaps
