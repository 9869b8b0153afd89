"""Conversations that persist, in headless Chromium against a daphne subprocess: the open conversation is
in the address, a reload replays it from the server (each question, its stages and its released answer),
a run still running at the reload is re-attached and finishes on the page, the sidebar lists the user's
own conversations newest first and searches them by the text of their questions, "New conversation"
starts an empty page while the old one stays one click away, and each answer takes the reader's
Helpful / Not helpful and comment, changeable, chained into the run's record and shown again after a
reload."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher

from audit.models import EventType, TraceEvent
from diagnosis import services
from diagnosis.models import DiagnosisRun, RunFeedback, RunStatus
from tests.browser import requires_chromium
from tests.surfaces.chat.support import ARTIFACTS, PASSWORD, wait_for
from tests.surfaces.chat.test_browser import _ask, _assert_shows_released

pytestmark = [pytest.mark.browser, requires_chromium, pytest.mark.django_db(transaction=True)]


def _login(page, site, user) -> None:
    page.goto(f"{site.url}/chat/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(lambda url: urlsplit(url).path == "/chat/")


def _session_in_address(page) -> str:
    return parse_qs(urlsplit(page.url).query).get("session", [""])[0]


def test_a_conversation_survives_a_reload_and_the_sidebar_finds_it(page, site, provider, staff_user, user):
    ARTIFACTS.mkdir(exist_ok=True)
    # Somebody else's conversation never shows in this user's sidebar, even for staff.
    services.create_session(owner=user, title="Someone else's disk question")
    _login(page, site, staff_user)
    # An empty question is not sent, and the page says why.
    page.fill("#query", "   \n  ")
    page.click("#ask")
    page.locator("#composer-note").filter(has_text="empty").wait_for()
    assert page.locator(".turn").count() == 0

    provider.delay = 0.02
    asked = []
    for question in (
        "MySQL replication lag keeps growing on db-3. What should I check?",
        "And if it's the disk?",
    ):
        turn = _ask(page, question)
        wait_for(lambda turn=turn: turn.get_attribute("data-finished") == "true", 40, message="an outcome")
        asked.append(turn.get_attribute("data-run-id"))
    session_id = _session_in_address(page)
    runs = list(DiagnosisRun.objects.filter(session_id=session_id).order_by("created_at"))
    assert [r.run_id for r in runs] == asked

    # Reload: both turns come back from the server, in order, with their released answers.
    page.reload()
    turns = page.locator(".turn")
    wait_for(lambda: turns.count() == 2 and turns.nth(1).get_attribute("data-finished") == "true", 40)
    for i, run in enumerate(runs):
        turn = turns.nth(i)
        assert turn.get_attribute("data-replayed") == "true"
        assert turn.get_attribute("data-run-id") == run.run_id
        assert turn.locator(".question").inner_text() == run.query
        assert turn.get_attribute("data-status") == "SUCCESS"
        _assert_shows_released(turn, run)
    assert page.locator("#session").inner_text() == f"conversation {session_id}"
    page.screenshot(path=str(ARTIFACTS / "chat-conversation-reloaded.png"), full_page=True)

    # The sidebar: this user's conversations only, the open one marked.
    sidebar = page.locator("#conversation-list a")
    wait_for(lambda: sidebar.count() == 1, 20, message="the sidebar")
    assert sidebar.first.get_attribute("aria-current") == "page"
    assert (
        "MySQL replication lag" in sidebar.first.inner_text() and "2 questions" in sidebar.first.inner_text()
    )

    # A follow-up asked after the reload continues the same conversation.
    third = _ask(page, "Thanks. One more: how do I check the relay log?")
    wait_for(lambda: third.get_attribute("data-finished") == "true", 40, message="the follow-up")
    assert DiagnosisRun.objects.get(run_id=third.get_attribute("data-run-id")).session_id == session_id

    # New conversation: an empty page; the old conversation is one click away in the sidebar.
    page.click("#new-session")
    page.wait_for_url(lambda url: not urlsplit(url).query)
    assert page.locator(".turn").count() == 0
    fresh = _ask(page, "Nginx answers 502 Bad Gateway")
    wait_for(lambda: fresh.get_attribute("data-finished") == "true", 40, message="the new conversation")
    new_session = _session_in_address(page)
    assert new_session and new_session != session_id
    wait_for(lambda: page.locator("#conversation-list a").count() == 2, 20, message="both in the sidebar")
    assert "Nginx" in page.locator("#conversation-list a").first.inner_text()  # newest first

    # Search by the text of any question, not only the first.
    page.fill("#conversation-search", "relay log")
    wait_for(lambda: page.locator("#conversation-list a").count() == 1, 20, message="the search")
    page.locator("#conversation-list a").first.click()
    page.wait_for_url(lambda url: _session_in_address(page) == session_id)
    wait_for(lambda: page.locator(".turn").count() == 3, 40, message="the reopened conversation")
    page.fill("#conversation-search", "no such words anywhere")
    page.locator(".conversation-none").wait_for()


def test_a_run_still_running_at_the_reload_is_reattached_and_finishes(page, site, provider, staff_user):
    _login(page, site, staff_user)
    provider.delay = 0.3
    provider.pieces = 12
    turn = _ask(page, "The replica is behind again, what now?")
    run_id = turn.get_attribute("data-run-id")
    page.reload()
    replayed = page.locator(f".turn[data-run-id='{run_id}']")
    replayed.wait_for()
    assert DiagnosisRun.objects.get(run_id=run_id).status in (RunStatus.PENDING, RunStatus.RUNNING)
    wait_for(
        lambda: replayed.get_attribute("data-finished") == "true", 30, message="the outcome after reload"
    )
    run = DiagnosisRun.objects.get(run_id=run_id)
    assert run.status == RunStatus.SUCCESS
    _assert_shows_released(replayed, run)


@pytest.fixture(autouse=True)
def _production_hash_for_the_other_user(user):
    user.password = PBKDF2PasswordHasher().encode(PASSWORD, "browser-salt", iterations=1000)
    user.save(update_fields=["password"])


def test_feedback_on_an_answer_is_recorded_chained_changeable_and_kept_across_a_reload(
    page, site, provider, staff_user
):
    _login(page, site, staff_user)
    provider.delay = 0.02
    turn = _ask(page, "MySQL replication lag keeps growing on db-3. What to check?")
    wait_for(lambda: turn.get_attribute("data-finished") == "true", 40, message="the outcome")
    run_id = turn.get_attribute("data-run-id")
    feedback = turn.locator(".feedback")
    assert feedback.is_visible() and turn.locator(".feedback-comment").is_hidden()

    # 👎, then a comment: one vote, its comment, both chained.
    feedback.locator(".vote[data-rating=down]").click()
    wait_for(
        lambda: RunFeedback.objects.filter(run_id=run_id, rating="down").exists(), 20, message="the vote"
    )
    feedback.locator(".vote[data-rating=down][aria-pressed=true]").wait_for()  # the page shows it
    turn.locator(".feedback-comment").fill("It missed the relay log check")
    feedback.locator(".feedback-send").click()
    wait_for(lambda: RunFeedback.objects.get(run_id=run_id).comment == "It missed the relay log check", 20)
    feedback.locator(".feedback-state").filter(has_text="recorded").wait_for()

    # After a reload the vote is shown; the reader changes their mind.
    page.reload()
    replayed = page.locator(f".turn[data-run-id='{run_id}']")
    wait_for(lambda: replayed.get_attribute("data-finished") == "true", 40, message="the replay")
    replayed.locator(".vote[data-rating=down][aria-pressed=true]").wait_for()
    assert replayed.get_attribute("data-feedback") == "down"
    assert replayed.locator(".feedback-comment").input_value() == "It missed the relay log check"
    replayed.locator(".vote[data-rating=up]").click()
    wait_for(lambda: RunFeedback.objects.get(run_id=run_id).rating == "up", 20, message="the changed vote")
    votes = TraceEvent.objects.filter(run_id=run_id, event_type=EventType.FEEDBACK_RECORDED)
    assert [e.details["rating"] for e in votes.order_by("sequence_no")] == ["down", "down", "up"]
    assert DiagnosisRun.objects.get(run_id=run_id).downvoted is False
