"""Approvals across server processes and in the browser (issue 16), on the real stack: daphne processes
of the product with Redis (channel layer and canonical store), the real Alertmanager and Prometheus,
the demo model.

* One daphne process's queue worker runs the analysis until the silence waits for approval
  (INTERRUPTED); that process is stopped; a second process takes the decision through its API and its
  own queue worker resumes the run under a new lease (another `lease_owner`, the next epoch) and creates
  the silence — read back from Alertmanager's API. The chain verifies across both processes.
* In headless Chromium an approver opens the admin's list of waiting calls, the run page, and rejects
  one call and approves another with the run page's buttons; the approved silence exists, the rejected
  one does not."""

from __future__ import annotations

import io
import time
from pathlib import Path

import httpx
import pytest
import redis
from django.conf import settings as django_settings
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.contrib.auth.models import Group
from django.core.management import call_command
from playwright.sync_api import expect, sync_playwright

from agent.aiops import intake
from agent.aiops.alertmanager import AlertmanagerClient
from agent.runtime import approvals
from audit.models import EventType, ToolInvocation, ToolStatus, TraceEvent
from audit.verify.runs import verify_run
from diagnosis.models import DiagnosisRun, RunStatus
from tests.accessibility import assert_accessible
from tests.browser import launch_chromium, requires_chromium
from tests.factories import issue_token
from tests.surfaces.chat.support import ARTIFACTS, DaphneServer, iter_sse

pytestmark = pytest.mark.django_db(transaction=True)
REDIS_URL = "redis://127.0.0.1:6379/0"
RUNBOOKS = Path(django_settings.BASE_DIR) / "runbooks"
PASSWORD = "pw-approver-browser-1"


def alert(name: str) -> str:
    return (
        f"Alert {name} firing (severity warning)\n"
        f"Labels: alertname={name}, job=prometheus\n"
        "Summary: a drill. Please silence it for 20 minutes while the team investigates."
    )


def wait_for(predicate, *, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def redis_available() -> bool:
    try:
        return bool(redis.Redis.from_url(REDIS_URL, socket_timeout=1).ping())
    except redis.RedisError:
        return False


@pytest.fixture
def product_env(prometheus, alertmanager):
    if not redis_available():
        pytest.skip("needs Redis on 127.0.0.1:6379 (scripts/redis.sh)")
    call_command("load_knowledge", str(RUNBOOKS), stdout=io.StringIO())
    return {
        "REDIS_URL": REDIS_URL,
        "AIOPS_WORKER_CONCURRENCY": "1",
        "AIOPS_POLL_INTERVAL_SECONDS": "0.2",
        "PROMETHEUS_URL": prometheus.url,
        "ALERTMANAGER_URL": alertmanager.url,
        "RUN_SWEEP_INTERVAL_SECONDS": "0",
        "AUDIT_CHECKPOINT_INTERVAL_SECONDS": "0",
        "AUDIT_PURGE_INTERVAL_SECONDS": "0",
    }


@pytest.fixture
def servers():
    started: list[DaphneServer] = []

    def start(env: dict[str, str], name: str) -> DaphneServer:
        server = DaphneServer(env=env, name=name).start()
        started.append(server)
        # A process starts its background duties (the queue worker) with its first connection.
        httpx.get(f"{server.url}/admin/login/", timeout=20).raise_for_status()
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def approver(django_user_model):
    user = django_user_model.objects.create_user("approver", is_staff=True)
    # The server processes hash with the production hashers (the suite's fast MD5 is in-process only).
    user.password = PBKDF2PasswordHasher().encode(PASSWORD, "browser-salt", iterations=1000)
    user.save(update_fields=["password"])
    user.groups.add(Group.objects.get(name=approvals.APPROVERS_GROUP))
    return user


@pytest.fixture
def new_silences(alertmanager):
    """The silences created during the test (expired afterwards: the Alertmanager is the session's)."""
    client = AlertmanagerClient(alertmanager.url, timeout=5, max_bytes=1 << 22)
    before = {s["id"] for s in client.silences()}

    def created() -> list[dict]:
        return [s for s in client.silences() if s["id"] not in before]

    yield created
    for silence in created():
        if silence["status"]["state"] != "expired":
            httpx.delete(f"{alertmanager.url}/api/v2/silence/{silence['id']}", timeout=5)


def start_interrupted(user, name: str) -> DiagnosisRun:
    run_id = intake.start_staff_analysis(user=user, query=alert(name)).run_id
    run = wait_for(
        lambda: DiagnosisRun.objects.filter(run_id=run_id, status=RunStatus.INTERRUPTED).first(),
        timeout=60,
        what="the run to wait for approval",
    )
    run.tool_call_id = ToolInvocation.objects.get(run_id=run_id, tool_name="create_silence").tool_call_id
    return run


def owner_of(run_id: str, event_type: str) -> str:
    return TraceEvent.objects.get(run_id=run_id, event_type=event_type).details["leaseOwner"]


@pytest.mark.mariadb
def test_a_run_interrupted_in_one_process_resumes_in_another(
    product_env, servers, staff_user, approver, new_silences
):
    first = servers(product_env, "approval-a")
    run = start_interrupted(staff_user, "ApprovalAcross")
    first.stop()  # the process that interrupted the run is gone
    call = ToolInvocation.objects.get(run_id=run.run_id, tool_name="create_silence")
    assert call.status == ToolStatus.AWAITING_APPROVAL and new_silences() == []

    second = servers(product_env, "approval-b")
    token = issue_token(approver)
    headers = {"Authorization": f"Token {token}"}
    base = f"{second.url}/api/diagnosis/{run.session_id}/runs/{run.run_id}"
    after = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.RUN_INTERRUPTED).sequence_no
    # A client follows the waiting run (from after the interruption) while the decision is taken.
    with (
        httpx.Client(timeout=30) as client,
        client.stream("GET", f"{base}/events", params={"after": after}, headers=headers) as stream,
    ):
        answer = client.post(
            f"{base}/approvals/{call.tool_call_id}",
            json={"decision": "approve", "note": "across processes"},
            headers=headers,
        )
        assert answer.status_code == 200, answer.text
        frames = []
        for event in iter_sse(stream):
            frames.append((event.event, event.data))
            if event.event == "outcome":
                break
    approval = [d for kind, d in frames if kind == "progress" and d.get("stage") == "APPROVAL"]
    assert [d["verdict"] for d in approval] == ["APPROVED"]
    tool_frames = [(d["name"], d["status"]) for kind, d in frames if kind == "tool"]
    assert ("create_silence", "RUNNING") in tool_frames and ("create_silence", "SUCCEEDED") in tool_frames
    assert frames[-1][1]["status"] == "SUCCESS"
    done = wait_for(
        lambda: DiagnosisRun.objects.filter(
            run_id=run.run_id, status__in=[RunStatus.SUCCESS, RunStatus.FAILED]
        ).first(),
        timeout=60,
        what="the resumed run to finish",
    )
    assert done.status == RunStatus.SUCCESS, done.error_code
    started, resumed = (
        owner_of(run.run_id, EventType.RUN_STARTED),
        owner_of(run.run_id, EventType.RUN_RESUMED),
    )
    assert started != resumed  # another process (host:pid:uuid) resumed it
    call.refresh_from_db()
    assert call.status == ToolStatus.SUCCEEDED
    (silence,) = new_silences()
    assert silence["matchers"][0]["value"] == "ApprovalAcross" and silence["id"] in call.output_preview
    starts = TraceEvent.objects.filter(
        run_id=run.run_id, event_type=EventType.TOOL_INVOCATION, status="RUNNING"
    ).filter(details__toolCallId=call.tool_call_id)
    assert starts.count() == 1
    verification = verify_run(run.run_id)
    assert verification.ok, verification.problems


@pytest.mark.browser
@requires_chromium
def test_approve_and_reject_with_the_admin_buttons_in_chromium(
    product_env, servers, staff_user, approver, new_silences
):
    server = servers(product_env, "approval-browser")
    rejected = start_interrupted(staff_user, "ApprovalRejectMe")
    approved = start_interrupted(staff_user, "ApprovalApproveMe")
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(15_000)
            page.goto(f"{server.url}/admin/login/")
            page.fill("#id_username", "approver")
            page.fill("#id_password", PASSWORD)
            page.click("input[type=submit]")
            expect(page.locator("#user-tools")).to_contain_text("approver")

            page.goto(f"{server.url}/admin/diagnosis/diagnosisrun/approvals/")
            table = page.locator("#approvals")
            expect(table).to_contain_text(rejected.run_id)
            expect(table).to_contain_text(approved.run_id)
            page.screenshot(path=str(ARTIFACTS / "approvals-list.png"), full_page=True)

            table.get_by_role("link", name=rejected.run_id).click()
            card = page.locator("#approvals")
            expect(card).to_contain_text("create_silence")
            card.locator("input[name=note]").fill("not during the drill")
            card.get_by_role("button", name="Reject").click()
            expect(page.locator(".messagelist")).to_contain_text("REJECTED")

            page.goto(f"{server.url}/admin/diagnosis/diagnosisrun/approvals/")
            page.locator("#approvals").get_by_role("link", name=approved.run_id).click()
            card = page.locator("#approvals")
            expect(card).to_contain_text("ApprovalApproveMe")
            page.screenshot(path=str(ARTIFACTS / "approval-run-page.png"), full_page=True)
            card.locator("input[name=note]").fill("ok")
            card.get_by_role("button", name="Approve").click()
            expect(page.locator(".messagelist")).to_contain_text("APPROVED")
        finally:
            browser.close()
    for run in (rejected, approved):
        wait_for(
            lambda run=run: DiagnosisRun.objects.filter(run_id=run.run_id, status=RunStatus.SUCCESS).exists(),
            timeout=60,
            what="the decided run to finish",
        )
        assert verify_run(run.run_id).ok
    silences = new_silences()
    assert [s["matchers"][0]["value"] for s in silences] == ["ApprovalApproveMe"]
    decided = {
        e.run_id: e
        for e in TraceEvent.objects.filter(
            run_id__in=[rejected.run_id, approved.run_id], event_type=EventType.APPROVAL_DECIDED
        )
    }
    assert decided[rejected.run_id].status == "REJECTED"
    assert decided[rejected.run_id].details["note"] == "not during the drill"
    assert decided[approved.run_id].details["decidedBy"] == "approver"


@pytest.mark.browser
@requires_chromium
def test_the_chat_page_shows_the_waiting_call_and_approves_it(
    product_env, servers, staff_user, approver, new_silences
):
    server = servers(product_env, "approval-chat")
    run = start_interrupted(staff_user, "ApprovalFromChat")
    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.set_default_timeout(15_000)
            page.goto(f"{server.url}/admin/login/")
            page.fill("#id_username", "approver")
            page.fill("#id_password", PASSWORD)
            page.click("input[type=submit]")
            page.goto(f"{server.url}/chat/")
            panel = page.locator("#approvals")
            expect(panel).to_be_visible()
            item = panel.locator(f'li[data-tool-call-id="{run.tool_call_id}"]')
            expect(item).to_contain_text("create_silence")
            expect(item).to_contain_text("ApprovalFromChat")
            page.screenshot(path=str(ARTIFACTS / "approval-chat-panel.png"), full_page=True)
            # Readable as people read: formatted JSON, the time left, and at 360 px nothing clipped or
            # touching.
            expect(item.locator(".approval-expires")).to_contain_text("expires in")
            # Who executes it, where and until when (issue 45): the request's stated action.
            action = item.locator("p.approval-action")
            expect(action).to_contain_text("If approved: Executed by the service as “diagnosis agent")
            expect(action).to_contain_text("on Alertmanager at 127.0.0.1:")
            expect(action).to_contain_text("it ends by")
            assert '\n  "' in item.locator("pre.approval-args").inner_text()  # indented JSON, not a repr
            page.set_viewport_size({"width": 360, "height": 800})
            args = item.locator("pre.approval-args")
            assert args.evaluate("e => e.scrollWidth <= e.clientWidth")
            approve, reject = (
                item.get_by_role("button", name=n).bounding_box() for n in ("Approve", "Reject")
            )
            apart = (
                approve["x"] + approve["width"] <= reject["x"]
                or approve["y"] + approve["height"] <= reject["y"]
            )
            assert apart and reject["x"] + reject["width"] <= 360
            page.screenshot(path=str(ARTIFACTS / "approval-chat-panel-360.png"), full_page=True)
            page.set_viewport_size({"width": 1200, "height": 900})
            # The page with a card waiting passes the accessibility check, and the card works from the
            # keyboard: from the note, Tab reaches Approve (with a visible focus) and Enter decides.
            assert_accessible(page, "the chat with an approval waiting")
            item.locator("input.approval-note").fill("from the chat")
            page.keyboard.press("Tab")
            focused = page.evaluate(
                "() => { const e = document.activeElement; const s = getComputedStyle(e);"
                " return [e.className, s.outlineStyle !== 'none' || s.boxShadow !== 'none']; }"
            )
            assert focused == ["approve", True], focused
            page.keyboard.press("Enter")
            expect(panel).to_contain_text("APPROVED")
        finally:
            browser.close()
    wait_for(
        lambda: DiagnosisRun.objects.filter(run_id=run.run_id, status=RunStatus.SUCCESS).exists(),
        timeout=60,
        what="the approved run to finish",
    )
    assert [s["matchers"][0]["value"] for s in new_silences()] == ["ApprovalFromChat"]
    decided = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.APPROVAL_DECIDED)
    assert decided.details["note"] == "from the chat" and decided.details["decidedBy"] == "approver"
