"""Replay, live following and the sweeper, on runs recorded through the real recorder.

The follower is driven by hand here (events committed through the recorder, frames published to the
in-memory channel layer as the executor's sink does) so that every interleaving of replay and live
delivery — duplicates, lost frames, a late run row — is exercised deterministically.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import json

import pytest
from asgiref.sync import sync_to_async
from django.core.management import call_command
from django.utils import timezone

from agent.runtime import live
from agent.runtime.db import shutdown_pools
from agent.runtime.events import DraftEvent, Event, OutcomeEvent, RunEvent, ToolEvent, sequence_of, timestamp
from agent.runtime.live import RunFollower, persisted_frames, publish
from agent.runtime.sweeper import LEASE_EXPIRED, sweep_expired_runs
from audit.models import EventType, Phase, ToolInvocation, ToolStatus, TraceEvent
from audit.read import get_trace
from audit.write import ChainEvent, DeclaredToolCall, RunRecorder, ToolCallNotDeclared
from diagnosis import services
from diagnosis.models import DiagnosisRun, ReleaseDecision, RunStatus
from reasoning.capture import build_capture
from surfaces.answers import render_answer
from surfaces.chat.protocol import ws_frame
from tests.factories import record_full_run, usage

pytestmark = pytest.mark.django_db(transaction=True)

TIMEOUT = 10


@pytest.fixture(autouse=True)
def in_memory_layer(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.RUN_SWEEP_INTERVAL_SECONDS = 0
    settings.AUDIT_CHECKPOINT_INTERVAL_SECONDS = 0
    settings.AUDIT_PURGE_INTERVAL_SECONDS = 0
    yield
    shutdown_pools()


def _started_run(user, *, tools: int = 1):
    """A run with RUN_STARTED, a routing decision, a model step declaring `tools` calls, and the first
    tool started."""
    session = services.create_session(owner=user)
    run = services.create_run(session=session, query="Why is replication lagging?")
    rec = RunRecorder.for_run(run)
    rec.run_started()
    rec.routing_decision(intent="DIAGNOSIS", confidence=0.9, reason="r", fallback=False)
    calls = [
        DeclaredToolCall(f"call_{i}", "lookup_knowledge", json.dumps({"query": "q"})) for i in range(tools)
    ]
    rec.model_step(
        step_index=1,
        agent_name="diagnosis_agent",
        model="agent-m",
        usage=usage(10, 5),
        reasoning=build_capture(reasoning="secret reasoning", text="", tool_calls=[c.plan() for c in calls]),
        tool_calls=calls,
        finish_reason="tool_calls",
    )
    seq = rec.tool_started(tool_call_id="call_0", tool_name="lookup_knowledge", input_params={"query": "q"})
    return run, rec, seq


# -------------------------------------------------------------------------------------------------
# Replay
# -------------------------------------------------------------------------------------------------
def test_replay_maps_the_timeline_to_contract_frames(user):
    run = services.create_run(session=services.create_session(owner=user), query="q")
    record_full_run(run, tools=2)
    run.refresh_from_db()
    replay = persisted_frames(run.run_id, after=0)
    assert replay.finished
    kinds = [
        (f.type, ws_frame(f).get("toolCallId") or ws_frame(f).get("stage"), ws_frame(f).get("status"))
        for f in replay.frames
    ]
    assert kinds == [
        ("run", None, None),
        ("progress", "ROUTING", "FINISHED"),
        ("progress", "MODEL_STEP", "FINISHED"),
        ("tool", "call_0", "RUNNING"),
        ("tool", "call_0", "SUCCEEDED"),
        ("tool", "call_1", "RUNNING"),
        ("tool", "call_1", "SUCCEEDED"),
        ("progress", "MODEL_STEP", "FINISHED"),
        ("progress", "EVIDENCE_GUARD", "FINISHED"),
        ("progress", "SEMANTIC_GUARD", "FINISHED"),
        ("progress", "RELEASE", "FINISHED"),
        ("outcome", None, "SUCCESS"),
    ]
    events = {e.sequence_no: e.event_type for e in TraceEvent.objects.filter(run_id=run.run_id)}
    expected = {
        "run": {EventType.RUN_STARTED},
        "progress": {
            EventType.ROUTING_DECISION,
            EventType.AGENT_MODEL_STEP,
            EventType.EVIDENCE_GUARD_INITIAL,
            EventType.SEMANTIC_GUARD_DECISION,
            EventType.RELEASE_DECISION,
        },
        "tool": {EventType.TOOL_INVOCATION},
        "outcome": {EventType.RUN_FINISHED},
    }
    for frame in replay.frames:
        assert sequence_of(frame) is not None
        assert events[sequence_of(frame)] in expected[frame.type]
    # A progress frame carries only bounded facts of its decision: never reasons or text.
    assert ws_frame(replay.frames[1]) == {
        "type": "progress",
        "runId": run.run_id,
        "stage": "ROUTING",
        "status": "FINISHED",
        "sequenceNo": sequence_of(replay.frames[1]),
        "intent": "DIAGNOSIS",
        # Read from the timeline: when its event was recorded.
        "at": timestamp(
            TraceEvent.objects.get(run_id=run.run_id, sequence_no=sequence_of(replay.frames[1])).created_at
        ),
    }
    assert (
        ws_frame(replay.frames[9])["verdict"] == "PASS"
        and ws_frame(replay.frames[10])["verdict"] == "PUBLISHED"
    )
    assert ws_frame(replay.frames[0]) == {
        "type": "run",
        "sessionId": run.session_id,
        "runId": run.run_id,
        "demo": False,
        "query": run.query,  # the question as stored (redacted)
        "askedAt": timestamp(run.created_at),
    }
    assert ws_frame(replay.frames[3]) == {
        "type": "tool",
        "runId": run.run_id,
        "toolCallId": "call_0",
        "name": "lookup_knowledge",
        "status": "RUNNING",
        "at": timestamp(
            TraceEvent.objects.get(run_id=run.run_id, sequence_no=sequence_of(replay.frames[3])).created_at
        ),
    }
    assert ws_frame(replay.frames[-1]) == {
        "type": "outcome",
        "runId": run.run_id,
        "status": "SUCCESS",
        "releaseDecision": "PUBLISHED",
        "content": run.content,
        "contentHtml": str(render_answer(run.content)),
    }
    assert (
        '<a class="citation" href="/knowledge/mysql-replication-lag/?chunk=1#chunk-1"'
        in (ws_frame(replay.frames[-1])["contentHtml"])
    )
    # Exactly the frames after N.
    third = sequence_of(replay.frames[4])
    later = persisted_frames(run.run_id, after=third)
    assert [sequence_of(f) for f in later.frames] == [
        sequence_of(f) for f in replay.frames if sequence_of(f) > third
    ]


def test_replay_of_a_failed_run_sends_error_then_outcome(user):
    run, rec, _ = _started_run(user)
    rec.finish(
        status=RunStatus.FAILED, error_code="PROVIDER_UNAVAILABLE", error_message="The model provider failed."
    )
    replay = persisted_frames(run.run_id, after=0)
    assert [f.type for f in replay.frames][-2:] == ["error", "outcome"]
    assert ws_frame(replay.frames[-2]) == {
        "type": "error",
        "code": "PROVIDER_UNAVAILABLE",
        "message": "The model provider failed.",
    }
    assert sequence_of(replay.frames[-2]) is None  # the error maps to no timeline event of its own
    # The dangling tool was closed FAILED by finish and that is a tool frame too.
    assert ("call_0", "FAILED") in [
        (ws_frame(f).get("toolCallId"), ws_frame(f).get("status")) for f in replay.frames
    ]


def test_replay_skips_refused_tool_starts(user):
    run, rec, _ = _started_run(user)
    with pytest.raises(ToolCallNotDeclared):
        rec.tool_started(tool_call_id="undeclared", tool_name="lookup_knowledge", input_params={})
    assert TraceEvent.objects.filter(run_id=run.run_id, status="REFUSED").exists()
    replay = persisted_frames(run.run_id, after=0)
    assert "undeclared" not in [ws_frame(f).get("toolCallId") for f in replay.frames]


def test_replay_waits_for_the_terminal_row_and_survives_a_missing_run_finished(user):
    run, rec, _ = _started_run(user)
    rec.tool_finished(tool_call_id="call_0", status=ToolStatus.SUCCEEDED, output="{}")
    # RUN_FINISHED committed, terminal row not yet: the follower must wait, not invent an outcome.
    # (the recorder's own write path, stopped between the event and the row as `finish` is)
    rec.chain.write(
        "run_finished", [ChainEvent(Phase.RUN, EventType.RUN_FINISHED, "SUCCESS", "run success", {})]
    )
    pending = persisted_frames(run.run_id, after=0)
    assert pending.row_pending and not pending.finished

    # A terminal row without RUN_FINISHED (that audit write failed): the outcome still comes, without id.
    other, _rec, _ = _started_run(user)
    DiagnosisRun.objects.filter(run_id=other.run_id).update(status=RunStatus.SUCCESS, content="done")
    replay = persisted_frames(other.run_id, after=0)
    assert replay.finished and replay.frames[-1].type == "outcome" and sequence_of(replay.frames[-1]) is None


def test_replay_after_the_outcome_is_empty_and_complete(user):
    run = services.create_run(session=services.create_session(owner=user), query="q")
    record_full_run(run, tools=1)
    last = TraceEvent.objects.filter(run_id=run.run_id).order_by("-sequence_no").first().sequence_no
    replay = persisted_frames(run.run_id, after=last)
    assert replay.frames == [] and replay.finished and replay.complete_before


# -------------------------------------------------------------------------------------------------
# Following: replay then live, no gap, no duplicate
# -------------------------------------------------------------------------------------------------
async def _collect(follower: RunFollower, into: list, until_outcome: bool = True):
    async for item in follower.frames():
        if item is not None:
            into.append(item)


@pytest.mark.asyncio
async def test_follower_joins_replay_and_live_without_gap_or_duplicate(user):
    run, rec, start_seq = await sync_to_async(_started_run)(user, tools=3)
    rid = run.run_id
    received: list[Event] = []
    async with RunFollower(rid, after=0) as follower:
        # Published *after* subscription but already in the database: must not be sent twice.
        await publish(rid, RunEvent(session_id=run.session_id, run_id=rid, sequence_no=1))
        await publish(
            rid,
            ToolEvent(
                run_id=rid,
                tool_call_id="call_0",
                name="lookup_knowledge",
                status="RUNNING",
                sequence_no=start_seq,
            ),
        )
        task = asyncio.create_task(_collect(follower, received))
        await asyncio.sleep(0.1)
        await publish(rid, DraftEvent(run_id=rid, text="Check "))
        # call_1 starts and its live frame is lost (never published); call_2's frame arrives.
        await sync_to_async(rec.tool_started)(
            tool_call_id="call_1", tool_name="lookup_knowledge", input_params={"query": "q"}
        )
        seq2 = await sync_to_async(rec.tool_started)(
            tool_call_id="call_2", tool_name="lookup_knowledge", input_params={"query": "q"}
        )
        await publish(
            rid,
            ToolEvent(
                run_id=rid, tool_call_id="call_2", name="lookup_knowledge", status="RUNNING", sequence_no=seq2
            ),
        )
        await publish(rid, DraftEvent(run_id=rid, text="the replica."))
        await sync_to_async(rec.release)(decision=ReleaseDecision.PUBLISHED, reason="ok")
        end = await sync_to_async(rec.finish)(status=RunStatus.SUCCESS, content="Check the replica.")
        await publish(
            rid,
            OutcomeEvent(
                run_id=rid,
                status="SUCCESS",
                release_decision="PUBLISHED",
                content="Check the replica.",
                sequence_no=end,
            ),
        )
        await asyncio.wait_for(task, TIMEOUT)

    summary = [
        (
            f.type,
            ws_frame(f).get("toolCallId") or ws_frame(f).get("stage"),
            ws_frame(f).get("status"),
            ws_frame(f).get("text"),
        )
        for f in received
    ]
    assert summary == [
        ("run", None, None, None),
        # Committed before the subscription: replayed from the timeline.
        ("progress", "ROUTING", "FINISHED", None),
        ("progress", "MODEL_STEP", "FINISHED", None),
        ("tool", "call_0", "RUNNING", None),
        ("draft", None, None, "Check "),
        ("tool", "call_1", "RUNNING", None),  # recovered from the database before call_2
        ("tool", "call_2", "RUNNING", None),
        ("draft", None, None, "the replica."),
        # The release decision's progress (never published live here) is read back from the timeline.
        ("progress", "RELEASE", "FINISHED", None),
        # finish closed the three running tools ABANDONED; the follower reads them before the outcome.
        ("tool", "call_0", "ABANDONED", None),
        ("tool", "call_1", "ABANDONED", None),
        ("tool", "call_2", "ABANDONED", None),
        ("outcome", None, "SUCCESS", None),
    ]
    seqs = [sequence_of(f) for f in received if sequence_of(f) is not None]
    assert seqs == sorted(seqs) and len(seqs) == len(set(seqs))


@pytest.mark.asyncio
async def test_follower_finds_an_outcome_whose_live_frame_was_lost(user, monkeypatch):
    monkeypatch.setattr(live, "CATCHUP_SECONDS", 0.2)
    run, rec, _ = await sync_to_async(_started_run)(user)
    received: list[Event] = []
    async with RunFollower(run.run_id, after=0) as follower:
        task = asyncio.create_task(_collect(follower, received))
        await asyncio.sleep(0.05)
        await sync_to_async(rec.finish)(status=RunStatus.CANCELLED)  # nothing published
        await asyncio.wait_for(task, TIMEOUT)
    assert received[-1].type == "outcome" and ws_frame(received[-1])["status"] == "CANCELLED"
    assert ("call_0", "INTERRUPTED") in [
        (ws_frame(f).get("toolCallId"), ws_frame(f).get("status")) for f in received
    ]


@pytest.mark.asyncio
async def test_follower_of_a_finished_run_ends_after_replay(user):
    run = await sync_to_async(services.create_run)(
        session=await sync_to_async(services.create_session)(owner=user), query="q"
    )
    await sync_to_async(record_full_run)(run, tools=1)
    received: list[Event] = []
    async with RunFollower(run.run_id, after=0) as follower:
        await asyncio.wait_for(_collect(follower, received), TIMEOUT)
    assert [f.type for f in received if f.type != "progress"] == ["run", "tool", "tool", "outcome"]
    assert [f.stage for f in received if f.type == "progress"] == [
        "ROUTING",
        "MODEL_STEP",
        "MODEL_STEP",
        "EVIDENCE_GUARD",
        "SEMANTIC_GUARD",
        "RELEASE",
    ]


@pytest.mark.asyncio
async def test_follower_sends_heartbeats_while_idle(user, monkeypatch):
    run, _rec, _ = await sync_to_async(_started_run)(user)
    beats = 0
    async with RunFollower(run.run_id, after=10_000, heartbeat=0.05) as follower:
        async for item in follower.frames():
            if item is None:
                beats += 1
                if beats == 3:
                    break
    assert beats == 3


# -------------------------------------------------------------------------------------------------
# Sweeper
# -------------------------------------------------------------------------------------------------
def test_sweeper_fails_expired_runs_and_closes_their_tools(user, settings):
    settings.RUN_LEASE_SECONDS = 5
    expired, rec, _ = _started_run(user, tools=2)
    rec.tool_started(tool_call_id="call_1", tool_name="lookup_knowledge", input_params={"query": "q"})
    past = timezone.now() - dt.timedelta(seconds=1)
    DiagnosisRun.objects.filter(run_id=expired.run_id).update(lease_owner="host:123", lease_expires_at=past)
    alive, _, _ = _started_run(user)
    DiagnosisRun.objects.filter(run_id=alive.run_id).update(
        lease_owner="host:456", lease_expires_at=timezone.now() + dt.timedelta(seconds=30)
    )
    orphan = services.create_run(session=services.create_session(owner=user), query="never claimed")
    DiagnosisRun.objects.filter(run_id=orphan.run_id).update(
        created_at=timezone.now() - dt.timedelta(seconds=60)
    )
    fresh = services.create_run(session=services.create_session(owner=user), query="just created")

    swept = sweep_expired_runs()
    assert sorted(swept) == sorted([expired.run_id, orphan.run_id])
    expired.refresh_from_db()
    assert (expired.status, expired.error_code) == (RunStatus.FAILED, LEASE_EXPIRED)
    assert expired.lease_owner == "" and expired.lease_expires_at is None
    tools = ToolInvocation.objects.filter(run_id=expired.run_id)
    assert {t.status for t in tools} == {ToolStatus.FAILED}
    assert {t.error_code for t in tools} == {LEASE_EXPIRED}
    assert all(t.duration_ms is None for t in tools)  # no monotonic start in the sweeping process
    summary = get_trace(run=expired).summary
    assert summary.audit_complete and summary.chain_valid, summary.gaps
    assert summary.persisted == summary.expected
    for run in (alive, fresh):
        run.refresh_from_db()
        assert run.status in (RunStatus.RUNNING, RunStatus.PENDING)
    orphan.refresh_from_db()
    assert orphan.status == RunStatus.FAILED
    # A second sweep finds nothing; the command reports what it did.
    assert sweep_expired_runs() == []
    out = io.StringIO()
    call_command("sweep_runs", stdout=out)
    assert "swept 0 run(s)" in out.getvalue()


def test_sweeper_leaves_a_run_whose_owner_renewed_meanwhile(user, settings):
    run, _, _ = _started_run(user)
    past = timezone.now() - dt.timedelta(seconds=1)
    DiagnosisRun.objects.filter(run_id=run.run_id).update(lease_owner="host:1", lease_expires_at=past)
    from agent.runtime import sweeper

    candidates = sweeper.expired_runs()
    assert [c.run_id for c in candidates] == [run.run_id]
    # The owner renews between the sweeper's read and its claim.
    DiagnosisRun.objects.filter(run_id=run.run_id).update(
        lease_expires_at=timezone.now() + dt.timedelta(seconds=30)
    )
    assert not sweeper._claim(candidates[0], timezone.now())
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and run.lease_owner == "host:1"


@pytest.mark.asyncio
async def test_followers_of_a_swept_run_get_error_and_outcome(user, settings):
    run, _rec, _ = await sync_to_async(_started_run)(user)
    past = timezone.now() - dt.timedelta(seconds=1)
    await DiagnosisRun.objects.filter(run_id=run.run_id).aupdate(lease_owner="gone:1", lease_expires_at=past)
    received: list[Event] = []
    async with RunFollower(run.run_id, after=0) as follower:
        task = asyncio.create_task(_collect(follower, received))
        await asyncio.sleep(0.05)
        from agent.runtime.sweeper import publish_swept

        swept = await sync_to_async(sweep_expired_runs)()
        await publish_swept(swept)
        await asyncio.wait_for(task, TIMEOUT)
    assert [f.type for f in received][-2:] == ["error", "outcome"]
    assert ws_frame(received[-2])["code"] == LEASE_EXPIRED
    assert ws_frame(received[-1])["status"] == "FAILED"


@pytest.mark.asyncio
async def test_every_server_process_sweeps_periodically(user, settings):
    from agent.runtime import supervisor

    settings.RUN_SWEEP_INTERVAL_SECONDS = 0.1
    run, _rec, _ = await sync_to_async(_started_run)(user)
    past = timezone.now() - dt.timedelta(seconds=1)
    await DiagnosisRun.objects.filter(run_id=run.run_id).aupdate(lease_owner="gone:1", lease_expires_at=past)
    supervisor.ensure_background()
    supervisor.ensure_background()  # once per process: a second call starts nothing new
    try:
        for _ in range(100):
            await asyncio.sleep(0.05)
            status = (
                await DiagnosisRun.objects.filter(run_id=run.run_id).values_list("status", flat=True).aget()
            )
            if status == RunStatus.FAILED:
                break
        assert status == RunStatus.FAILED
        assert len([t for t in asyncio.all_tasks() if t.get_name() == "runs:sweeper"]) == 1
    finally:
        await supervisor.stop_background()
