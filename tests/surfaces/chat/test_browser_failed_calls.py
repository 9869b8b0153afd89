"""The chat card of a run whose tool call failed (issue 45 item 3), in headless Chromium against a daphne
subprocess with the real runtime: the agent reads a runbook section that does not exist beside a lookup
that works; the answer is published with the service's failed-calls section, which the card shows apart
from the model's text (`aside.failed-calls`), live and again after a reload, and the tool's line says
"failed"."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from audit import failed_calls
from audit.models import ToolInvocation, ToolStatus
from diagnosis.models import DiagnosisRun, ReleaseDecision
from tests.accessibility import assert_accessible
from tests.browser import requires_chromium
from tests.surfaces.chat.support import ARTIFACTS, PASSWORD, wait_for
from tests.surfaces.chat.test_browser import _ask

pytestmark = [pytest.mark.browser, requires_chromium, pytest.mark.django_db(transaction=True)]


def test_the_chat_card_shows_a_failed_call_apart_from_the_answer(page, site, provider, staff_user):
    ARTIFACTS.mkdir(exist_ok=True)
    provider.tools = (
        ("lookup_knowledge", {"query": "replication lag"}),
        ("read_runbook", {"id": "kb:no-such-runbook#1"}),
    )
    page.goto(f"{site.url}/chat/")
    page.fill("#id_username", staff_user.username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(lambda url: urlsplit(url).path == "/chat/")

    turn = _ask(page, "MySQL replication lag keeps growing on db-3. What should I check?")
    wait_for(lambda: turn.get_attribute("data-finished") == "true", 20, message="the outcome")
    run = DiagnosisRun.objects.get(run_id=turn.get_attribute("data-run-id"))
    assert run.release_decision == ReleaseDecision.PUBLISHED
    failed = ToolInvocation.objects.get(run_id=run.run_id, tool_name="read_runbook")
    assert failed.status == ToolStatus.FAILED
    assert failed_calls.split(run.content)[1], run.content

    def shows_the_failure(card) -> None:
        aside = card.locator(".content aside.failed-calls")
        assert aside.is_visible()
        text = aside.inner_text()
        assert "Failed tool calls" in text and "read_runbook" in text and failed.tool_call_id in text
        assert "no result was obtained" in text
        # The model's answer is above it, outside the aside.
        assert "lookup_knowledge" not in text

    shows_the_failure(turn)
    line = turn.locator(f'.tool[data-tool-call-id="{failed.tool_call_id}"]')
    assert line.get_attribute("data-status") == "FAILED" and "failed" in line.inner_text()
    assert_accessible(page, "chat with a failed tool call")
    page.screenshot(path=str(ARTIFACTS / "chat-failed-call.png"), full_page=True)

    page.reload()
    replayed = page.locator(f'.turn[data-run-id="{run.run_id}"]')
    wait_for(lambda: replayed.get_attribute("data-finished") == "true", 20, message="the replay")
    shows_the_failure(replayed)
