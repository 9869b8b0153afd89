"""`GET /api/diagnosis/sessions/?mine=true&q=…`: the chat's list of conversations — the user's own only
(also for staff, who otherwise see every session), searchable by the text of the title or any question."""

from __future__ import annotations

import pytest

from diagnosis import services

pytestmark = pytest.mark.django_db

URL = "/api/diagnosis/sessions/"


def _ids(response) -> list[str]:
    assert response.status_code == 200, response.content
    return [s["sessionId"] for s in response.json()["results"]]


@pytest.fixture
def conversations(user, staff_user):
    disk = services.create_session(owner=staff_user, title="Disk full on /var/log")
    services.create_run(session=disk, query="Disk full on /var/log")
    services.create_run(session=disk, query="How do I rotate the Nginx access log?")
    lag = services.create_session(owner=staff_user, title="Replication lag on db-3")
    theirs = services.create_session(owner=user, title="Disk full on the build host")
    return disk, lag, theirs


def test_mine_lists_only_the_users_own_newest_first_even_for_staff(api_client, staff_user, conversations):
    disk, lag, theirs = conversations
    api_client.force_authenticate(staff_user)
    assert set(_ids(api_client.get(URL))) == {disk.session_id, lag.session_id, theirs.session_id}
    assert _ids(api_client.get(URL, {"mine": "true"})) == [lag.session_id, disk.session_id]


def test_q_matches_the_title_or_any_question_case_insensitively(api_client, staff_user, user, conversations):
    disk, lag, theirs = conversations
    api_client.force_authenticate(staff_user)
    assert _ids(api_client.get(URL, {"mine": "true", "q": "NGINX access"})) == [disk.session_id]
    assert _ids(api_client.get(URL, {"mine": "true", "q": "lag"})) == [lag.session_id]
    assert _ids(api_client.get(URL, {"mine": "true", "q": "nothing like this"})) == []
    # Without `mine`, a user still sees only what they may see.
    api_client.force_authenticate(user)
    assert _ids(api_client.get(URL, {"q": "disk full"})) == [theirs.session_id]


def test_a_search_text_over_the_limit_is_a_400(api_client, user):
    api_client.force_authenticate(user)
    response = api_client.get(URL, {"q": "x" * 201})
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_request"
