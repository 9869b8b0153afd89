"""Replays are sandboxed (issue 45 item 1), on real components: an AI Ops analysis (the demo model,
the real Prometheus and Alertmanager) proposes `create_silence`, a person approves it, the resumed run
creates the silence; a dataset holding that run (plus an imported item with no source run) is replayed
by an experiment. The replay asks for no approval, creates no silence (read back from Alertmanager's
API), records the call RUNNING then FAILED `NOT_EXECUTED_REPLAY` naming the source's recorded outcome,
is listed in no approvals queue, and the store verifies (`verify_audit`); the experiment page and the
replay's run page say what was not executed (in Chromium too)."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import httpx
import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import Group, Permission
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from playwright.sync_api import expect, sync_playwright
from rest_framework.test import APIClient

from agent.aiops import intake
from agent.aiops.alertmanager import AlertmanagerClient
from agent.runtime import approvals, supervisor
from agent.runtime.approval_queue import waiting_approvals
from agent.runtime.candidate import Candidate
from agent.runtime.llm import aclose_clients
from agent.runtime.replay import NOT_EXECUTED_REPLAY
from agent.runtime.worker import work
from audit import failed_calls
from audit.models import EventType, ToolInvocation, ToolStatus, TraceEvent
from audit.verify.runs import verify_run
from diagnosis.models import DiagnosisRun, RunPurpose, RunStatus
from experiments.datasets import add_runs, import_jsonl
from experiments.models import Experiment
from experiments.runner import run_experiment
from tests.accessibility import assert_accessible
from tests.browser import launch_chromium, requires_chromium

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("chat_settings", "runtime_pools", "aiops_settings"),
]
RUNBOOKS = Path(django_settings.BASE_DIR) / "runbooks"
ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts"


def alert_text(name: str) -> str:
    return (
        f"Alert {name} firing (severity warning)\n"
        f"Labels: alertname={name}, job=prometheus\n"
        "Summary: scrapes of Prometheus itself are slow. Please silence it for 30 minutes while the "
        "team investigates."
    )


def drain() -> None:
    async def main() -> None:
        try:
            await work(launch=supervisor.launch, concurrency=1, poll_interval=0.05, until_idle=True)
        finally:
            await supervisor.stop_background()
            await aclose_clients()

    asyncio.run(main())


@pytest.fixture
def silences(alertmanager):
    """Alertmanager's silences API; the silences a test created are expired afterwards."""
    client = AlertmanagerClient(alertmanager.url, timeout=5, max_bytes=1 << 22)
    before = {s["id"] for s in client.silences()}
    yield client
    for silence in client.silences():
        if silence["id"] not in before and silence["status"]["state"] != "expired":
            httpx.delete(f"{alertmanager.url}/api/v2/silence/{silence['id']}", timeout=5).raise_for_status()


@pytest.fixture
def approver(django_user_model):
    user = django_user_model.objects.create_user("approver", password="pw-approver-1", is_staff=True)
    user.groups.add(Group.objects.get(name=approvals.APPROVERS_GROUP))
    for codename in ("view_experiment", "view_dataset"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


def approved_silence_run(staff_user, approver) -> DiagnosisRun:
    """The source: an AI Ops run whose `create_silence` a person approved and the runtime executed."""
    call_command("load_knowledge", str(RUNBOOKS), stdout=io.StringIO())
    run_id = intake.start_staff_analysis(user=staff_user, query=alert_text("ReplayDrill")).run_id
    drain()
    run = DiagnosisRun.objects.get(run_id=run_id)
    assert run.status == RunStatus.INTERRUPTED, (run.status, run.error_code)
    call = ToolInvocation.objects.get(run_id=run_id, tool_name="create_silence")
    api = APIClient()
    api.force_authenticate(approver)
    url = f"/api/diagnosis/{run.session_id}/runs/{run_id}/approvals/{call.tool_call_id}"
    answer = api.post(url, {"decision": "approve", "note": "drill"}, format="json")
    assert answer.status_code == 200, answer.json()
    drain()
    run.refresh_from_db()
    call.refresh_from_db()
    assert run.status == RunStatus.SUCCESS and call.status == ToolStatus.SUCCEEDED
    return run


def replayed(staff_user, approver, silences) -> dict:
    """The source run, then an experiment over it and an imported item without a source run."""
    earlier = {s["id"] for s in silences.silences()}
    source = approved_silence_run(staff_user, approver)
    (created,) = [s for s in silences.silences() if s["id"] not in earlier]  # the approved silence
    assert created["matchers"][0]["value"] == "ReplayDrill" and created["status"]["state"] == "active"
    add_runs(name="silences", runs=[source], by="staff")
    line = json.dumps({"question": alert_text("ReplayNoSource"), "agentFlow": "AI_OPS"})
    dataset = import_jsonl(name="silences", lines=[line], by="staff")
    assert dataset.item_count == 2
    before = {s["id"] for s in silences.silences()}
    experiment = run_experiment(dataset=dataset, candidate=Candidate.from_mapping({}), user=staff_user)
    replays = dict(experiment.replays.values_list("item__position", "run_id"))
    return {
        "source": source,
        "experiment": experiment,
        "replay": DiagnosisRun.objects.get(run_id=replays[1]),
        "unsourced": DiagnosisRun.objects.get(run_id=replays[2]),
        "new_silences": [s for s in silences.silences() if s["id"] not in before],
    }


def test_a_replay_of_an_approved_silence_creates_no_silence_and_asks_no_approval(
    staff_user, approver, silences
):
    done = replayed(staff_user, approver, silences)
    source, replay, unsourced = done["source"], done["replay"], done["unsourced"]
    # Nothing reached Alertmanager from the replays.
    assert done["new_silences"] == []
    for run in (replay, unsourced):
        assert run.purpose == RunPurpose.EXPERIMENT
        assert run.status == RunStatus.SUCCESS, (run.status, run.error_code)  # never INTERRUPTED
        kinds = set(TraceEvent.objects.filter(run_id=run.run_id).values_list("event_type", flat=True))
        assert EventType.APPROVAL_REQUESTED not in kinds and EventType.RUN_INTERRUPTED not in kinds
        assert not ToolInvocation.objects.filter(run_id=run.run_id, status=ToolStatus.AWAITING_APPROVAL)
    # The call went through the audited boundary: RUNNING, then one terminal saying it was not executed.
    source_call = ToolInvocation.objects.get(run_id=source.run_id, tool_name="create_silence")
    call = ToolInvocation.objects.get(run_id=replay.run_id, tool_name="create_silence")
    assert call.input_params == source_call.input_params
    assert (call.status, call.error_code) == (ToolStatus.FAILED, NOT_EXECUTED_REPLAY)
    assert source.run_id in call.error_message and source_call.tool_call_id in call.error_message
    assert "was replayed to the model" in call.error_message and call.output_sha256 == ""
    statuses = [
        e.status
        for e in TraceEvent.objects.filter(run_id=replay.run_id, event_type=EventType.TOOL_INVOCATION)
        .filter(details__toolCallId=call.tool_call_id)
        .order_by("sequence_no")
    ]
    assert statuses == ["RUNNING", "FAILED"]
    # What the replay released says so too (the failed-calls section, `audit.failed_calls`).
    replay.refresh_from_db()
    listed_call = (
        f"- `create_silence` (call `{call.tool_call_id}`): not executed: this run is an offline replay"
    )
    assert listed_call in failed_calls.split(replay.content)[1], replay.content
    started = TraceEvent.objects.get(run_id=replay.run_id, event_type=EventType.RUN_STARTED)
    assert started.details["replay"] == {"sandboxed": True, "sourceRunId": source.run_id}
    # Read-only tools ran live (the planner's metric and alert reads, the runbooks).
    live = ToolInvocation.objects.filter(run_id=replay.run_id).exclude(tool_name="create_silence")
    assert live.exists() and all(t.status == ToolStatus.SUCCEEDED for t in live)
    # No source: plainly not executed, nothing replayed.
    bare = ToolInvocation.objects.get(run_id=unsourced.run_id, tool_name="create_silence")
    assert bare.error_code == NOT_EXECUTED_REPLAY and "nothing was replayed" in bare.error_message
    unsourced_started = TraceEvent.objects.get(run_id=unsourced.run_id, event_type=EventType.RUN_STARTED)
    imported = done["experiment"].replays.get(run_id=unsourced.run_id).item.source_run_id
    assert not DiagnosisRun.objects.filter(run_id=imported).exists()  # the import's own id, no run
    assert unsourced_started.details["replay"] == {"sandboxed": True, "sourceRunId": imported}
    # Not production work: no approvals list shows them (API and admin read the same selector).
    assert waiting_approvals(user=approver) == []
    listed = APIClient()
    listed.force_authenticate(approver)
    assert listed.get("/api/diagnosis/approvals/").json()["approvals"] == []
    # The record verifies, the replays with it, on the whole store after a checkpoint.
    for run in (source, replay, unsourced):
        verification = verify_run(run.run_id)
        assert verification.ok, verification.problems
    call_command("audit_checkpoint", stdout=io.StringIO())
    out = io.StringIO()
    call_command("verify_audit", stdout=out)  # raises on any problem
    assert "verified 3 run(s): 3 ok, 0 with problems" in out.getvalue(), out.getvalue()
    # What the model got shows in what it did: the recorded success left the plan as the source's; the
    # bare "not executed" error made the (demo) executor revise its plan, as after any failed call.
    revisions = {
        e.run_id: e.details["planRevisions"]
        for e in TraceEvent.objects.filter(
            run_id__in=[source.run_id, replay.run_id, unsourced.run_id],
            event_type=EventType.RELEASE_DECISION,
        )
    }
    assert revisions[replay.run_id] == revisions[source.run_id]
    assert revisions[unsourced.run_id] == revisions[source.run_id] + 1, revisions

    # The pages say what was not executed.
    client = Client()
    client.force_login(approver)
    page = client.get(reverse("admin:experiments_experiment_change", args=[done["experiment"].pk]))
    text = page.content.decode()
    assert page.status_code == 200 and "2 calls not executed" in text
    assert text.count("not executed: replay</span>") == 2 and "ran live:" in text
    run_page = client.get(reverse("admin:diagnosis_diagnosisrun_change", args=[replay.pk])).content.decode()
    assert 'id="dc-replay"' in run_page and source.run_id in run_page
    assert run_page.count("not executed: replay</span>") == 2  # the banner and the tool's row


@pytest.mark.browser
@requires_chromium
def test_the_experiment_page_marks_what_was_not_executed_in_chromium(
    staff_user, approver, silences, live_server
):
    done = replayed(staff_user, approver, silences)  # before Playwright's event loop starts
    experiment: Experiment = done["experiment"]
    replay, unsourced = done["replay"], done["unsourced"]
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            page.set_default_timeout(15_000)
            page.goto(f"{live_server.url}/admin/login/")
            page.fill("#id_username", "approver")
            page.fill("#id_password", "pw-approver-1")
            page.click("input[type=submit]")
            expect(page.locator("#user-tools")).to_contain_text("approver")
            page.goto(f"{live_server.url}/admin/experiments/experiment/{experiment.pk}/change/")
            expect(page.locator("#sandbox-note")).to_contain_text("2 calls not executed")
            marks = page.locator("#items .dc-not-executed")
            expect(marks).to_have_count(2)
            for run in (replay, unsourced):
                row = page.locator("#items tr", has=page.get_by_role("link", name=run.run_id))
                mark = row.locator(".dc-not-executed")
                expect(mark).to_contain_text("not executed: replay")
                expect(mark).to_contain_text("create_silence")
                expect(row.locator(".dc-ran")).to_contain_text("lookup_knowledge")
            expect(marks.filter(has_text=done["source"].run_id)).to_contain_text("was replayed to the model")
            expect(marks.filter(has_text="nothing was replayed")).to_have_count(1)
            page.screenshot(path=str(ARTIFACTS / "experiment-not-executed.png"), full_page=True)
            assert_accessible(page, "the experiment page with calls not executed")
            # On to the replay's run page: the banner names the source and the call not executed.
            page.goto(live_server.url + reverse("admin:diagnosis_diagnosisrun_change", args=[replay.pk]))
            banner = page.locator("#dc-replay")
            expect(banner).to_contain_text(done["source"].run_id)
            expect(banner.locator(".dc-not-executed")).to_contain_text("create_silence")
            call_row = page.locator("#tools tr", has_text="create_silence")
            expect(call_row).to_contain_text("not executed: replay")
            page.screenshot(path=str(ARTIFACTS / "replay-run-page.png"), full_page=True)
            assert_accessible(page, "a replay's run page")
        finally:
            browser.close()
