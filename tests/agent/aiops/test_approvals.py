"""Human approval of a risky tool call (issue 16, seed 002) on real components: an AI Ops analysis whose
alert asks for a silence proposes `create_silence`; the call is recorded AWAITING_APPROVAL and the run
INTERRUPTED with nothing executed; a person with `diagnosis.approve_tool_call` decides through the API;
a queue worker resumes the run under a new lease epoch and executes the approved call, under the same
`tool_call_id`, exactly once — the silence then exists in the real Alertmanager — or, rejected, the model
gets the recorded refusal and no silence exists. Double decisions, stale arguments, self-approval, expiry
and a cancel while waiting are refused or recorded; `verify_audit` passes across the interruption."""

from __future__ import annotations

import asyncio
import datetime as dt
import io
from pathlib import Path

import httpx
import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.utils import timezone
from rest_framework.test import APIClient

from agent.aiops import intake
from agent.aiops.alertmanager import AlertmanagerClient
from agent.runtime import approvals, supervisor
from agent.runtime.llm import aclose_clients
from agent.runtime.worker import work
from audit.models import EventType, ToolInvocation, ToolStatus, TraceEvent
from audit.verify.runs import verify_run
from diagnosis.models import DiagnosisRun, ReleaseDecision, RunStatus

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("chat_settings", "runtime_pools", "aiops_settings"),
]
RUNBOOKS = Path(django_settings.BASE_DIR) / "runbooks"


def alert_text(marker: str) -> str:
    return (
        f"Alert ApprovalDrill firing (severity warning)\n"
        f"Labels: alertname=ApprovalDrill, job=prometheus, case={marker}\n"
        "Summary: scrapes of Prometheus itself are slow. Please silence it for 30 minutes while the "
        "team investigates."
    )


def drain() -> int:
    async def main() -> int:
        try:
            return await work(launch=supervisor.launch, concurrency=2, poll_interval=0.05, until_idle=True)
        finally:
            await supervisor.stop_background()
            await aclose_clients()

    return asyncio.run(main())


@pytest.fixture(autouse=True)
def _expire_new_silences(alertmanager):
    """The Alertmanager is the session's: silences a test created are expired afterwards."""
    client = AlertmanagerClient(alertmanager.url, timeout=5, max_bytes=1 << 22)
    before = {s["id"] for s in client.silences()}
    yield
    for silence in client.silences():
        if silence["id"] not in before and silence["status"]["state"] != "expired":
            httpx.delete(f"{alertmanager.url}/api/v2/silence/{silence['id']}", timeout=5).raise_for_status()


@pytest.fixture
def approver(django_user_model):
    user = django_user_model.objects.create_user("approver", password="pw", is_staff=True)
    user.groups.add(Group.objects.get(name=approvals.APPROVERS_GROUP))
    return user


def client_for(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def interrupted_run(staff_user, marker: str) -> DiagnosisRun:
    call_command("load_knowledge", str(RUNBOOKS), stdout=io.StringIO())
    run_id = intake.start_staff_analysis(user=staff_user, query=alert_text(marker)).run_id
    drain()
    run = DiagnosisRun.objects.get(run_id=run_id)
    assert run.status == RunStatus.INTERRUPTED, (run.status, run.error_code)
    return run


def silence_call(run: DiagnosisRun) -> ToolInvocation:
    return ToolInvocation.objects.get(run_id=run.run_id, tool_name="create_silence")


def decide(client: APIClient, run: DiagnosisRun, tool_call_id: str, **body):
    url = f"/api/diagnosis/{run.session_id}/runs/{run.run_id}/approvals/{tool_call_id}"
    return client.post(url, body, format="json")


def events(run_id: str) -> list[TraceEvent]:
    return list(TraceEvent.objects.filter(run_id=run_id).order_by("sequence_no"))


def test_the_call_waits_and_nothing_runs_until_a_person_approves(staff_user, approver, aiops_settings):
    run = interrupted_run(staff_user, "approve")
    call = silence_call(run)
    assert call.status == ToolStatus.AWAITING_APPROVAL and call.started_at is None
    assert run.lease_owner == "" and run.lease_expires_at is None
    timeline = events(run.run_id)
    kinds = [e.event_type for e in timeline]
    assert kinds[-3:] == [EventType.TOOL_INVOCATION, EventType.APPROVAL_REQUESTED, EventType.RUN_INTERRUPTED]
    requested = timeline[-2].details
    assert requested["toolCallId"] == call.tool_call_id
    assert requested["argumentsDigest"] == approvals.arguments_digest(call.input_params)
    assert requested["approvers"] == {
        "permission": "diagnosis.approve_tool_call",
        "group": "Approvers",
        "requester": staff_user.username,
        "selfApproval": False,
    }
    assert not any(e.event_type == EventType.RUN_FINISHED for e in timeline)
    assert verify_run(run.run_id).ok
    from audit.read import get_trace

    summary = get_trace(run=run, viewer=approver).summary
    assert summary.persisted == summary.expected and summary.chain_valid
    # Nothing reached Alertmanager.
    alertmanager_url = aiops_settings.ALERTMANAGER_URL
    matcher = call.input_params["matchers"][0]["value"]
    assert matcher == "ApprovalDrill"
    before = {s["id"] for s in AlertmanagerClient(alertmanager_url, timeout=5, max_bytes=1 << 22).silences()}

    # The waiting call is listed for the approver, with the digest to send back.
    listed = client_for(approver).get("/api/diagnosis/approvals/").json()["approvals"]
    mine = [a for a in listed if a["runId"] == run.run_id]
    assert [a["toolCallId"] for a in mine] == [call.tool_call_id]
    digest = mine[0]["argumentsDigest"]

    answer = decide(
        client_for(approver),
        run,
        call.tool_call_id,
        decision="approve",
        note="ok for 30m",
        argumentsDigest=digest,
    )
    assert answer.status_code == 200, answer.json()
    assert answer.json()["decision"] == "APPROVED" and answer.json()["decidedBy"] == "approver"
    run.refresh_from_db()
    assert run.status == RunStatus.PENDING and run.lease_owner == ""
    # A second decision is refused.
    again = decide(client_for(approver), run, call.tool_call_id, decision="reject")
    assert again.status_code == 409 and again.json()["error"]["code"] == "not_waiting"

    epoch_before = run.lease_epoch
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS, (run.status, run.error_code)
    assert run.release_decision in (ReleaseDecision.PUBLISHED, ReleaseDecision.BLOCKED)
    assert run.lease_epoch == epoch_before + 1
    call.refresh_from_db()
    assert call.status == ToolStatus.SUCCEEDED and call.started_at is not None
    # Exactly once: one start, one terminal, one silence more in Alertmanager, with the approved matcher.
    tool_events = [
        e
        for e in events(run.run_id)
        if e.event_type == EventType.TOOL_INVOCATION and e.details.get("toolCallId") == call.tool_call_id
    ]
    assert [e.status for e in tool_events] == ["AWAITING_APPROVAL", "RUNNING", "SUCCEEDED"]
    client = AlertmanagerClient(alertmanager_url, timeout=5, max_bytes=1 << 22)
    created = [s for s in client.silences() if s["id"] not in before]
    assert len(created) == 1
    assert created[0]["matchers"][0]["name"] == "alertname"
    assert created[0]["matchers"][0]["value"] == "ApprovalDrill"
    assert created[0]["status"]["state"] == "active"
    decided = next(e for e in events(run.run_id) if e.event_type == EventType.APPROVAL_DECIDED)
    assert decided.details["decidedBy"] == "approver" and decided.details["note"] == "ok for 30m"
    # An accepted decision is recorded strictly before the request's recorded deadline.
    deadline = dt.datetime.fromisoformat(requested["expiresAt"])
    assert deadline == approvals.expiry_of(call.created_at)
    assert dt.datetime.fromisoformat(decided.details["decidedAt"]) < deadline
    assert decided.details["argumentsDigest"] == digest
    assert decided.details["arguments"] == call.input_params
    resumed = next(e for e in events(run.run_id) if e.event_type == EventType.RUN_RESUMED)
    assert resumed.sequence_no == decided.sequence_no + 1
    kinds = [e.event_type for e in events(run.run_id)]
    assert kinds.count(EventType.RUN_STARTED) == 1 and kinds.count(EventType.RUN_FINISHED) == 1
    assert created[0]["id"] in ToolInvocation.objects.get(pk=call.pk).output_preview
    # One gapless chain across the interruption, every row bound.
    assert [e.sequence_no for e in events(run.run_id)] == list(range(1, len(kinds) + 1))
    verification = verify_run(run.run_id)
    assert verification.ok, verification.problems
    # The command too, with the run anchored in the transparency log after it finished.
    call_command("audit_checkpoint", stdout=io.StringIO())
    out = io.StringIO()
    call_command("verify_audit", "--run", run.run_id, stdout=out)
    assert "FAIL" not in out.getvalue()


def test_a_rejected_call_never_reaches_alertmanager_and_the_model_gets_the_refusal(
    staff_user, approver, aiops_settings
):
    run = interrupted_run(staff_user, "reject")
    call = silence_call(run)
    before = AlertmanagerClient(aiops_settings.ALERTMANAGER_URL, timeout=5, max_bytes=1 << 22).silences()
    answer = decide(client_for(approver), run, call.tool_call_id, decision="reject", note="not now")
    assert answer.status_code == 200 and answer.json()["decision"] == "REJECTED"
    drain()
    run.refresh_from_db()
    call.refresh_from_db()
    assert run.status == RunStatus.SUCCESS
    assert call.status == ToolStatus.FAILED and call.error_code == "APPROVAL_REJECTED"
    assert "approver" in call.error_message and "not now" in call.error_message
    assert call.started_at is None
    after = AlertmanagerClient(aiops_settings.ALERTMANAGER_URL, timeout=5, max_bytes=1 << 22).silences()
    assert len(after) == len(before)
    verification = verify_run(run.run_id)
    assert verification.ok, verification.problems
    # The finished run projects into OpenTelemetry spans like any other (the rejected call never ran).
    from audit.read import get_trace
    from telemetry.spans import project_trace

    spans = project_trace(get_trace(run=run, viewer=approver))
    assert any("create_silence" in span.name for span in spans)


def test_refusals_self_approval_stale_arguments_permission_and_visibility(
    staff_user, approver, other_user, aiops_settings
):
    run = interrupted_run(staff_user, "refusals")
    call = silence_call(run)
    # The requester may not approve their own run's request (even with the permission) ...
    staff_user.groups.add(Group.objects.get(name=approvals.APPROVERS_GROUP))
    own = decide(client_for(staff_user), run, call.tool_call_id, decision="approve")
    assert own.status_code == 403 and own.json()["error"]["code"] == "self_approval"
    # ... a user without the permission may not decide ...
    stranger = decide(client_for(other_user), run, call.tool_call_id, decision="approve")
    assert stranger.status_code == 404  # the run is not theirs: not visible
    assert client_for(other_user).get("/api/diagnosis/approvals/").status_code == 403
    # ... arguments other than the ones recorded are refused ...
    stale = decide(client_for(approver), run, call.tool_call_id, decision="approve", argumentsDigest="0" * 64)
    assert stale.status_code == 409 and stale.json()["error"]["code"] == "arguments_changed"
    # ... and so is a tool row changed behind the recorder's back.
    ToolInvocation.objects.filter(pk=call.pk).update(
        input_params={**call.input_params, "duration_minutes": 999}
    )
    changed = decide(client_for(approver), run, call.tool_call_id, decision="approve")
    assert changed.status_code == 409 and changed.json()["error"]["code"] == "arguments_changed"
    ToolInvocation.objects.filter(pk=call.pk).update(input_params=call.input_params)
    unknown = decide(client_for(approver), run, "call_nope", decision="approve")
    assert unknown.status_code == 404
    # Nothing of that was recorded as a decision; the call still waits.
    assert not TraceEvent.objects.filter(run_id=run.run_id, event_type=EventType.APPROVAL_DECIDED).exists()
    run.refresh_from_db()
    assert run.status == RunStatus.INTERRUPTED


def test_self_approval_when_the_setting_allows_it(staff_user, aiops_settings):
    aiops_settings.APPROVAL_ALLOW_SELF = True
    run = interrupted_run(staff_user, "self")
    staff_user.groups.add(Group.objects.get(name=approvals.APPROVERS_GROUP))
    answer = decide(client_for(staff_user), run, silence_call(run).tool_call_id, decision="approve")
    assert answer.status_code == 200, answer.json()


def test_an_unanswered_request_expires_as_rejected(staff_user, aiops_settings):
    run = interrupted_run(staff_user, "expiry")
    call = silence_call(run)
    assert approvals.expire_due() == []  # not due yet
    later = timezone.now() + dt.timedelta(seconds=approvals.timeout_seconds() + 1)
    assert [d.run_id for d in approvals.expire_due(now=later)] == [run.run_id]
    decided = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.APPROVAL_DECIDED)
    assert decided.status == approvals.EXPIRED and decided.details["decidedBy"] is None
    drain()
    run.refresh_from_db()
    call.refresh_from_db()
    assert run.status == RunStatus.SUCCESS
    assert call.status == ToolStatus.FAILED and call.error_code == "APPROVAL_EXPIRED"
    assert verify_run(run.run_id).ok


def test_a_run_cancelled_while_waiting_closes_the_pending_call(staff_user, approver, aiops_settings):
    run = interrupted_run(staff_user, "cancel")
    call = silence_call(run)
    status = asyncio.run(supervisor.request_cancel(run.run_id))
    assert status == RunStatus.CANCELLED
    run.refresh_from_db()
    call.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert call.status == ToolStatus.INTERRUPTED and call.error_code == approvals.APPROVAL_CANCELLED
    kinds = [e.event_type for e in events(run.run_id)]
    assert kinds[-3:] == [EventType.TOOL_INVOCATION, EventType.RUN_CANCELLED, EventType.RUN_FINISHED]
    late = decide(client_for(approver), run, call.tool_call_id, decision="approve")
    assert late.status_code == 409
    verification = verify_run(run.run_id)
    assert verification.ok, verification.problems


def test_the_admin_lists_the_waiting_call_and_its_buttons_decide_it(staff_user, approver, client):
    run = interrupted_run(staff_user, "admin")
    call = silence_call(run)
    client.force_login(approver)
    listing = client.get("/admin/diagnosis/diagnosisrun/approvals/")
    assert listing.status_code == 200 and run.run_id in listing.content.decode()
    page = client.get(f"/admin/diagnosis/diagnosisrun/{run.pk}/change/")
    html = page.content.decode()
    assert page.status_code == 200 and 'id="approvals"' in html
    assert approvals.arguments_digest(call.input_params) in html and 'value="approve"' in html
    answer = client.post(
        f"/admin/diagnosis/diagnosisrun/{run.pk}/approvals/{call.tool_call_id}/",
        {
            "decision": "reject",
            "note": "from the admin",
            "argumentsDigest": approvals.arguments_digest(call.input_params),
        },
    )
    assert answer.status_code == 302
    decided = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.APPROVAL_DECIDED)
    assert decided.status == approvals.REJECTED and decided.details["note"] == "from the admin"
    run.refresh_from_db()
    assert run.status == RunStatus.PENDING


def test_the_progress_stream_reports_the_approval(staff_user, approver):
    from agent.runtime.events import ProgressEvent, Stage
    from agent.runtime.live import persisted_frames

    run = interrupted_run(staff_user, "progress")
    frames = persisted_frames(run.run_id, after=0).frames
    approval = [f for f in frames if isinstance(f, ProgressEvent) and f.stage == Stage.APPROVAL]
    assert [f.verdict for f in approval] == ["WAITING"]
    tool = [f for f in frames if getattr(f, "name", None) == "create_silence"]
    assert [f.status for f in tool] == ["AWAITING_APPROVAL"]
    decide(client_for(approver), run, silence_call(run).tool_call_id, decision="approve")
    frames = persisted_frames(run.run_id, after=0).frames
    approval = [f for f in frames if isinstance(f, ProgressEvent) and f.stage == Stage.APPROVAL]
    assert [f.verdict for f in approval] == ["WAITING", "APPROVED"]


def test_the_waterfall_shows_the_wait_for_approval(staff_user, approver):
    from audit.read import get_trace
    from surfaces.admin.waterfall import build_waterfall

    run = interrupted_run(staff_user, "waterfall")
    call = silence_call(run)
    waiting = [b for b in build_waterfall(get_trace(run=run, viewer=approver)).bars if b.kind == "approval"]
    assert [(b.sublabel, b.status, b.mode) for b in waiting] == [(call.tool_call_id, "WAITING", "unknown")]
    decide(client_for(approver), run, call.tool_call_id, decision="approve")
    drain()
    run.refresh_from_db()
    waterfall = build_waterfall(get_trace(run=run, viewer=approver))
    (bar,) = [b for b in waterfall.bars if b.kind == "approval"]
    assert (bar.status, bar.mode, bar.lane) == ("APPROVED", "measured", "executor")
    assert {m.label for m in waterfall.markers} >= {"interrupted", "resumed"}


def test_an_approved_call_whose_declaring_step_is_not_in_the_run_is_refused(
    staff_user, approver, aiops_settings
):
    """Fail-closed: the approved start looks for the declaring step in the database, in this run and its
    session; a step moved to another session (a tampered record) makes the start refused, never run."""
    from audit.models import AgentStep

    run = interrupted_run(staff_user, "fail-closed")
    call = silence_call(run)
    before = {
        s["id"]
        for s in AlertmanagerClient(aiops_settings.ALERTMANAGER_URL, timeout=5, max_bytes=1 << 22).silences()
    }
    assert decide(client_for(approver), run, call.tool_call_id, decision="approve").status_code == 200
    AgentStep.objects.filter(
        run_id=run.run_id, agent_name=call.agent_name, step_index=call.step_index
    ).update(session_id="ses_someone_else")
    drain()
    call.refresh_from_db()
    assert call.started_at is None and call.status != ToolStatus.SUCCEEDED
    refused = TraceEvent.objects.get(
        run_id=run.run_id, event_type=EventType.TOOL_INVOCATION, status="REFUSED"
    )
    assert refused.details["reason"] == "DECLARING_STEP_NOT_FOUND"
    after = {
        s["id"]
        for s in AlertmanagerClient(aiops_settings.ALERTMANAGER_URL, timeout=5, max_bytes=1 << 22).silences()
    }
    assert after == before
    # The tampering itself is named by the verification.
    assert not verify_run(run.run_id).ok


def test_a_connected_client_is_told_live_that_the_run_waits_for_approval(staff_user):
    """The live events of the attempt that ends waiting: the tool frame AWAITING_APPROVAL and the
    APPROVAL progress frame (WAITING) right after APPROVAL_REQUESTED committed; no outcome."""
    from agent.runtime.events import OutcomeEvent, ProgressEvent, Stage, ToolEvent
    from agent.runtime.executor import execute_run

    class Collect:
        def __init__(self) -> None:
            self.events = []

        async def emit(self, event) -> None:
            self.events.append(event)

    call_command("load_knowledge", str(RUNBOOKS), stdout=io.StringIO())
    run_id = intake.start_staff_analysis(user=staff_user, query=alert_text("live")).run_id
    sink = Collect()

    async def main():
        try:
            return await execute_run(run_id=run_id, sink=sink)
        finally:
            await supervisor.stop_background()
            await aclose_clients()

    assert asyncio.run(main()).status == RunStatus.INTERRUPTED
    waiting = [e for e in sink.events if isinstance(e, ProgressEvent) and e.stage == Stage.APPROVAL]
    assert [(e.verdict, e.sequence_no is not None) for e in waiting] == [("WAITING", True)]
    requested = TraceEvent.objects.get(run_id=run_id, event_type=EventType.APPROVAL_REQUESTED)
    assert waiting[0].sequence_no == requested.sequence_no
    tools = [e for e in sink.events if isinstance(e, ToolEvent) and e.name == "create_silence"]
    assert [e.status for e in tools] == ["AWAITING_APPROVAL"]
    assert not any(isinstance(e, OutcomeEvent) for e in sink.events)


def test_a_decided_run_cancelled_before_a_worker_claims_it_never_runs_the_call(staff_user, approver):
    run = interrupted_run(staff_user, "cancel-decided")
    call = silence_call(run)
    assert decide(client_for(approver), run, call.tool_call_id, decision="approve").status_code == 200
    run.refresh_from_db()
    assert run.status == RunStatus.PENDING
    assert asyncio.run(supervisor.request_cancel(run.run_id)) == RunStatus.CANCELLED
    drain()  # nothing left for a worker
    run.refresh_from_db()
    call.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and call.started_at is None
    assert (call.status, call.error_code) == (ToolStatus.INTERRUPTED, approvals.APPROVAL_CANCELLED)
    assert verify_run(run.run_id).ok


def _past_the_deadline(call: ToolInvocation) -> dt.datetime:
    """Wait (real time, no clock patching) until the call's deadline has passed; returns the deadline."""
    import time

    deadline = approvals.expiry_of(call.created_at)
    remaining = (deadline - timezone.now()).total_seconds()
    if remaining > 0:
        time.sleep(remaining + 0.05)
    assert approvals.is_expired(call.created_at, now=timezone.now())
    return deadline


def test_the_deadline_rule_expires_at_the_instant_itself():
    requested_at = timezone.now()
    deadline = approvals.expiry_of(requested_at)
    assert deadline - requested_at == dt.timedelta(seconds=approvals.timeout_seconds())
    assert not approvals.is_expired(requested_at, now=deadline - dt.timedelta(microseconds=1))
    assert approvals.is_expired(requested_at, now=deadline)
    # The sweeper's SQL bound is the same rule.
    assert approvals.expired_if_requested_by(deadline) == requested_at


def test_a_decision_after_the_deadline_is_refused_and_recorded_as_the_expiry(
    staff_user, approver, aiops_settings
):
    """No sweep runs (RUN_SWEEP_INTERVAL_SECONDS=0): the API refuses the late approval with 409 `expired`
    and records what the sweeper would have, the run resumes to refuse the call; nothing reaches
    Alertmanager, and a second late decision or a later sweep records nothing more."""
    aiops_settings.APPROVAL_TIMEOUT_SECONDS = 2
    run = interrupted_run(staff_user, "late-api")
    call = silence_call(run)
    requested = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.APPROVAL_REQUESTED)
    deadline = _past_the_deadline(call)
    # The recorded deadline is the one decisions are held to (one rule, applied to the row's time).
    assert dt.datetime.fromisoformat(requested.details["expiresAt"]) == deadline
    listed = client_for(approver).get("/api/diagnosis/approvals/").json()["approvals"]
    (mine,) = [a for a in listed if a["runId"] == run.run_id]
    assert dt.datetime.fromisoformat(mine["expiresAt"].replace("Z", "+00:00")) == deadline
    before = AlertmanagerClient(aiops_settings.ALERTMANAGER_URL, timeout=5, max_bytes=1 << 22).silences()

    late = decide(client_for(approver), run, call.tool_call_id, decision="approve", note="too late")
    assert late.status_code == 409, late.json()
    error = late.json()["error"]
    assert error["code"] == "expired" and deadline.isoformat() in error["message"]
    (decided,) = TraceEvent.objects.filter(run_id=run.run_id, event_type=EventType.APPROVAL_DECIDED)
    assert decided.status == approvals.EXPIRED
    assert decided.details["decidedBy"] is None and decided.details["note"] == ""
    assert dt.datetime.fromisoformat(decided.details["decidedAt"]) >= deadline
    run.refresh_from_db()
    assert run.status == RunStatus.PENDING
    # Refused again, as expired, with nothing more recorded; the sweeper finds nothing left to expire.
    again = decide(client_for(approver), run, call.tool_call_id, decision="reject")
    assert again.status_code == 409 and again.json()["error"]["code"] == "expired"
    assert approvals.expire_due() == []
    assert TraceEvent.objects.filter(run_id=run.run_id, event_type=EventType.APPROVAL_DECIDED).count() == 1

    drain()
    run.refresh_from_db()
    call.refresh_from_db()
    assert run.status == RunStatus.SUCCESS, (run.status, run.error_code)
    assert (call.status, call.error_code, call.started_at) == (ToolStatus.FAILED, "APPROVAL_EXPIRED", None)
    after = AlertmanagerClient(aiops_settings.ALERTMANAGER_URL, timeout=5, max_bytes=1 << 22).silences()
    assert len(after) == len(before)
    # After the resumption the answer stays `expired`, not a generic conflict.
    resumed = decide(client_for(approver), run, call.tool_call_id, decision="approve")
    assert resumed.status_code == 409 and resumed.json()["error"]["code"] == "expired"
    verification = verify_run(run.run_id)
    assert verification.ok, verification.problems


def test_the_admin_refuses_a_late_decision_with_a_clear_message(staff_user, approver, client, aiops_settings):
    aiops_settings.APPROVAL_TIMEOUT_SECONDS = 2
    run = interrupted_run(staff_user, "late-admin")
    call = silence_call(run)
    deadline = _past_the_deadline(call)
    client.force_login(approver)
    answer = client.post(
        f"/admin/diagnosis/diagnosisrun/{run.pk}/approvals/{call.tool_call_id}/",
        {"decision": "approve", "argumentsDigest": approvals.arguments_digest(call.input_params)},
        follow=True,
    )
    assert answer.status_code == 200
    shown = [str(m) for m in answer.context["messages"]]
    assert shown == [
        f"Not decided (expired): The approval request expired at {deadline.isoformat()}: the decision was "
        "not taken; the call is recorded as expired (treated as rejected) and the run continues without it."
    ]
    assert shown[0] in answer.content.decode()
    decided = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.APPROVAL_DECIDED)
    assert decided.status == approvals.EXPIRED and decided.details["decidedBy"] is None
    run.refresh_from_db()
    assert run.status == RunStatus.PENDING
    # The run page no longer offers the buttons.
    page = client.get(f"/admin/diagnosis/diagnosisrun/{run.pk}/change/").content.decode()
    assert 'value="approve"' not in page
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS
    assert verify_run(run.run_id).ok
