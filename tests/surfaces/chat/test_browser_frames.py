"""The chat page's rendering of the v2 frames in headless Chromium, the server's stream stood in for by
Playwright routes (independent of the runtime's timing): progress stages with elapsed time and a ticking
current stage, an unverified draft that a repair step clears and the outcome replaces, the released
`contentHtml` (from `surfaces.answers.render_answer`) set inert, the plain-text fallback, a BLOCKED
outcome marked. The same page against a real server: `test_browser_answers.py`."""

from __future__ import annotations

import json
import re
from urllib.parse import urlsplit

import pytest
from django.test import Client

from surfaces.answers import render_answer
from tests.browser import launch_chromium, requires_chromium
from tests.surfaces.chat.support import ARTIFACTS

pytestmark = [pytest.mark.browser, requires_chromium, pytest.mark.django_db(transaction=True)]

TIMEOUT_MS = 15_000
RUN_ID = "run_frames0001"
SESSION_ID = "ses_frames0001"
HOSTILE = (
    "From the runbooks:\n"
    "- Check `SHOW SLAVE STATUS` first [kb:mysql-replication-lag#4].\n"
    '- <script>window.pwned = 1; alert(1)</script> and <img src=x onerror="window.pwned = 2; alert(2)">\n'
    "- [trap](javascript:window.pwned=3) [kb:mysql-replication-lag#3, kb:mysql-replication-lag#5]"
)


def sse(event: str, data: dict, seq: int | None = None) -> str:
    head = f"id: {seq}\n" if seq is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def started(stage: str, **extra) -> str:
    """A stage that started: live only, no timeline event, so no sequence number and no `id:`."""
    return sse("progress", {"stage": stage, "status": "STARTED", "sequenceNo": None, **extra})


def finished(seq: int, stage: str, **extra) -> str:
    """A stage that finished: one timeline event, its sequence number the SSE `id:`."""
    return sse("progress", {"stage": stage, "status": "FINISHED", "sequenceNo": seq, **extra}, seq)


def run_frame(run_id: str = RUN_ID) -> str:
    return "retry: 3000\n\n" + sse("run", {"sessionId": SESSION_ID, "runId": run_id}, 1)


def outcome(content: str, *, run_id: str = RUN_ID, decision: str = "PUBLISHED", html: bool = True) -> str:
    data = {"runId": run_id, "status": "SUCCESS", "releaseDecision": decision, "content": content}
    if html:
        data["contentHtml"] = render_answer(content)
    return sse("outcome", data, 99)


@pytest.fixture
def page(live_server, user, monkeypatch):
    sync_api = pytest.importorskip("playwright.sync_api")
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    client = Client()
    client.force_login(user)  # a plain (non-staff) chat user
    with sync_api.sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        context = browser.new_context(viewport={"width": 1000, "height": 900})
        context.add_cookies(
            [{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": live_server.url}]
        )
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.dialogs = []
        page.on("dialog", lambda dialog: (page.dialogs.append(dialog.message), dialog.dismiss()))
        page.goto(f"{live_server.url}/chat/")
        assert urlsplit(page.url).path == "/chat/"
        yield page
        context.close()
        browser.close()


def _ask(page, text: str):
    page.fill("#query", text)
    page.click("#ask")
    return page.locator(".turn").last


def _labels(turn) -> list[str]:
    return [label.strip() for label in turn.locator(".progress .stage-label").all_inner_texts()]


def test_progress_draft_and_released_answer(page):
    ARTIFACTS.mkdir(exist_ok=True)
    first = (
        run_frame()
        + started("ROUTING")
        + finished(3, "ROUTING", intent="DIAGNOSIS")
        + started("MODEL_STEP", stepIndex=1, agentName="diagnosis_agent")
        + finished(5, "MODEL_STEP", stepIndex=1, agentName="diagnosis_agent", verdict="TOOL_CALLS")
        + sse("tool", {"toolCallId": "call_1", "name": "lookup_knowledge", "status": "RUNNING"}, 6)
        + sse("tool", {"toolCallId": "call_1", "name": "lookup_knowledge", "status": "SUCCEEDED"}, 7)
        + started("MODEL_STEP", stepIndex=2, agentName="diagnosis_agent")
        + sse("draft", {"text": "A first draft "})
        + sse("draft", {"text": "without citations."})
        + finished(9, "MODEL_STEP", stepIndex=2, agentName="diagnosis_agent", verdict="ANSWER")
        + finished(11, "EVIDENCE_GUARD", verdict="FAIL")
        + started("MODEL_STEP", stepIndex=3, agentName="diagnosis_agent")
        + sse("draft", {"text": "The repaired draft <b>not markup</b>"})
    )  # the stream then drops: the page re-attaches with after=11 (the last id), and that request is held
    held = []
    page.route(
        "**/api/chat", lambda route: route.fulfill(status=200, content_type="text/event-stream", body=first)
    )
    page.route(re.compile(r".*/runs/run_frames0001/events\?after=\d+$"), lambda route: held.append(route))

    turn = _ask(page, "Replica lag on db-3?")
    page.wait_for_function("() => document.querySelector('.turn .draft-box:not(.hidden)') !== null")
    turn.locator(".stage.current").wait_for()
    page.wait_for_timeout(700)  # the re-attach request is made after 0.5 s
    assert len(held) == 1 and held[0].request.url.endswith("/events?after=11")

    assert _labels(turn) == [
        "Routed: diagnosis",
        "Model step 1",
        "Tool lookup_knowledge finished",
        "Model step 2",
        "Evidence check: failed",
        "Model step 3…",
    ]
    # The repair step's draft replaced the first one, marked unverified, as text.
    assert turn.locator(".draft-label").inner_text() == "UNVERIFIED DRAFT — NOT YET CHECKED"
    assert turn.locator(".draft-text").inner_text() == "The repaired draft <b>not markup</b>"
    assert turn.locator(".draft-text b").count() == 0
    assert turn.locator(".content").is_hidden()
    # Every line says when it started; the running one ticks, and so does the run's elapsed time.
    ats = turn.locator(".progress .stage-at").all_inner_texts()
    assert len(ats) == 6 and all(re.fullmatch(r"\+\d+\.\d s", at) for at in ats)
    current = turn.locator(".stage.current")
    assert current.count() == 1 and current.get_attribute("data-stage") == "MODEL_STEP"
    before = (current.locator(".stage-took").inner_text(), turn.locator(".elapsed").inner_text())
    page.wait_for_timeout(600)
    after = (current.locator(".stage-took").inner_text(), turn.locator(".elapsed").inner_text())
    assert all(float(a.split()[0]) > float(b.split()[0]) for a, b in zip(after, before, strict=True)), (
        before,
        after,
    )
    assert turn.locator(".tool[data-status=SUCCEEDED]").count() == 1
    turn.screenshot(path=str(ARTIFACTS / "chat-frames-progress-draft.png"))

    rest = (
        finished(11, "EVIDENCE_GUARD", verdict="FAIL")  # already seen (live and replay overlap): skipped
        + finished(13, "MODEL_STEP", stepIndex=3, agentName="diagnosis_agent", verdict="ANSWER")
        + finished(15, "EVIDENCE_GUARD", retry=True, verdict="PASS")
        + started("SEMANTIC_GUARD")
        + finished(17, "SEMANTIC_GUARD", verdict="PASS")
        + finished(18, "RELEASE", verdict="PUBLISHED")
        + outcome(HOSTILE)
    )
    held[0].fulfill(status=200, content_type="text/event-stream", body=rest)
    page.wait_for_function("() => document.querySelector('.turn[data-finished=true]') !== null")

    assert _labels(turn)[5:] == [
        "Model step 3",
        "Evidence check (repair round): passed",
        "Semantic check: passed",
        "Released",
    ]
    assert turn.locator(".stage.current").count() == 0
    assert turn.locator(".draft-box").is_hidden() and turn.locator(".draft-text").inner_text() == ""
    content = turn.locator(".content")
    assert content.is_visible() and "md" in content.get_attribute("class")
    assert (
        content.locator("li").count() == 3
        and content.locator("code").first.inner_text() == "SHOW SLAVE STATUS"
    )
    hrefs = [a.get_attribute("href") for a in content.locator("a.citation").all()]
    assert hrefs == [
        "/knowledge/mysql-replication-lag/?chunk=4#chunk-4",
        "/knowledge/mysql-replication-lag/?chunk=3#chunk-3",
        "/knowledge/mysql-replication-lag/?chunk=5#chunk-5",
    ]
    assert {a.get_attribute("target") for a in content.locator("a").all()} == {"_blank"}
    _assert_inert(page, content)
    assert "<script>window.pwned = 1;" in content.inner_text()
    turn.screenshot(path=str(ARTIFACTS / "chat-frames-released.png"))


def test_plain_content_fallback_and_a_blocked_outcome(page):
    bodies = [
        run_frame("run_plain0001")
        + finished(2, "RELEASE", verdict="PUBLISHED")
        + outcome("**kept as text** <img src=x onerror=alert(1)>", run_id="run_plain0001", html=False),
        run_frame("run_block0001")
        + finished(3, "EVIDENCE_GUARD", verdict="FAIL")
        + finished(4, "RELEASE", verdict="BLOCKED")
        + outcome(
            "I could not verify an answer *from the runbooks*.", run_id="run_block0001", decision="BLOCKED"
        ),
    ]
    page.route(
        "**/api/chat",
        lambda route: route.fulfill(status=200, content_type="text/event-stream", body=bodies.pop(0)),
    )

    plain = _ask(page, "first")
    page.wait_for_function("() => document.querySelector('.turn[data-finished=true]') !== null")
    content = plain.locator(".content")
    assert "plain" in content.get_attribute("class")
    assert content.inner_text() == "**kept as text** <img src=x onerror=alert(1)>"
    _assert_inert(page, content)

    blocked = _ask(page, "second")
    page.wait_for_function("() => document.querySelectorAll('.turn[data-finished=true]').length === 2")
    assert "blocked" in blocked.get_attribute("class") and blocked.get_attribute("data-release") == "BLOCKED"
    assert blocked.locator(".blocked-note").is_visible()
    assert blocked.locator(".status").inner_text().lower() == "blocked"
    assert _labels(blocked) == ["Evidence check: failed", "Blocked"]
    assert blocked.locator(".stage.tone-bad").count() == 2
    assert blocked.locator(".content em").inner_text() == "from the runbooks"


def _assert_inert(page, content) -> None:
    page.wait_for_timeout(200)
    assert page.dialogs == []
    assert page.evaluate("typeof window.pwned") == "undefined"
    assert content.locator("script, img, iframe, [onerror], [onload]").count() == 0
    assert page.evaluate("document.querySelectorAll('[onerror], [onload], a[href^=javascript]').length") == 0


def test_what_was_redacted_is_shown_before_the_answer(page):
    stream = (
        run_frame()
        + finished(2, "REDACTION", verdict="APPLIED", redacted={"private-key": 2, "aws-access-key": 1})
        + started("ROUTING")
        + finished(3, "ROUTING", intent="DIAGNOSIS")
        + outcome("The key [REDACTED:aws-access-key#1] is exposed [kb:mysql-replication-lag#4].")
    )
    page.route(
        "**/api/chat", lambda route: route.fulfill(status=200, content_type="text/event-stream", body=stream)
    )
    turn = _ask(page, "nginx fails, key " + "AKIA" + "Q4N7XZ2B6JTKPL3M")
    turn.locator(".content:not(.hidden)").wait_for()
    assert _labels(turn)[0] == "Redacted before sending: 1 × aws access key, 2 × private key"
    assert _labels(turn)[1] == "Routed: diagnosis"
