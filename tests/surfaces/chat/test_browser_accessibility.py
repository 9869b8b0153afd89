"""The chat with an answer on it, in Chromium: axe-core finds no serious or critical violation
(`tests/accessibility.py`), and the page works from the keyboard: Tab reaches the question box, the ask
button, the answer's feedback buttons and the sidebar, each showing a visible focus outline, and a vote
is given with the keyboard alone. On the real stack (a daphne subprocess, the scripted fake provider)."""

from __future__ import annotations

import pytest

from diagnosis.models import RunFeedback
from tests.accessibility import assert_accessible
from tests.browser import requires_chromium
from tests.surfaces.chat.support import wait_for
from tests.surfaces.chat.test_browser import _ask
from tests.surfaces.chat.test_browser_conversations import _login

pytestmark = [pytest.mark.browser, requires_chromium, pytest.mark.django_db(transaction=True)]

FOCUS_STYLE = """() => {
  const el = document.activeElement;
  const style = getComputedStyle(el);
  return {
    tag: el.tagName, id: el.id, cls: el.className, rating: el.dataset.rating || "",
    outline: style.outlineStyle !== "none" && parseFloat(style.outlineWidth) > 0,
  };
}"""


def test_the_chat_with_an_answer_passes_axe_and_works_from_the_keyboard(page, site, provider, staff_user):
    _login(page, site, staff_user)
    turn = _ask(page, "Disk full on /var/log")
    wait_for(lambda: turn.get_attribute("data-finished") == "true", 30, message="the answer")
    assert_accessible(page, "chat with an answer")

    def tab_to(predicate, what: str) -> list[dict]:
        seen = []
        for _ in range(80):
            page.keyboard.press("Tab")
            focused = page.evaluate(FOCUS_STYLE)
            if focused["tag"] == "BODY":  # focus left the page (the browser's own controls): go round
                continue
            seen.append(focused)
            assert focused["outline"], f"no visible focus on {focused}"
            if predicate(focused):
                return seen
        raise AssertionError(f"Tab never reached {what}: {seen}")

    tab_to(lambda f: f["rating"] == "up", "the answer's feedback")
    page.keyboard.press("Enter")
    run_id = turn.get_attribute("data-run-id")
    wait_for(
        lambda: RunFeedback.objects.filter(run_id=run_id, user=staff_user, rating="up").exists(),
        10,
        message="the keyboard vote",
    )
    tab_to(lambda f: f["id"] == "query", "the question box")
    tab_to(lambda f: f["id"] == "ask", "the ask button")
    tab_to(lambda f: f["id"] == "conversation-search", "the conversation search")
