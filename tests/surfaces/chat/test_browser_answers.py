"""What the reader sees, end to end: the chat page in headless Chromium against a daphne subprocess with
the real runtime and its real frames. A plain (non-staff) user asks; the run's stages appear as they
happen; in the default verified mode no answer text shows before the outcome; the released answer is
rendered Markdown whose citations open their runbook chunk, highlighted; Markdown with a `<script>` and an
`onerror` renders inert; under `CHAT_RELEASE=draft` the draft is shown marked unverified and replaced.

`UPDATE_DOC_IMAGES=1` also writes the screenshots `docs/chat.md` shows to `docs/images/`.

The rendered answer is the outcome frame's `contentHtml` (`surfaces.chat.protocol` calling
`surfaces.answers.render_answer`).
"""

from __future__ import annotations

import os
import re
from io import StringIO
from urllib.parse import urlsplit

import pytest
from django.core.management import call_command
from django.test import Client

from agent.knowledge.retrieval import search_knowledge
from agent.runtime.demo import DEMO_QUESTIONS
from diagnosis.models import DiagnosisRun
from surfaces.answers import render_answer
from tests.browser import launch_chromium, requires_chromium
from tests.surfaces.chat.support import ARTIFACTS, BASE_DIR, DaphneServer, wait_for

pytestmark = [pytest.mark.browser, requires_chromium, pytest.mark.django_db(transaction=True)]

TIMEOUT_MS = 20_000
DOC_IMAGES = BASE_DIR / "docs" / "images"


def _screenshot(target, name: str, **kwargs) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    target.screenshot(path=str(ARTIFACTS / name), **kwargs)
    if os.environ.get("UPDATE_DOC_IMAGES") == "1":
        DOC_IMAGES.mkdir(parents=True, exist_ok=True)
        target.screenshot(path=str(DOC_IMAGES / name), **kwargs)


def _serve(env: dict[str, str]) -> DaphneServer:
    call_command("load_knowledge", "runbooks", stdout=StringIO())
    return DaphneServer(env={"RUN_SWEEP_INTERVAL_SECONDS": "0", **env}, name="answers").start()


@pytest.fixture
def browser_for(user, monkeypatch):
    """`browser_for(server)`: a page on `server`'s chat, signed in as a plain user (session cookie)."""
    sync_api = pytest.importorskip("playwright.sync_api")
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    client = Client()
    client.force_login(user)
    with sync_api.sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        contexts = []

        def open_page(server: DaphneServer):
            context = browser.new_context(viewport={"width": 1000, "height": 900})
            contexts.append(context)
            context.add_cookies(
                [{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": server.url}]
            )
            page = context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            page.dialogs = []
            page.on("dialog", lambda dialog: (page.dialogs.append(dialog.message), dialog.dismiss()))
            page.goto(f"{server.url}/chat/")
            assert urlsplit(page.url).path == "/chat/"
            return page

        yield open_page
        for context in contexts:
            context.close()
        browser.close()


def _ask(page, text: str):
    page.fill("#query", text)
    page.click("#ask")
    turn = page.locator(".turn").last
    turn.locator(".run-id").filter(has_text=re.compile("run_")).wait_for()
    return turn


def _finished(turn) -> None:
    wait_for(lambda: turn.get_attribute("data-finished") == "true", 20, message="the outcome")


def _labels(turn) -> list[str]:
    return [label.strip() for label in turn.locator(".progress .stage-label").all_inner_texts()]


def _hrefs(html_or_locator) -> list[str]:
    if isinstance(html_or_locator, str):
        return re.findall(r'<a class="citation" href="([^"]+)"', html_or_locator)
    return [a.get_attribute("href") for a in html_or_locator.locator("a.citation").all()]


def test_a_demo_run_shows_its_stages_and_its_citations_open_their_chunk(browser_for):
    server = _serve({"LLM_PROVIDER": "demo"})
    try:
        page = browser_for(server)
        turn = _ask(page, DEMO_QUESTIONS[0])
        _finished(turn)
        run = DiagnosisRun.objects.get(run_id=turn.get_attribute("data-run-id"))
        assert (run.status, run.release_decision) == ("SUCCESS", "PUBLISHED")
        assert turn.locator(".status").inner_text().lower() == "answered"
        assert turn.get_attribute("data-release") == "PUBLISHED"
        # The offline demo model answered it: the answer says so.
        assert turn.locator(".demo").is_visible() and turn.get_attribute("data-demo") == "true"

        # The stages, in the order they happened, each with its time since the question.
        assert _labels(turn) == [
            "Routed: diagnosis",
            "Model step 1",
            "Tool lookup_knowledge finished",
            "Model step 2",
            "Evidence check: passed",
            "Semantic check: passed",
            "Released",
        ]
        assert all(re.fullmatch(r"\+\d+\.\d s", at) for at in turn.locator(".stage-at").all_inner_texts())
        assert turn.locator(".stage.current").count() == 0
        assert turn.locator(".draft-box").is_hidden()  # verified mode: no draft ever

        # The released answer, rendered by the server; its citations are links to the runbook view.
        content = turn.locator(".content")
        assert "md" in content.get_attribute("class")
        expected = _hrefs(render_answer(run.content))
        assert expected and _hrefs(content) == expected
        assert content.locator("li").count() >= 1
        _screenshot(turn, "chat-answer-with-citations.png")

        citation = content.locator("a.citation").first
        slug, ordinal = re.fullmatch(r"/knowledge/([^/]+)/\?chunk=(\d+)#chunk-\d+", expected[0]).groups()
        with page.context.expect_page() as opened:
            citation.click()  # opens beside the conversation
        runbook = opened.value
        runbook.wait_for_load_state()
        assert urlsplit(runbook.url).path == f"/knowledge/{slug}/"
        assert urlsplit(runbook.url).fragment == f"chunk-{ordinal}"
        cited = runbook.locator("section.chunk.cited")
        assert cited.count() == 1 and cited.get_attribute("id") == f"chunk-{ordinal}"
        assert cited.is_visible() and runbook.evaluate(
            "id => { const r = document.getElementById(id).getBoundingClientRect();"
            " return r.top >= 0 && r.top < window.innerHeight; }",
            f"chunk-{ordinal}",
        )
        # For the picture: the cited chunk with some of the page above it (its heading, the note).
        runbook.set_viewport_size({"width": 1000, "height": 760})
        runbook.evaluate(
            "id => window.scrollTo(0, Math.max(0, document.getElementById(id).offsetTop - 440))",
            f"chunk-{ordinal}",
        )
        _screenshot(runbook, "runbook-cited-chunk.png")
    finally:
        server.stop()


def test_verified_mode_shows_progress_not_text_then_an_inert_rendered_answer(browser_for, provider):
    call_command("load_knowledge", "runbooks", stdout=StringIO())
    cite = search_knowledge("replication lag").items[0].id  # what the scripted tool call retrieves
    provider.delay, provider.pieces = 0.25, 12
    provider.answer = (
        f"From the runbooks:\n\n- Check `SHOW SLAVE STATUS` first [{cite}].\n"
        f"- <script>window.pwned = 1; alert('script')</script> "
        f"<img src=x onerror=\"window.pwned = 2; alert('img')\"> [{cite}]\n"
        f"- [a trap](javascript:window.pwned=3) **batch** large deletes [{cite}]"
    )
    server = _serve(provider.env(provider.base_url))
    try:
        page = browser_for(server)
        turn = _ask(page, "MySQL replication lag keeps growing on db-3. What should I check?")
        # While the answer is being written: its stage runs and ticks, and no text is shown.
        step = turn.locator(".stage.current[data-stage=MODEL_STEP]").filter(has_text="Model step 2")
        step.wait_for()
        first = float(step.locator(".stage-took").inner_text().split()[0])
        page.wait_for_timeout(700)
        assert float(step.locator(".stage-took").inner_text().split()[0]) > first
        assert turn.locator(".content").is_hidden() and turn.locator(".draft-box").is_hidden()
        assert "SHOW SLAVE STATUS" not in turn.inner_text()
        _screenshot(turn, "chat-progress.png")

        _finished(turn)
        run = DiagnosisRun.objects.get(run_id=turn.get_attribute("data-run-id"))
        assert run.release_decision == "PUBLISHED"
        content = turn.locator(".content")
        assert _hrefs(content) == _hrefs(render_answer(run.content)) and len(_hrefs(content)) == 3
        assert "<script>window.pwned = 1;" in content.inner_text()
        page.wait_for_timeout(300)
        assert page.dialogs == []
        assert page.evaluate("typeof window.pwned") == "undefined"
        assert content.locator("script, img, [onerror]").count() == 0
        assert page.evaluate("document.querySelectorAll('[onerror], a[href^=javascript]').length") == 0
    finally:
        server.stop()


def test_draft_mode_shows_the_draft_marked_unverified_until_the_outcome_replaces_it(browser_for, provider):
    provider.delay, provider.pieces = 0.25, 12
    server = _serve({**provider.env(provider.base_url), "CHAT_RELEASE": "draft"})
    try:
        page = browser_for(server)
        turn = _ask(page, "MySQL replication lag keeps growing on db-3. What should I check?")
        box = turn.locator(".draft-box")
        box.wait_for(state="visible")
        assert turn.locator(".draft-label").inner_text().lower() == "unverified draft — not yet checked"
        wait_for(lambda: turn.locator(".draft-text").inner_text().strip() != "", 10, message="draft text")
        _screenshot(turn, "chat-draft.png")
        _finished(turn)
        run = DiagnosisRun.objects.get(run_id=turn.get_attribute("data-run-id"))
        assert run.release_decision == "PUBLISHED"
        assert box.is_hidden() and turn.locator(".draft-text").inner_text() == ""
        assert _hrefs(turn.locator(".content")) == _hrefs(render_answer(run.content))
    finally:
        server.stop()
