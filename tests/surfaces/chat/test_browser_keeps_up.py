"""The chat keeps up (issue 50), in headless Chromium: it follows the newest answer unless the reader
scrolled up; the question bubble shows the question as stored (redacted) from the `run` frame on; a reload
and a resume draw each stage at its recorded time (the frames' `at`), never "+0.0 s"; a call waiting for
approval is drawn waiting, not failed; a paste over the API's limit is kept whole and refused with the
limit stated; someone else's conversation opens read-only and labelled; the vote buttons are words.

The stream is stood in for by Playwright routes where the test needs exact frames and times (as in
`test_browser_frames.py`); the page, its API calls and the read-only conversation are the real server's
(`live_server`). One Chromium for the module, one context per test. The real stack's frames (the stored
question, `askedAt`, `at`): `test_sse.py`."""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit

import pytest
from django.test import Client

from diagnosis.services import QUERY_MAX_CHARS
from tests.accessibility import assert_accessible
from tests.agent.secrets_corpus import AWS_KEY_ID
from tests.browser import launch_chromium, requires_chromium
from tests.factories import make_recorded_run
from tests.surfaces.chat.test_browser_frames import finished, outcome, sse, started

pytestmark = [pytest.mark.browser, requires_chromium, pytest.mark.django_db(transaction=True)]

TIMEOUT_MS = 15_000
SESSION_ID = "ses_keepsup0001"
ASKED_AT = "2026-03-04T05:06:07.000Z"
LONG_ANSWER = "\n".join(f"- Check item {i} of the runbook [kb:mysql-replication-lag#4]." for i in range(40))


def at(seconds: float) -> str:
    """A server time `seconds` after ASKED_AT (whole milliseconds)."""
    ms = 7000 + round(seconds * 1000)
    return f"2026-03-04T05:06:{ms // 1000:02d}.{ms % 1000:03d}Z"


def run_frame(run_id: str, *, query: str = "", asked_at: str | None = ASKED_AT) -> str:
    data = {"sessionId": SESSION_ID, "runId": run_id, "demo": False, "query": query, "askedAt": asked_at}
    return "retry: 3000\n\n" + sse("run", data, 1)


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    # Playwright's sync API keeps an event loop on this thread; the test's own ORM calls are sequential.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_api.sync_playwright() as playwright:
            chromium = launch_chromium(playwright)
            yield chromium
            chromium.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def open_chat(browser, live_server):
    """`open_chat(user, path)`: a page of the real chat signed in as `user` (its own browser context)."""
    contexts = []

    def open_(user, path: str = "/chat/", height: int = 700):
        client = Client()
        client.force_login(user)
        context = browser.new_context(viewport={"width": 1000, "height": height})
        contexts.append(context)
        context.add_cookies(
            [{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": live_server.url}]
        )
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.goto(f"{live_server.url}{path}")
        assert urlsplit(page.url).path == "/chat/"
        return page

    yield open_
    for context in contexts:
        context.close()


def _ask(page, text: str):
    page.fill("#query", text)
    page.click("#ask")
    return page.locator(".turn").last


def _finished(page, count: int) -> None:
    page.wait_for_function(f"() => document.querySelectorAll('.turn[data-finished=true]').length === {count}")


BELOW = "() => { const s = document.scrollingElement; return s.scrollHeight - s.scrollTop - s.clientHeight; }"


def test_the_page_follows_the_newest_answer_unless_the_reader_scrolled_up(open_chat, user):
    page = open_chat(user, height=600)
    bodies = [
        run_frame("run_follow0001") + started("ROUTING") + outcome(LONG_ANSWER, run_id="run_follow0001"),
        run_frame("run_follow0002") + started("ROUTING"),  # then the stream drops; the re-attach is held
    ]
    held = []
    page.route(
        "**/api/chat",
        lambda route: route.fulfill(status=200, content_type="text/event-stream", body=bodies.pop(0)),
    )
    page.route(re.compile(r".*/runs/run_follow0002/events\?after=\d+$"), lambda route: held.append(route))

    first = _ask(page, "Replica lag on db-3?")
    _finished(page, 1)
    # The answer grew far below the fold: the page went with it, to its last line above the composer.
    assert page.evaluate(BELOW) <= 2
    last_line = first.locator(".content li").last.bounding_box()
    composer = page.locator("#composer").bounding_box()
    assert last_line["y"] + last_line["height"] <= composer["y"] + 1

    _ask(page, "And the relay log?")  # its stream drops: the page re-attaches after 0.5 s
    for _ in range(200):  # route handlers run while Playwright waits
        if held:
            break
        page.wait_for_timeout(50)
    assert len(held) == 1 and held[0].request.url.endswith("/events?after=1")
    # The reader scrolls up to read the first answer again: the next frames leave them there.
    page.mouse.move(500, 300)
    page.mouse.wheel(0, -1500)
    page.wait_for_function("() => document.getElementById('chat').dataset.following === 'false'")
    reading = page.evaluate("document.scrollingElement.scrollTop")
    held[0].fulfill(
        status=200,
        content_type="text/event-stream",
        body=finished(3, "ROUTING", intent="DIAGNOSIS") + outcome(LONG_ANSWER, run_id="run_follow0002"),
    )
    _finished(page, 2)
    assert page.evaluate("document.scrollingElement.scrollTop") == reading
    assert page.evaluate(BELOW) > 500
    # Back at the bottom, the page follows again.
    page.mouse.wheel(0, 20_000)
    page.wait_for_function("() => document.getElementById('chat').dataset.following === 'true'")


def test_the_question_shows_as_stored_and_the_votes_are_words(open_chat, user):
    page = open_chat(user)
    stored = "nginx fails after the deploy, key [REDACTED:aws-access-key#1]"
    page.route(
        "**/api/chat",
        lambda route: route.fulfill(
            status=200,
            content_type="text/event-stream",
            body=run_frame("run_stored0001", query=stored)
            + finished(2, "REDACTION", verdict="APPLIED", redacted={"aws-access-key": 1})
            + outcome("Rotate the key [kb:mysql-replication-lag#4].", run_id="run_stored0001"),
        ),
    )
    turn = _ask(page, f"nginx fails after the deploy, key {AWS_KEY_ID}")
    _finished(page, 1)
    assert turn.locator(".question").inner_text() == stored
    assert AWS_KEY_ID not in page.content()  # what was pasted is gone from the page, not only hidden

    # The vote buttons say what they do in words: nothing an emoji font must draw.
    votes = turn.locator(".feedback .vote")
    assert votes.all_inner_texts() == ["Helpful", "Not helpful"]
    for text in votes.all_text_contents():
        assert all(ord(char) < 0x2000 for char in text), text


def test_stage_times_after_a_reload_and_after_a_resume_are_the_recorded_ones(open_chat, user):
    page = open_chat(user)
    # A reload: the conversation's finished run is replayed with the times its events were recorded.
    run = {
        "runId": "run_timed0001",
        "sessionId": SESSION_ID,
        "query": "Disk full on /var/log",
        "status": "SUCCESS",
        "createdAt": ASKED_AT,
        "feedback": None,
    }
    page.route(
        re.compile(rf".*/api/diagnosis/{SESSION_ID}/runs/\?pageSize=\d+$"),
        lambda route: route.fulfill(status=200, json={"next": None, "previous": None, "results": [run]}),
    )
    tool = {"toolCallId": "c1", "name": "lookup_knowledge"}
    replay = (
        run_frame("run_timed0001", query=run["query"])
        + finished(2, "ROUTING", intent="DIAGNOSIS", at=at(1.2))
        + sse("tool", {**tool, "status": "RUNNING", "at": at(1.5)}, 3)
        + sse("tool", {**tool, "status": "SUCCEEDED", "at": at(3.1)}, 4)
        + finished(5, "RELEASE", verdict="PUBLISHED", at=at(4.2))
        + outcome("Free space on /var/log [kb:mysql-replication-lag#4].", run_id="run_timed0001")
    )
    page.route(
        re.compile(r".*/runs/run_timed0001/events\?after=0$"),
        lambda route: route.fulfill(status=200, content_type="text/event-stream", body=replay),
    )
    page.goto(page.url + f"?session={SESSION_ID}")
    _finished(page, 1)
    assert page.locator(".turn .stage-at").all_inner_texts() == ["+1.2 s", "+1.5 s", "+4.2 s"]
    assert page.locator(".turn .stage.tool .stage-took").inner_text() == "1.6 s"  # 1.5 s → 3.1 s

    # A resume: the stream drops after the first stage; the re-attach replays the rest with their times.
    page.route(
        "**/api/chat",
        lambda route: route.fulfill(
            status=200,
            content_type="text/event-stream",
            body=run_frame("run_timed0002", query="And the inode count?") + started("ROUTING"),
        ),
    )
    page.route(
        re.compile(r".*/runs/run_timed0002/events\?after=1$"),
        lambda route: route.fulfill(
            status=200,
            content_type="text/event-stream",
            body=finished(3, "ROUTING", intent="DIAGNOSIS", at=at(0.9))
            + finished(5, "MODEL_STEP", stepIndex=1, verdict="ANSWER", at=at(6.3))
            + outcome("Run df -i [kb:mysql-replication-lag#4].", run_id="run_timed0002"),
        ),
    )
    resumed = _ask(page, "And the inode count?")
    _finished(page, 2)
    assert resumed.get_attribute("data-reconnects") == "1"
    # Routing began live on this page (its own clock); the model step was seen only in the replay.
    assert resumed.locator(".stage-at").nth(1).inner_text() == "+6.3 s"


def test_a_call_waiting_for_approval_is_drawn_waiting(open_chat, user):
    page = open_chat(user)
    page.route(
        "**/api/chat",
        lambda route: route.fulfill(
            status=200,
            content_type="text/event-stream",
            body=run_frame("run_waits0001")
            + finished(3, "MODEL_STEP", stepIndex=1, agentName="diagnosis_agent", verdict="TOOL_CALLS")
            + sse("tool", {"toolCallId": "c9", "name": "restart_service", "status": "AWAITING_APPROVAL"}, 4)
            + finished(5, "APPROVAL", verdict="WAITING"),
        ),
    )
    page.route(re.compile(r".*/runs/run_waits0001/events\?after=\d+$"), lambda route: None)  # stays open
    turn = _ask(page, "Restart nginx on web-2 please")
    tool = turn.locator(".stage.tool")
    tool.wait_for()
    page.wait_for_function("() => document.querySelector('.stage[data-stage=APPROVAL]') !== null")
    assert tool.inner_text().startswith("Tool restart_service waiting for approval…")
    for line in (tool, turn.locator(".stage[data-stage=APPROVAL]")):
        classes = line.get_attribute("class").split()
        assert "tone-waiting" in classes and "tone-bad" not in classes, classes
    bad = page.evaluate("getComputedStyle(document.documentElement).getPropertyValue('--bad').trim()")
    colour = tool.locator(".stage-label").evaluate("el => getComputedStyle(el).color")
    assert colour != page.evaluate(
        "c => { const p = document.createElement('p'); p.style.color = c; document.body.append(p);"
        " const out = getComputedStyle(p).color; p.remove(); return out; }",
        bad,
    )


def test_a_paste_over_the_limit_is_kept_and_refused_with_the_limit_stated(open_chat, user):
    page = open_chat(user)
    asked = []
    page.route("**/api/chat", lambda route: (asked.append(route), route.abort()))
    page.focus("#query")
    page.keyboard.insert_text("x" * 20_000)  # as a paste arrives
    assert page.eval_on_selector("#query", "el => el.value.length") == 20_000  # nothing cut
    note = page.locator("#composer-note")
    note.wait_for()
    assert f"20,000 characters, and a question may have at most {QUERY_MAX_CHARS:,}" in note.inner_text()
    assert page.locator("#counter").inner_text() == f"20000 / {QUERY_MAX_CHARS}"
    assert page.get_attribute("#query", "aria-invalid") == "true"
    assert_accessible(page, "a question over the limit")
    page.click("#ask")
    page.wait_for_timeout(200)
    assert asked == [] and page.locator(".turn").count() == 0  # refused here, not sent
    assert page.eval_on_selector("#query", "el => el.value.length") == 20_000  # and still all there

    page.fill("#query", "y" * QUERY_MAX_CHARS)  # at the limit: fine
    assert note.is_hidden() and page.get_attribute("#query", "aria-invalid") == "false"


def test_someone_else_s_conversation_is_read_only_and_labelled(open_chat, user, staff_user):
    theirs = make_recorded_run(user, query="Why is replication lagging on db-3?")
    page = open_chat(staff_user, path=f"/chat/?session={theirs.session_id}")
    label = page.locator("#read-only-label")
    assert label.is_visible()
    assert "Read-only" in label.inner_text() and user.get_username() in label.inner_text()
    assert page.locator("#composer, #query, #ask").count() == 0  # no composer to answer "No such session"
    _finished(page, 1)
    assert page.locator(".turn .question").inner_text() == theirs.query
    assert_accessible(page, "someone else's conversation")
    # The staff member's own conversation still has its composer.
    page.locator("#read-only-label a").click()
    page.locator("#query").wait_for()
    assert page.locator("#read-only-label").count() == 0
