"""Draining a process hands its runs over (issue 48): through the real runtime (supervisor, lease, the
fake provider over the `openai` SDK, the recorder), a run still executing when the drain's grace ends
stops at its agent's next step boundary, or has its model stream cut, is PENDING again with its state
saved, and is claimed under a new epoch by the adoption duty and finished: no model call repeated
(except the one whose stream was cut, recorded as such), no tool executed twice, the record verifies.
A draining process refuses new requests and says so on `/healthz`."""

from __future__ import annotations

import asyncio
import datetime as dt
import json

import pytest
from django.utils import timezone

from agent.runtime import drain, supervisor
from agent.runtime.db import db
from agent.runtime.executor import prepare_run
from agent.runtime.llm import aclose_clients
from agent.runtime.sweeper import sweep_expired_runs
from audit.models import AgentStep, EventType, ToolInvocation, TraceEvent
from audit.verify.runs import verify_run
from audit.write.refusal import RUN_REOPENED
from diagnosis import services
from diagnosis.models import DiagnosisRun, RunStatus
from tests.agent.runtime.support import AGENT, GUARD, ROUTE, ROUTER, VERDICT, evidence_ids
from tests.fakes.openai_server import stream_answer, stream_tool_calls, usage

pytestmark = pytest.mark.django_db(transaction=True)

QUERY = "Disk full on /var/log"


def _answer(request):
    return stream_answer(
        f"Find the largest log directories with du [{evidence_ids(request)[0]}].", usage=usage(300, 30)
    )


def _slow_answer(request):
    text = f"Find the largest log directories with du [{evidence_ids(request)[0]}]."
    return stream_answer(text, usage=usage(300, 30), delay=0.2, pieces=30)


def _script(llm, *, tool_delay: float = 0.0, answers=(_answer,)) -> None:
    llm.add(ROUTER, stream_answer(ROUTE, usage=usage(40, 10)))
    llm.add(
        AGENT,
        stream_tool_calls(
            [("call_1", "lookup_knowledge", '{"query": "disk full /var/log"}')],
            usage=usage(200, 20),
            delay=tool_delay,
        ),
        *answers,
    )
    llm.add(GUARD, stream_answer(VERDICT, usage=usage(100, 10)))


async def _drain_while(run_id: str, *, when, grace: float, window: float) -> drain.DrainReport:
    """Launch the run as a serving process does, wait until `when()` holds, then drain."""
    supervisor.launch(run_id)
    for _ in range(400):
        if await db(when):
            break
        await asyncio.sleep(0.025)
    else:
        raise AssertionError("the run never reached the state the drain was to find it in")
    return await drain.drain(grace=grace, window=window)


async def _adopt_and_finish(run_id: str) -> None:
    """Another serving process's adoption duty: claim the handed-over run and execute it to its end."""
    drain.reset()
    assert await supervisor.adopt_handed_over() == 1
    await _until_idle()


async def _until_idle() -> None:
    """Wait until this process executes no run, then stop as a serving process does."""
    for _ in range(400):
        if not supervisor.owned_runs():
            break
        await asyncio.sleep(0.025)
    await supervisor.stop_background()
    await aclose_clients()


def _events(run_id: str) -> list[TraceEvent]:
    return list(TraceEvent.objects.filter(run_id=run_id).order_by("sequence_no"))


def _handover(run_id: str) -> dict:
    (event,) = [e for e in _events(run_id) if e.event_type == EventType.RUN_INTERRUPTED]
    assert event.details["handover"] is True and event.status == RunStatus.PENDING
    return event.details


@pytest.fixture(autouse=True)
def _serving(settings):
    settings.RUN_ADOPT_INTERVAL_SECONDS = 0  # the test adopts itself, at the moment it chooses
    settings.RUN_SWEEP_INTERVAL_SECONDS = 0
    settings.AIOPS_WORKER_CONCURRENCY = 0
    yield
    drain.reset()


def test_a_run_draining_at_a_step_boundary_is_handed_over_and_nothing_is_asked_or_run_twice(
    llm, user, corpus
):
    _script(llm, tool_delay=0.1)
    run = prepare_run(user=user, query=QUERY)

    def streaming_the_tool_step():
        return len(llm.requests[AGENT]) == 1

    async def main():
        report = await _drain_while(run.run_id, when=streaming_the_tool_step, grace=0, window=5)
        handed = await db(DiagnosisRun.objects.get, run_id=run.run_id)
        await _adopt_and_finish(run.run_id)
        return report, handed

    report, handed = asyncio.run(main())
    assert (report.handed_over, report.cut, report.left) == (1, 0, 0)
    # Handed over: PENDING, no owner, a claim-by time; its state saved and its digest chained.
    assert handed.status == RunStatus.PENDING and handed.lease_owner == ""
    assert handed.lease_expires_at is not None
    details = _handover(run.run_id)
    assert details["retriedStep"] == 0 and details["stepsUsed"] == 1 and details["checkpointSha256"]

    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS and run.lease_epoch == handed.lease_epoch + 1
    # Each model call once: router, the tool step, the answer (by the new owner), the guard.
    assert [len(llm.requests[m]) for m in (ROUTER, AGENT, GUARD)] == [1, 2, 1]
    # The new owner's answer step saw the tool's result the first owner got: the tool ran once.
    assert evidence_ids(llm.requests[AGENT][1])
    assert ToolInvocation.objects.filter(run_id=run.run_id).count() == 1
    types = [e.event_type for e in _events(run.run_id)]
    assert types.index(EventType.RUN_INTERRUPTED) < types.index(EventType.RUN_RESUMED)
    assert types[-1] == EventType.RUN_FINISHED
    assert verify_run(run.run_id).ok


def test_a_model_stream_in_progress_at_the_deadline_is_cut_recorded_and_asked_again(llm, user, corpus):
    _script(llm, answers=(_slow_answer, _answer))
    run = prepare_run(user=user, query=QUERY)

    def streaming_the_answer():
        return len(llm.requests[AGENT]) == 2

    async def main():
        report = await _drain_while(run.run_id, when=streaming_the_answer, grace=0, window=0.3)
        await _adopt_and_finish(run.run_id)
        return report

    report = asyncio.run(main())
    assert (report.handed_over, report.cut, report.left) == (1, 1, 0)
    details = _handover(run.run_id)
    assert details["retriedStep"] == 2
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS
    # The cut step is recorded abandoned; the next owner asked again under the next index.
    steps = dict(AgentStep.objects.filter(run_id=run.run_id).values_list("step_index", "finish_reason"))
    assert steps == {1: "tool_calls", 2: "handover", 3: "stop"}
    assert [len(llm.requests[m]) for m in (ROUTER, AGENT, GUARD)] == [1, 3, 1]
    assert llm.requests[AGENT][2].messages == llm.requests[AGENT][1].messages
    assert ToolInvocation.objects.filter(run_id=run.run_id).count() == 1
    assert verify_run(run.run_id).ok


def test_a_run_that_finishes_within_the_grace_is_not_handed_over(llm, user, corpus):
    _script(llm)
    run = prepare_run(user=user, query=QUERY)

    async def main():
        report = await _drain_while(run.run_id, when=lambda: True, grace=20, window=1)
        await supervisor.stop_background()
        await aclose_clients()
        return report

    report = asyncio.run(main())
    assert (report.finished, report.handed_over, report.cut, report.left) == (1, 0, 0, 0)
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS
    assert not TraceEvent.objects.filter(run_id=run.run_id, event_type=EventType.RUN_INTERRUPTED).exists()


def test_a_run_launched_after_the_drain_began_is_handed_over_too(llm, user, corpus):
    """A request already past the draining check launches its run after the drain counted its runs: it
    hands over like them. (It went on unseen before, was cut off by the process's exit and failed
    LEASE_EXPIRED when its lease ran out: 1 of 8 rolling restarts.)"""
    _script(llm, tool_delay=0.1)
    _script(llm, tool_delay=0.1)
    first = prepare_run(user=user, query=QUERY)
    late = prepare_run(user=user, query=QUERY)

    async def main():
        supervisor.launch(first.run_id)
        for _ in range(400):
            if len(llm.requests[AGENT]) >= 1:
                break
            await asyncio.sleep(0.025)
        draining = asyncio.create_task(drain.drain(grace=20, window=5))
        while not drain.draining():
            await asyncio.sleep(0)
        await asyncio.sleep(0.05)  # the drain has counted the runs it found
        supervisor.launch(late.run_id)
        report = await draining
        handed = await db(DiagnosisRun.objects.get, run_id=late.run_id)
        await _adopt_and_finish(late.run_id)
        return report, handed

    report, handed = asyncio.run(main())
    assert (report.finished, report.handed_over, report.cut, report.left) == (1, 1, 0, 0)
    assert handed.status == RunStatus.PENDING and handed.lease_owner == ""
    assert _handover(late.run_id)["retriedStep"] == 0
    for run in (first, late):
        run.refresh_from_db()
        assert run.status == RunStatus.SUCCESS
        assert verify_run(run.run_id).ok
    assert ToolInvocation.objects.filter(run_id=late.run_id).count() <= 1


def test_nobody_claims_a_handed_over_run_twice(llm, user, corpus):
    _script(llm, tool_delay=0.1)
    run = prepare_run(user=user, query=QUERY)

    async def main():
        await _drain_while(run.run_id, when=lambda: len(llm.requests[AGENT]) == 1, grace=0, window=5)
        await supervisor.stop_background()
        await aclose_clients()

    asyncio.run(main())
    first = services.claim_handed_over(owner="host:1:a")
    assert first is not None and first.run_id == run.run_id
    assert services.claim_handed_over(owner="host:2:b") is None
    assert services.claim_run(run_id=run.run_id, owner="host:2:b") is None


async def _asgi(app, scope: dict, messages: list[dict]) -> list[dict]:
    sent: list[dict] = []
    inbox = list(messages)

    async def receive():
        return inbox.pop(0) if inbox else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    return sent


def test_a_draining_process_refuses_new_requests_and_health_says_draining(client):
    app = supervisor.BackgroundDuties(lambda scope, receive, send: None)
    drain.begin()
    try:
        http = {"type": "http", "path": "/api/chat", "method": "POST", "headers": []}
        sent = asyncio.run(_asgi(app, http, [{"type": "http.request", "body": b""}]))
        start, body = sent
        headers = dict(start["headers"])
        assert (
            start["status"] == 503 and headers[b"retry-after"] == b"1" and headers[b"connection"] == b"close"
        )
        assert json.loads(body["body"])["error"]["code"] == "service_draining"
        ws = {"type": "websocket", "path": "/ws/chat/", "headers": []}
        sent = asyncio.run(_asgi(app, ws, [{"type": "websocket.connect"}]))
        assert sent == [{"type": "websocket.accept"}, {"type": "websocket.close", "code": 1012}]
        health = client.get("/healthz")
        assert health.status_code == 503 and health.json() == {"status": "draining"}
    finally:
        drain.reset()


def test_a_finished_run_a_database_writer_reopens_is_never_resumed_nor_finished_again(llm, user, corpus):
    # Attack: flip a released run's row back to "handed over" (or to a lapsed RUNNING lease) so that the
    # adoption duty (or the sweeper) takes it; before, the service itself would have appended to the
    # finished chain and overwritten the released answer with a failure.

    runs = []
    for _ in range(2):
        _script(llm)
        runs.append(prepare_run(user=user, query=QUERY))
    for run in runs:
        asyncio.run(_execute_here(run.run_id))
    asked = sum(len(r) for r in llm.requests.values())
    events = {r.run_id: TraceEvent.objects.filter(run_id=r.run_id).count() for r in runs}
    soon, past = timezone.now() + dt.timedelta(seconds=30), timezone.now() - dt.timedelta(seconds=1)
    DiagnosisRun.objects.filter(run_id=runs[0].run_id).update(
        status=RunStatus.PENDING, lease_owner="", lease_expires_at=soon
    )
    DiagnosisRun.objects.filter(run_id=runs[1].run_id).update(
        status=RunStatus.RUNNING, lease_owner="gone:1:x", lease_expires_at=past
    )
    asyncio.run(_adopt_and_finish(runs[0].run_id))
    assert sweep_expired_runs() == [runs[1].run_id]  # ended on its row alone, nothing chained
    for run in runs:
        run.refresh_from_db()
        assert run.status == RunStatus.FAILED and run.error_code == RUN_REOPENED
        assert TraceEvent.objects.filter(run_id=run.run_id).count() == events[run.run_id]
        assert not verify_run(run.run_id).ok  # the row no longer matches what its chain ended with
    assert sum(len(r) for r in llm.requests.values()) == asked


async def _execute_here(run_id: str) -> None:
    """A serving process executing a new run to its end."""
    supervisor.launch(run_id)
    await _until_idle()
