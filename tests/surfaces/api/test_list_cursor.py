"""Cursor pagination of the REST lists (`core.api.NewestFirstCursorPagination`): a client paging
through a session's runs, or through the sessions, sees every row that existed when it started exactly
once, newest first, while new rows keep arriving (they sort before its cursor)."""

from __future__ import annotations

import pytest

from diagnosis import services

pytestmark = pytest.mark.django_db


def _walk(api_client, url: str, on_page) -> list[str]:
    seen: list[str] = []
    while url:
        body = api_client.get(url).json()
        seen += [r.get("runId") or r["sessionId"] for r in body["results"]]
        on_page()
        url = body["next"]
    return seen


def test_runs_are_visited_exactly_once_while_new_runs_arrive(api_client, user, chat_session):
    existing = [services.create_run(session=chat_session, query=f"q{i}").run_id for i in range(23)]
    api_client.force_login(user)
    arrived = []

    def another():
        arrived.append(services.create_run(session=chat_session, query="later").run_id)

    seen = _walk(api_client, f"/api/diagnosis/{chat_session.session_id}/runs/?pageSize=5", another)
    assert len(arrived) == 5  # a new run after every page
    assert seen == list(reversed(existing))  # each once, newest first, none of the later ones


def test_sessions_are_visited_exactly_once_while_new_sessions_arrive(api_client, user):
    existing = [services.create_session(owner=user).session_id for _ in range(12)]
    api_client.force_login(user)
    seen = _walk(
        api_client, "/api/diagnosis/sessions/?pageSize=5", lambda: services.create_session(owner=user)
    )
    assert seen == list(reversed(existing))


def test_sessions_show_their_stored_run_count_and_last_run(api_client, user, chat_session):
    services.create_run(session=chat_session, query="a")
    last = services.create_run(session=chat_session, query="b")
    api_client.force_login(user)
    (row,) = api_client.get("/api/diagnosis/sessions/").json()["results"]
    assert row["runCount"] == 2
    assert row["lastRunAt"].replace("Z", "+00:00")[:23] == last.created_at.isoformat()[:23]
