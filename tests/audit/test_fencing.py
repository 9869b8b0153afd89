"""Fenced writers: every claim of a run's lease (executor or sweeper) increments `lease_epoch`, and every
recorder write for the run commits only while the epoch is still the one its writer claimed.

* a stale recorder (its process frozen past its lease, then swept) lands no row after the sweeper's
  RUN_FINISHED and cannot overwrite the sweeper's verdict; its refused writes are counted
  (`fenced_writes`, `summary.fencedWrites`), not taken for audit write failures, and the run verifies;
* a write refused while the new owner still holds the run is noted by it (WRITE_FENCED);
* in a group-commit batch a fenced op fails alone;
* the executor stops a run whose writes are fenced, and a heartbeat that cannot renew past the lease's
  expiry cancels the run's work;
* a real process frozen with SIGSTOP past a short lease, swept with `manage.py sweep_runs` and woken
  with SIGCONT lands nothing more.

`transaction=True`: the writes take the paths they take in production (autocommit, the MariaDB compound
statement, group commit batches written on other threads).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import io
import json
import os
import signal
import threading
import time

import httpx
import pytest
from django.core.management import CommandError, call_command
from django.db import OperationalError, connection
from django.utils import timezone

from agent.runtime import executor
from agent.runtime.cancel import CancelToken
from agent.runtime.sweeper import LEASE_EXPIRED, expired_runs, fail_run, sweep_expired_runs
from agent.runtime.tools.registry import default_registry
from audit.models import AgentStep, EventType, ToolInvocation, ToolStatus, TraceEvent
from audit.read import get_trace
from audit.write import DeclaredToolCall, RunRecorder
from audit.write.group_commit import get_committer
from diagnosis import services
from diagnosis.models import DiagnosisRun, ReleaseDecision, RunStatus
from reasoning.capture import build_capture
from reasoning.models import AgentReasoningAudit
from surfaces.api.audit_serializers import TraceSerializer
from surfaces.api.trace_render import trace_data
from tests.agent.runtime.support import AGENT, ask, in_every_runtime_thread
from tests.factories import issue_token, usage
from tests.fakes.openai_server import serving, stream_tool_calls
from tests.surfaces.chat.support import DaphneServer, ScriptedProvider, iter_sse, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def _claimed(user, owner: str = "executor-a") -> DiagnosisRun:
    session = services.create_session(owner=user)
    run = services.create_run(session=session, query="why is db-3 slow")
    claimed = services.claim_run(run_id=run.run_id, owner=owner)
    assert claimed is not None
    return claimed


def _expire(run: DiagnosisRun) -> None:
    DiagnosisRun.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - dt.timedelta(seconds=1))


def _step(rec: RunRecorder, index: int, *calls: str):
    return rec.model_step(
        step_index=index,
        agent_name="diagnosis_agent",
        model="m",
        usage=usage(10, 5),
        reasoning=build_capture(reasoning="thinking", text=""),
        tool_calls=[DeclaredToolCall(tool_call_id=c, name="lookup_knowledge", arguments="{}") for c in calls],
    )


def _stored(run_id: str) -> dict:
    """Everything stored for the run, as comparable values."""
    return {
        "events": list(
            TraceEvent.objects.filter(run_id=run_id)
            .order_by("sequence_no")
            .values_list("sequence_no", "event_type", "hash")
        ),
        "steps": list(AgentStep.objects.filter(run_id=run_id).values_list("step_index", "total_tokens")),
        "tools": list(
            ToolInvocation.objects.filter(run_id=run_id).values_list(
                "tool_call_id", "status", "output_sha256", "error_code"
            )
        ),
        "reasoning": AgentReasoningAudit.objects.filter(run_id=run_id).count(),
        "run": DiagnosisRun.objects.filter(run_id=run_id)
        .values(
            "status",
            "release_decision",
            "content",
            "error_code",
            "first_output_at",
            "intent",
            "expected_events",
        )
        .get(),
    }


def _verifies(run_id: str) -> None:
    out = io.StringIO()
    try:
        call_command("verify_audit", "--run", run_id, stdout=out)
    except CommandError as exc:  # pragma: no cover - the assertion names the problems
        raise AssertionError(out.getvalue()) from exc


def _summary(run: DiagnosisRun) -> dict:
    trace = get_trace(run=run)
    fast = trace_data(trace)
    assert json.dumps(fast) == json.dumps(TraceSerializer(trace).data)
    return fast["summary"]


# --------------------------------------------------------------------------------------------------
# Direct: a stale recorder after a sweep
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("group_commit", [False, True], ids=["direct", "group-commit"])
def test_a_stale_recorder_after_a_sweep_lands_nothing(user, group_commit):
    run = _claimed(user)
    stale = RunRecorder.for_run(run, group_commit=group_commit)
    assert stale.lease_epoch == run.lease_epoch == 1
    stale.run_started()
    _step(stale, 1, "c1")
    stale.tool_started(tool_call_id="c1", tool_name="lookup_knowledge", input_params={"query": "db-3"})

    _expire(run)  # the owner froze past its lease
    assert sweep_expired_runs() == [run.run_id]
    swept = _stored(run.run_id)
    assert swept["run"]["status"] == RunStatus.FAILED and swept["run"]["error_code"] == LEASE_EXPIRED
    assert swept["events"][-1][1] == EventType.RUN_FINISHED
    assert DiagnosisRun.objects.get(pk=run.pk).lease_epoch == 2

    # The owner wakes up and carries on: every kind of write is refused.
    assert stale.tool_finished(tool_call_id="c1", status=ToolStatus.SUCCEEDED, output="late result") is None
    assert _step(stale, 2) is None  # step + reasoning + two events, one transaction
    assert stale.evidence_guard(retry=False, passed=True, cited=["kb:x#1"]) is None  # one INSERT alone
    stale.mark_first_output()  # one UPDATE of the run row alone
    assert stale.release(decision=ReleaseDecision.PUBLISHED, reason="stale") is None
    assert stale.finish(status=RunStatus.SUCCESS, content="a stale answer") is None

    assert _stored(run.run_id) == swept
    run.refresh_from_db()
    assert (run.status, run.release_decision, run.content) == (RunStatus.FAILED, None, "")
    assert stale.fenced and stale.fenced_writes == run.fenced_writes >= 6
    assert stale.audit_write_failures == 0 and run.audit_write_failures == 0
    _verifies(run.run_id)
    summary = _summary(run)
    assert summary["fencedWrites"] == run.fenced_writes
    assert summary["auditComplete"] and summary["chainValid"]
    assert any("refused by the lease fence" in gap for gap in summary["gaps"])


@pytest.mark.django_db(transaction=False)
def test_a_stale_recorder_is_fenced_inside_a_callers_transaction(user):
    """The savepoint path (a caller's atomic block): the same refusal, nothing of it stored."""
    run = _claimed(user)
    stale = RunRecorder.for_run(run)
    stale.run_started()
    _expire(run)
    assert sweep_expired_runs() == [run.run_id]
    swept = _stored(run.run_id)
    assert _step(stale, 1) is None
    assert stale.finish(status=RunStatus.SUCCESS, content="stale") is None
    assert _stored(run.run_id) == swept
    assert DiagnosisRun.objects.get(pk=run.pk).fenced_writes == stale.fenced_writes == 3


def test_a_write_refused_before_the_sweeper_finishes_is_noted(user):
    run = _claimed(user)
    stale = RunRecorder.for_run(run)
    stale.run_started()
    _expire(run)
    (observed,) = expired_runs()
    epoch = services.claim_expired_run(run=observed, owner="sweeper:test")
    assert epoch == 2
    # Woken between the sweeper's claim and its writes.
    assert stale.routing_decision(intent="DIAGNOSIS", confidence=0.9, reason="r", fallback=False) is None
    assert fail_run(run.run_id, error_code=LEASE_EXPIRED, error_message="expired", lease_epoch=epoch)

    types = [e[1] for e in _stored(run.run_id)["events"]]
    assert types == [EventType.RUN_STARTED, EventType.WRITE_FENCED, EventType.RUN_FINISHED]
    note = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.WRITE_FENCED)
    assert note.details == {"fencedWrites": 1, "refusedSinceLastNote": 1}
    run.refresh_from_db()
    assert run.intent is None and run.status == RunStatus.FAILED and run.fenced_writes == 1
    _verifies(run.run_id)
    assert _summary(run)["fencedWrites"] == 1


def test_every_claim_takes_the_next_epoch_and_a_renewal_needs_the_current_one(user):
    session = services.create_session(owner=user)
    run = services.create_run(session=session, query="q")
    assert run.lease_epoch == 0
    claimed = services.claim_run(run_id=run.run_id, owner="a")
    assert claimed.lease_epoch == 1
    assert services.claim_run(run_id=run.run_id, owner="b") is None  # held
    assert services.renew_lease(run_id=run.run_id, owner="a", epoch=1) == "ok"
    _expire(run)
    (observed,) = expired_runs()
    assert services.claim_expired_run(run=observed, owner="sweeper") == 2
    assert services.claim_expired_run(run=observed, owner="sweeper-2") is None  # changed since read
    assert services.renew_lease(run_id=run.run_id, owner="a", epoch=1) == "lost"
    stored = DiagnosisRun.objects.get(pk=run.pk)
    assert (stored.lease_owner, stored.lease_epoch) == ("sweeper", 2)


# --------------------------------------------------------------------------------------------------
# Group commit
# --------------------------------------------------------------------------------------------------
def _wait_queued(committer, n):
    deadline = time.monotonic() + 20
    while committer.queued() < n:
        assert time.monotonic() < deadline, f"only {committer.queued()} of {n} writers queued"
        time.sleep(0.005)


def _passthrough(execute, sql, params, many, context):
    return execute(sql, params, many, context)


@pytest.mark.parametrize("wrapped", [False, True], ids=["as-in-production", "statement-by-statement"])
def test_a_fenced_op_in_a_batch_fails_only_itself(user, wrapped):
    """A batch of four runs' decisions, one of them from a recorder whose run was taken over: the
    batch is refused, retried op by op, and only that op fails (on MariaDB in production the batch is
    one compound statement; with an execute wrapper it is written statement by statement)."""
    runs = [_claimed(user, owner=f"owner-{i}") for i in range(4)]
    recorders = [RunRecorder.for_run(r, group_commit=True) for r in runs]
    for rec in recorders:
        rec.run_started()
    stale = recorders[0]
    DiagnosisRun.objects.filter(run_id=stale.run_id).update(lease_epoch=stale.lease_epoch + 1)  # taken over
    committer = get_committer()
    retried = committer.retried_batches
    errors: list[BaseException] = []

    def decide(rec):
        try:
            rec.routing_decision(intent="DIAGNOSIS", confidence=0.9, reason="r", fallback=False)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    with (
        committer.execute_wrapper(_passthrough) if wrapped else contextlib.nullcontext(),
        committer.hold(),
    ):
        threads = [threading.Thread(target=decide, args=(rec,)) for rec in recorders]
        for t in threads:
            t.start()
        _wait_queued(committer, len(recorders))
    for t in threads:
        t.join(30)
    assert not errors and not any(t.is_alive() for t in threads)
    assert committer.retried_batches == retried + 1
    assert stale.fenced_writes == 1 and stale.audit_write_failures == 0
    assert [e[1] for e in _stored(stale.run_id)["events"]] == [EventType.RUN_STARTED]
    assert DiagnosisRun.objects.get(run_id=stale.run_id).intent is None
    for rec in recorders[1:]:
        assert rec.fenced_writes == 0 and rec.audit_write_failures == 0
        assert [e[1] for e in _stored(rec.run_id)["events"]] == [
            EventType.RUN_STARTED,
            EventType.ROUTING_DECISION,
        ]
        assert DiagnosisRun.objects.get(run_id=rec.run_id).intent == "DIAGNOSIS"


# --------------------------------------------------------------------------------------------------
# The executor stops a fenced run
# --------------------------------------------------------------------------------------------------
@pytest.mark.usefixtures("runtime_pools")
def test_a_fenced_write_stops_the_run_and_its_ending_writes_nothing(llm, corpus, user):
    """While a tool runs, the run's lease is swept (the real sweeper); the tool's terminal write is
    refused, which trips the run's cancel: no further model call, nothing after RUN_FINISHED."""
    swept: dict = {}

    def takeover(q: str = "") -> dict:
        run = DiagnosisRun.objects.get(query="taken over")
        _expire(run)
        assert sweep_expired_runs() == [run.run_id]
        swept.update(_stored(run.run_id))
        return {"done": True}

    registry = default_registry().copy()
    registry.tool(
        name="takeover",
        description="test tool",
        parameters={"type": "object", "properties": {"q": {"type": "string"}}},
        timeout=None,
    )(takeover)
    llm.route("DIAGNOSIS")
    llm.add(AGENT, stream_tool_calls([("c_take", "takeover", "{}")]))
    run, outcome, _sink = ask(user, "taken over", registry=registry)

    assert len(llm.requests[AGENT]) == 1  # stopped before the next model call
    assert outcome.error_code == executor.LEASE_LOST and outcome.status == RunStatus.FAILED
    assert _stored(run.run_id) == swept
    assert (run.status, run.error_code) == (RunStatus.FAILED, LEASE_EXPIRED)
    assert run.fenced_writes >= 1 and run.audit_write_failures == 0
    _verifies(run.run_id)


class _FailLeaseRenewals:
    """Rejects the executor's lease renewals like an unreachable database would."""

    def __init__(self) -> None:
        self.fired = 0
        self.at: list[float] = []  # when each renewal was refused (monotonic)

    def __call__(self, execute, sql, params, many, context):
        if sql.lstrip().upper().startswith("UPDATE") and "lease_expires_at" in sql:
            self.fired += 1
            self.at.append(time.monotonic())
            raise OperationalError(1114, "The table is full")
        return execute(sql, params, many, context)


@pytest.mark.usefixtures("runtime_pools")
def test_a_heartbeat_that_cannot_renew_past_the_lease_cancels_the_run(user, settings):
    # A lease of three renewal intervals of 0.5 s: a loaded machine delays a renewal by a whole interval
    # rarely enough (0.3 s, whose 0.1 s intervals a busy CI run overran, made this test flaky).
    settings.RUN_LEASE_SECONDS = 1.5
    run = _claimed(user, owner=executor.lease_owner())

    async def main():
        token = CancelToken()
        started = time.monotonic()
        await asyncio.wait_for(
            executor._heartbeat(run.run_id, run.lease_epoch, token, claimed_at=started), timeout=10
        )
        return token, started, time.monotonic() - started

    with in_every_runtime_thread(_FailLeaseRenewals()) as faults:
        token, started, elapsed = asyncio.run(main())
    assert token.cancelled and token.lease_lost
    assert elapsed >= 1.5 and faults.fired >= 2  # retried while the lease held, then gave up
    # Every refusal but the last came while the lease held (each was retried); the last ended it.
    assert all(at < started + 1.5 for at in faults.at[:-1])


@pytest.mark.usefixtures("runtime_pools")
def test_a_heartbeat_that_finds_another_epoch_cancels_the_run(user, settings):
    settings.RUN_LEASE_SECONDS = 0.3
    run = _claimed(user, owner=executor.lease_owner())
    DiagnosisRun.objects.filter(pk=run.pk).update(lease_epoch=run.lease_epoch + 1)  # same owner name

    async def main():
        token = CancelToken()
        await asyncio.wait_for(
            executor._heartbeat(run.run_id, run.lease_epoch, token, claimed_at=time.monotonic()), timeout=10
        )
        return token

    token = asyncio.run(main())
    assert token.cancelled and token.lease_lost


# --------------------------------------------------------------------------------------------------
# A real process: SIGSTOP past a short lease, sweep, SIGCONT
# --------------------------------------------------------------------------------------------------
@pytest.fixture
def provider():
    with serving(ScriptedProvider()) as scripted:
        yield scripted


PROBE_SECONDS = 3.0
LEASE_SECONDS = 6  # heartbeat every 2 s


def _freeze_between_renewal_and_tool_end(server: DaphneServer, run_id: str, tool_started: float) -> None:
    """SIGSTOP the process right after a lease renewal that came late enough in the tool's run that the
    tool's end is due before the next renewal: on SIGCONT the woken pipeline writes before its heartbeat
    can find out that the run was taken over (the order a fence is needed for)."""
    interval = LEASE_SECONDS / 3
    last = DiagnosisRun.objects.get(run_id=run_id).lease_expires_at
    deadline = tool_started + PROBE_SECONDS
    while time.monotonic() < deadline:
        seen = DiagnosisRun.objects.get(run_id=run_id).lease_expires_at
        if seen != last:
            if time.monotonic() - tool_started > PROBE_SECONDS - interval + 0.1:
                os.kill(server.proc.pid, signal.SIGSTOP)
                return
            last = seen
        time.sleep(0.005)
    raise AssertionError("no lease renewal while the tool ran")


def test_a_frozen_process_swept_and_woken_lands_nothing(provider, user):
    token = issue_token(user)
    provider.tools = (("slow_probe", {"seconds": PROBE_SECONDS}),)
    env = {
        **provider.env(provider.base_url),
        "RUN_SWEEP_INTERVAL_SECONDS": "0",
        "RUN_LEASE_SECONDS": str(LEASE_SECONDS),
    }
    server = DaphneServer(env=env, app="tests.surfaces.chat.asgi:application", name="fence").start()
    try:
        with (
            httpx.Client(base_url=server.url, timeout=20) as client,
            client.stream(
                "POST",
                "/api/chat",
                json={"query": "Probe db-3 slowly"},
                headers={"Authorization": f"Token {token}"},
            ) as response,
        ):
            events = []
            for event in iter_sse(response):
                events.append(event)
                if event.event == "tool" and event.data["status"] == "RUNNING":
                    break
            _freeze_between_renewal_and_tool_end(server, events[0].data["runId"], time.monotonic())
        run_id = events[0].data["runId"]
        assert DiagnosisRun.objects.get(run_id=run_id).status == RunStatus.RUNNING

        wait_for(
            lambda: DiagnosisRun.objects.get(run_id=run_id).lease_expires_at < timezone.now(),
            LEASE_SECONDS + 5,
            message="the lease to expire",
        )
        out = io.StringIO()
        call_command("sweep_runs", stdout=out)
        assert "swept 1 run(s)" in out.getvalue()
        swept = _stored(run_id)
        assert swept["events"][-1][1] == EventType.RUN_FINISHED

        os.kill(server.proc.pid, signal.SIGCONT)  # the tool finishes, then the heartbeat renews
        wait_for(
            lambda: any(m in server.log_path.read_bytes() for m in (b"audit write fenced", b"lease lost")),
            15,
            message="the woken process to notice it lost the run",
        )
        time.sleep(1.0)  # anything still in flight would land now
        log = server.log_path.read_text(errors="replace")
    finally:
        _resume_if_stopped(server)
        server.stop()

    assert _stored(run_id) == swept, log[-3000:]
    run = DiagnosisRun.objects.get(run_id=run_id)
    assert (run.status, run.error_code, run.release_decision) == (RunStatus.FAILED, LEASE_EXPIRED, None)
    tool = ToolInvocation.objects.get(run_id=run_id)
    assert (tool.status, tool.error_code) == (ToolStatus.FAILED, LEASE_EXPIRED)
    assert run.audit_write_failures == 0
    _verifies(run_id)
    summary = _summary(run)
    assert summary["auditComplete"] and summary["fencedWrites"] == run.fenced_writes


def _resume_if_stopped(server: DaphneServer) -> None:
    """Never leave a stopped process behind (it would hold the test database)."""
    if server.proc is not None and server.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server.proc.pid, signal.SIGCONT)
