"""Seed 002's terminal rules around an interruption (issue 16, deliverable 4), with the real
Alertmanager: a bare tool error observed in the step whose other call waits for approval is not a
terminal — the run's verdict decides. INTERRUPTED keeps the call pending and the resumed run runs it
again under the same id; CANCELLED and FAILED (the saved state lost: RESUME_STATE_UNAVAILABLE) close it
with the observed error, beside the waiting call; in a step that cannot be interrupted the error is the
terminal at once."""

from __future__ import annotations

import asyncio
import io
import json
from dataclasses import replace
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.core.cache import caches
from django.core.management import call_command

from agent.aiops import intake
from agent.runtime import approvals, supervisor
from agent.runtime.demo import DemoModelClient
from agent.runtime.events import NullSink
from agent.runtime.executor import RESUME_STATE_UNAVAILABLE, execute_run
from agent.runtime.llm import aclose_clients
from agent.runtime.tools.registry import FLOW_AI_OPS, default_registry
from audit.models import EventType, ToolInvocation, ToolStatus, TraceEvent
from audit.verify.runs import verify_run
from audit.write import DeclaredToolCall
from diagnosis.models import DiagnosisRun, RunStatus

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("chat_settings", "runtime_pools", "aiops_settings"),
]
RUNBOOKS = Path(django_settings.BASE_DIR) / "runbooks"
ALERT = (
    "Alert ApprovalFlaky firing (severity warning)\n"
    "Labels: alertname=ApprovalFlaky, job=prometheus\n"
    "Summary: a drill. Please silence it for 15 minutes."
)


class Probe:
    """`flaky_probe`: raises on its first call (a bare tool error), answers on the next ones."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, target: str) -> dict:
        self.calls += 1
        if self.calls == 1:
            raise ConnectionError("probe target reset the connection")
        return {"target": target, "ok": True}


class SilenceWithProbe(DemoModelClient):
    """The demo model, whose step that proposes a silence also calls `flaky_probe` (in parallel)."""

    async def complete(self, **kwargs):
        result = await super().complete(**kwargs)
        if any(c.name == "create_silence" for c in result.tool_calls):
            n = len(result.tool_calls)
            probe = DeclaredToolCall(
                tool_call_id=f"call_probe_{n}", name="flaky_probe", arguments=json.dumps({"target": "db-3"})
            )
            result = replace(result, tool_calls=(*result.tool_calls, probe))
        return result


def registry(probe: Probe):
    tools = default_registry(flow=FLOW_AI_OPS).copy()
    tools.tool(
        name="flaky_probe",
        description="Probe a target.",
        parameters={
            "type": "object",
            "properties": {"target": {"type": "string", "minLength": 1}},
            "required": ["target"],
            "additionalProperties": False,
        },
        flows=(FLOW_AI_OPS,),
    )(probe)
    return tools


def execute(run_id: str, probe: Probe):
    async def main():
        try:
            return await execute_run(
                run_id=run_id,
                sink=NullSink(),
                client=SilenceWithProbe(delta_delay=0),
                registry=registry(probe),
            )
        finally:
            await supervisor.stop_background()
            await aclose_clients()

    return asyncio.run(main())


def interrupted(staff_user, probe: Probe) -> DiagnosisRun:
    call_command("load_knowledge", str(RUNBOOKS), stdout=io.StringIO())
    run_id = intake.start_staff_analysis(user=staff_user, query=ALERT).run_id
    outcome = execute(run_id, probe)
    assert outcome.status == RunStatus.INTERRUPTED
    return DiagnosisRun.objects.get(run_id=run_id)


def tool(run: DiagnosisRun, name: str) -> ToolInvocation:
    return ToolInvocation.objects.get(run_id=run.run_id, tool_name=name)


def statuses(run: DiagnosisRun, tool_call_id: str) -> list[str]:
    return [
        e.status
        for e in TraceEvent.objects.filter(run_id=run.run_id, event_type=EventType.TOOL_INVOCATION).order_by(
            "sequence_no"
        )
        if e.details.get("toolCallId") == tool_call_id
    ]


def approve(run: DiagnosisRun, approver) -> None:
    approvals.decide(
        run=run,
        tool_call_id=tool(run, "create_silence").tool_call_id,
        decision=approvals.APPROVED,
        user=approver,
    )


@pytest.fixture
def approver(django_user_model):
    from django.contrib.auth.models import Group

    user = django_user_model.objects.create_user("approver", is_staff=True)
    user.groups.add(Group.objects.get(name=approvals.APPROVERS_GROUP))
    return user


def test_interrupted_keeps_the_errored_call_pending_and_the_resumption_runs_it_again(staff_user, approver):
    probe = Probe()
    run = interrupted(staff_user, probe)
    flaky = tool(run, "flaky_probe")
    # The bare error is an observation: no terminal while the run may still be interrupted.
    assert flaky.status == ToolStatus.RUNNING and probe.calls == 1
    assert statuses(run, flaky.tool_call_id) == ["RUNNING", "ERROR_OBSERVED"]
    stopped = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.RUN_INTERRUPTED)
    assert stopped.details["keptPending"] == [flaky.tool_call_id]
    assert verify_run(run.run_id).ok
    approve(run, approver)
    assert execute(run.run_id, probe).status == RunStatus.SUCCESS
    flaky.refresh_from_db()
    assert flaky.status == ToolStatus.SUCCEEDED and probe.calls == 2
    assert statuses(run, flaky.tool_call_id) == ["RUNNING", "ERROR_OBSERVED", "RUNNING", "SUCCEEDED"]
    assert tool(run, "create_silence").status == ToolStatus.SUCCEEDED
    verification = verify_run(run.run_id)
    assert verification.ok, verification.problems


def test_cancelled_while_waiting_closes_both_the_waiting_and_the_errored_call(staff_user):
    run = interrupted(staff_user, Probe())
    assert approvals.cancel_waiting(run=run)
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    silence, flaky = tool(run, "create_silence"), tool(run, "flaky_probe")
    assert (silence.status, silence.error_code) == (ToolStatus.INTERRUPTED, approvals.APPROVAL_CANCELLED)
    # Closed by the run's verdict, with the error that was observed.
    assert (flaky.status, flaky.error_code) == (ToolStatus.INTERRUPTED, "TOOL_ERROR")
    assert "reset the connection" in flaky.error_message
    assert verify_run(run.run_id).ok


def test_failed_resumption_closes_the_pending_calls(staff_user, approver):
    probe = Probe()
    run = interrupted(staff_user, probe)
    caches["canonical"].delete(f"run:{run.run_id}:state:checkpoint")  # the saved state is gone
    approve(run, approver)
    outcome = execute(run.run_id, probe)
    assert (outcome.status, outcome.error_code) == (RunStatus.FAILED, RESUME_STATE_UNAVAILABLE)
    silence, flaky = tool(run, "create_silence"), tool(run, "flaky_probe")
    assert (silence.status, silence.error_code) == (ToolStatus.FAILED, "RUN_FAILED")
    assert (flaky.status, flaky.error_code) == (ToolStatus.FAILED, "TOOL_ERROR")
    assert probe.calls == 1  # nothing ran again, the silence was never created
    assert verify_run(run.run_id).ok


def test_without_an_interruption_the_observed_error_is_the_terminal(staff_user, aiops_settings):
    """A silence whose arguments are refused asks for no approval, so the step cannot end in an
    interruption: the probe's error is its FAILED terminal at once, never an observation."""
    aiops_settings.APPROVAL_SILENCE_MAX_SECONDS = 600  # 15 minutes is now over the maximum
    call_command("load_knowledge", str(RUNBOOKS), stdout=io.StringIO())
    run_id = intake.start_staff_analysis(user=staff_user, query=ALERT).run_id
    probe = Probe()
    assert execute(run_id, probe).status == RunStatus.SUCCESS
    run = DiagnosisRun.objects.get(run_id=run_id)
    silence, flaky = tool(run, "create_silence"), tool(run, "flaky_probe")
    assert (silence.status, silence.error_code) == (ToolStatus.FAILED, "TOOL_BAD_ARGUMENTS")
    assert (flaky.status, flaky.error_code) == (ToolStatus.FAILED, "TOOL_ERROR")
    assert statuses(run, flaky.tool_call_id) == ["RUNNING", "FAILED"]
    assert verify_run(run.run_id).ok


def test_lease_expiry_of_the_resuming_worker_closes_the_pending_calls(staff_user, approver):
    import datetime as dt

    from django.utils import timezone

    from agent.runtime.sweeper import LEASE_EXPIRED, sweep_expired_runs
    from audit.write import RunRecorder
    from diagnosis import services

    run = interrupted(staff_user, Probe())
    approve(run, approver)
    # A worker claims the decided run, records RUN_RESUMED and dies before running anything.
    claimed = services.claim_next_queued(owner="dead-worker")
    assert claimed.run_id == run.run_id
    RunRecorder.resume(run.run_id, lease_epoch=claimed.lease_epoch).run_resumed(
        details={"leaseOwner": "dead"}
    )
    later = timezone.now() + dt.timedelta(seconds=services.lease_seconds() + 1)
    assert sweep_expired_runs(now=later) == [run.run_id]
    run.refresh_from_db()
    assert (run.status, run.error_code) == (RunStatus.FAILED, LEASE_EXPIRED)
    silence, flaky = tool(run, "create_silence"), tool(run, "flaky_probe")
    assert silence.status == ToolStatus.FAILED and silence.started_at is None  # never executed
    assert (flaky.status, flaky.error_code) == (ToolStatus.FAILED, "TOOL_ERROR")
    verification = verify_run(run.run_id)
    assert verification.ok, verification.problems
