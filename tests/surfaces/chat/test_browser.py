"""The chat page in headless Chromium (Debian's, driven by Playwright), against a daphne subprocess on
the test database, through a TCP proxy that can drop connections like a flaky network.

Staff log in, ask, watch the run's stages with each tool's start and finish, see the release decision
and the released answer, follow the link to the run in the admin; a connection dropped while the answer
is being written is re-attached with `after=<last id>`; a BLOCKED outcome is visibly marked; a slow tool
is cancelled from the page. (Rendering and progress in detail: `test_browser_answers.py`.)
Screenshots go to `test-artifacts/`.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import pytest

from audit.models import ToolInvocation, ToolStatus
from diagnosis.models import DiagnosisRun, RunStatus
from surfaces.answers import render_answer
from tests.browser import requires_chromium
from tests.surfaces.chat.support import ARTIFACTS, PASSWORD, wait_for

pytestmark = [pytest.mark.browser, requires_chromium, pytest.mark.django_db(transaction=True)]


def _ask(page, text: str):
    page.fill("#query", text)
    page.click("#ask")
    turn = page.locator(".turn").last
    turn.locator(".run-id").filter(has_text=re.compile("run_")).wait_for()
    return turn


def _assert_shows_released(turn, run) -> None:
    """The turn shows the run's released content as the server rendered it (the outcome's `contentHtml`):
    the citations linked as `render_answer` links them, the words those of the released text."""
    content = turn.locator(".content")
    assert content.is_visible() and "md" in (content.get_attribute("class") or "").split()
    hrefs = [a.get_attribute("href") for a in content.locator("a.citation").all()]
    assert hrefs == re.findall(r'<a class="citation" href="([^"]+)"', render_answer(run.content))
    assert content.inner_text().split() == re.sub(r"\[(kb:[^\]]+)\]", r"\1", run.content).split()


def test_staff_chat_end_to_end(page, site, provider, staff_user):
    ARTIFACTS.mkdir(exist_ok=True)
    # Login required: the page sends the user to the admin login and back.
    page.goto(f"{site.url}/chat/")
    assert "/admin/login/" in page.url
    page.fill("#id_username", staff_user.username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(lambda url: urlsplit(url).path == "/chat/")

    # 1. A question answered with evidence: streamed, tools start and finish, published.
    provider.delay = 0.05
    turn = _ask(page, "MySQL replication lag keeps growing on db-3. What should I check?")
    wait_for(lambda: turn.get_attribute("data-finished") == "true", 20, message="the outcome")
    run_id = turn.get_attribute("data-run-id")
    run = DiagnosisRun.objects.get(run_id=run_id)
    assert run.status == RunStatus.SUCCESS and run.release_decision == "PUBLISHED"
    assert turn.get_attribute("data-status") == "SUCCESS"
    assert turn.locator(".status").inner_text().lower() == "answered"
    assert turn.get_attribute("data-release") == "PUBLISHED"
    assert turn.locator(".demo").is_hidden()  # a real provider's answer carries no DEMO label
    _assert_shows_released(turn, run)
    tools = turn.locator(".tool")
    assert tools.count() == ToolInvocation.objects.filter(run_id=run_id).count() >= 1
    assert {tools.nth(i).get_attribute("data-status") for i in range(tools.count())} == {"SUCCEEDED"}
    assert turn.locator(".blocked-note").is_hidden()
    page.screenshot(path=str(ARTIFACTS / "chat-page-published.png"), full_page=True)

    # 2. The connection drops mid-answer: the page re-attaches with after=<last id> and finishes.
    provider.delay = 0.25
    provider.pieces = 14
    turn = _ask(page, "The replica is still behind. Anything else?")
    turn.locator(".tool[data-status=SUCCEEDED]").first.wait_for()
    # The answer is being written (verified mode: its stage runs, no text is shown yet).
    turn.locator(".stage.current[data-stage=MODEL_STEP]").filter(has_text="Model step 2").wait_for()
    assert turn.locator(".content").is_hidden()
    page.screenshot(path=str(ARTIFACTS / "chat-page-streaming.png"))
    assert site.drop() >= 1
    wait_for(
        lambda: turn.get_attribute("data-finished") == "true", 20, message="the outcome after reconnecting"
    )
    run = DiagnosisRun.objects.get(run_id=turn.get_attribute("data-run-id"))
    assert int(turn.get_attribute("data-reconnects")) >= 1
    resumed = [line for line in site.request_lines if f"/runs/{run.run_id}/events?after=" in line]
    assert resumed and all(int(re.search(r"after=(\d+)", line).group(1)) > 0 for line in resumed), resumed
    _assert_shows_released(turn, run)
    assert run.session_id == DiagnosisRun.objects.get(run_id=run_id).session_id  # same conversation

    # 3. An answer that cites nothing is BLOCKED: the draft is replaced by the safe message, marked.
    provider.delay = 0.02
    provider.pieces = 4
    provider.answer = "Restart the primary and it will be fine."
    turn = _ask(page, "Quick fix for the lag?")
    wait_for(lambda: turn.get_attribute("data-finished") == "true", 20, message="the blocked outcome")
    run = DiagnosisRun.objects.get(run_id=turn.get_attribute("data-run-id"))
    assert run.release_decision == "BLOCKED"
    assert turn.locator(".status").inner_text().lower() == "blocked"
    assert turn.get_attribute("data-release") == "BLOCKED"
    assert turn.locator(".blocked-note").is_visible()
    assert "blocked" in (turn.get_attribute("class") or "")
    _assert_shows_released(turn, run)
    assert "Restart the primary" not in turn.inner_text()
    page.screenshot(path=str(ARTIFACTS / "chat-page-blocked.png"), full_page=True)

    # 4. Cancel a run while its slow tool runs.
    provider.answer = None
    provider.tools = (("slow_probe", {"seconds": 60}),)
    turn = _ask(page, "Run the slow probe on db-3")
    turn.locator(".tool[data-status=RUNNING]").wait_for()
    turn.locator(".cancel").click()
    wait_for(lambda: turn.get_attribute("data-finished") == "true", 20, message="the cancelled outcome")
    assert turn.get_attribute("data-status") == "CANCELLED"
    assert turn.locator(".tool").first.get_attribute("data-status") == "INTERRUPTED"
    cancelled = DiagnosisRun.objects.get(run_id=turn.get_attribute("data-run-id"))
    assert cancelled.status == RunStatus.CANCELLED
    assert ToolInvocation.objects.get(run_id=cancelled.run_id).status == ToolStatus.INTERRUPTED
    page.screenshot(path=str(ARTIFACTS / "chat-page.png"), full_page=True)

    # 5. The admin link opens the run's page in the admin.
    href = page.locator(".turn").first.locator(".admin-link").get_attribute("href")
    assert href == f"/chat/runs/{run_id}/admin/"
    page.goto(site.url + href)
    assert re.search(
        rf"/admin/diagnosis/diagnosisrun/{DiagnosisRun.objects.get(run_id=run_id).pk}/change/", page.url
    )
    assert run_id in page.content()

    # 6. The WebSocket on the live server, from the page with its session cookie (Origin: the site).
    provider.intent, provider.tools = "CHITCHAT", ()
    frames = page.evaluate(WS_SCRIPT, {"runId": run_id, "query": "hello there"})
    assert frames[0] == {
        "type": "error",
        "code": "malformed_frame",
        "message": "Frames must be JSON objects.",
    }
    attached = frames[1 : frames.index(next(f for f in frames if f["type"] == "outcome")) + 1]
    assert attached[0]["type"] == "run" and attached[-1]["runId"] == run_id
    chat = frames[len(attached) + 1 :]
    assert chat[0]["type"] == "run" and chat[-1]["type"] == "outcome" and chat[-1]["status"] == "SUCCESS"
    assert "progress" in [f["type"] for f in chat] and "draft" not in [f["type"] for f in chat]


WS_SCRIPT = """
({runId, query}) => new Promise((resolve, reject) => {
  const ws = new WebSocket(location.origin.replace(/^http/, "ws") + "/ws/chat/");
  const frames = [];
  let outcomes = 0;
  ws.onopen = () => {
    ws.send("{oops");
    ws.send(JSON.stringify({type: "attach", runId: runId, after: 0}));
  };
  ws.onmessage = (message) => {
    const frame = JSON.parse(message.data);
    frames.push(frame);
    if (frame.type === "outcome") {
      outcomes += 1;
      if (outcomes === 1) { ws.send(JSON.stringify({type: "chat", query: query})); }
      else { ws.close(); resolve(frames); }
    }
  };
  ws.onclose = (event) => { if (outcomes < 2) { reject(new Error("closed " + event.code)); } };
  setTimeout(() => reject(new Error("timeout after " + JSON.stringify(frames))), 15000);
})
"""
