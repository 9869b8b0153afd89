"""Who may call what: the 401/403/404 matrix of every trace endpoint, check order, token and session auth.

Roles: anonymous, the session's owner, another user, staff, an auditor (staff + "Reasoning Auditors") and
a superuser. What a user may not see is 404 with exactly the body of something that does not exist.
"""

import pytest
from django.contrib.auth.models import Group
from django.core.cache import cache
from rest_framework.test import APIClient

from diagnosis import services
from reasoning.models import ReasoningAccessLog
from tests.factories import issue_token, make_recorded_run

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_throttle_state():
    cache.clear()
    yield
    cache.clear()


def _endpoints(run):
    sid, rid = run.session_id, run.run_id
    return {
        "sessions": ("get", "/api/diagnosis/sessions/", None),
        "runs": ("get", f"/api/diagnosis/{sid}/runs/", None),
        "trace": ("get", f"/api/diagnosis/{sid}/trace?runId={rid}", None),
        "trace_latest": ("get", f"/api/diagnosis/{sid}/trace", None),
        "reasoning": ("get", f"/api/diagnosis/{sid}/trace/reasoning?runId={rid}", None),
        "audits": ("get", f"/api/diagnosis/{sid}/audits", None),
        "feedback": ("post", f"/api/diagnosis/{sid}/runs/{rid}/feedback", {"rating": "up"}),
    }


EXPECTED = {
    #               sessions runs trace latest reasoning audits feedback
    "anonymous": (401, 401, 401, 401, 401, 401, 401),
    "owner": (200, 200, 200, 200, 403, 403, 201),
    "other": (200, 404, 404, 404, 404, 404, 404),
    "staff": (200, 200, 200, 200, 403, 403, 201),
    "auditor": (200, 200, 200, 200, 200, 403, 201),
    "superuser": (200, 200, 200, 200, 200, 200, 201),
}


def _client_for(role, users):
    client = APIClient()
    if role != "anonymous":
        client.credentials(HTTP_AUTHORIZATION=f"Token {issue_token(users[role])}")
    return client


@pytest.fixture
def users(user, other_user, staff_user, auditor, superuser):
    return {
        "owner": user,
        "other": other_user,
        "staff": staff_user,
        "auditor": auditor,
        "superuser": superuser,
    }


@pytest.mark.parametrize("role", list(EXPECTED))
def test_status_matrix_with_token_auth(role, users, traced_run):
    endpoints = _endpoints(traced_run)
    got = []
    for method, url, body in endpoints.values():
        response = getattr(_client_for(role, users), method)(url, body, format="json")
        got.append(response.status_code)
        if response.status_code >= 400:
            error = response.json()["error"]
            assert set(error) >= {"code", "message"}, (url, response.content)
    assert tuple(got) == EXPECTED[role], dict(zip(endpoints, got, strict=True))


@pytest.mark.parametrize("role", ["owner", "other", "staff", "auditor", "superuser"])
def test_status_matrix_with_session_auth(role, users, traced_run):
    client = APIClient()
    client.force_login(users[role])
    got = tuple(
        getattr(client, method)(url, body, format="json").status_code
        for method, url, body in _endpoints(traced_run).values()
    )
    assert got == EXPECTED[role]


def test_anonymous_gets_401_in_the_error_shape_with_a_challenge(api_client, traced_run):
    response = api_client.get(f"/api/diagnosis/{traced_run.session_id}/trace")
    assert response.status_code == 401
    assert response.json() == {
        "error": {"code": "not_authenticated", "message": "Authentication credentials were not provided."}
    }
    assert response["WWW-Authenticate"] == "Token"


def test_a_wrong_token_is_401_authentication_failed(api_client, traced_run):
    api_client.credentials(HTTP_AUTHORIZATION="Token " + "0" * 40)
    response = api_client.get("/api/diagnosis/sessions/")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "authentication_failed"


def test_an_inactive_users_token_is_refused(api_client, user, traced_run):
    token = issue_token(user)
    user.is_active = False
    user.save()
    api_client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert api_client.get("/api/diagnosis/sessions/").status_code == 401


def test_issue_token_command_gives_a_working_token(api_client, user, traced_run):
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("issue_token", user.username, stdout=out, stderr=StringIO())
    key = out.getvalue().strip()
    api_client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    response = api_client.get(f"/api/diagnosis/{traced_run.session_id}/trace")
    assert response.status_code == 200
    assert response.json()["run"]["runId"] == traced_run.run_id


def test_invisible_is_indistinguishable_from_absent(api_client, other_user, traced_run):
    """Another user's session and run answer exactly like ids that do not exist, on every endpoint."""
    api_client.force_login(other_user)
    sid, rid = traced_run.session_id, traced_run.run_id
    pairs = [
        (f"/api/diagnosis/{sid}/runs/", "/api/diagnosis/ses_absent/runs/"),
        (f"/api/diagnosis/{sid}/trace?runId={rid}", "/api/diagnosis/ses_absent/trace?runId=run_absent"),
        (f"/api/diagnosis/{sid}/trace", "/api/diagnosis/ses_absent/trace"),
        (
            f"/api/diagnosis/{sid}/trace/reasoning?runId={rid}",
            "/api/diagnosis/ses_absent/trace/reasoning?runId=run_absent",
        ),
        (f"/api/diagnosis/{sid}/audits", "/api/diagnosis/ses_absent/audits"),
    ]
    for hidden, absent in pairs:
        a, b = api_client.get(hidden), api_client.get(absent)
        assert a.status_code == b.status_code == 404, hidden
        assert a.content == b.content, hidden
    a = api_client.post(f"/api/diagnosis/{sid}/runs/{rid}/feedback", {"rating": "up"}, format="json")
    b = api_client.post("/api/diagnosis/ses_absent/runs/run_absent/feedback", {"rating": "up"}, format="json")
    assert a.status_code == b.status_code == 404 and a.content == b.content


def test_cross_session_run_id_is_404_even_for_staff_and_auditors(api_client, auditor, user, traced_run):
    """A run id that exists, but in another session, is never served under this session's path."""
    other_session = services.create_session(owner=user)
    api_client.force_login(auditor)
    for url in (
        f"/api/diagnosis/{other_session.session_id}/trace?runId={traced_run.run_id}",
        f"/api/diagnosis/{other_session.session_id}/trace/reasoning?runId={traced_run.run_id}",
    ):
        response = api_client.get(url)
        assert response.status_code == 404, url
        assert response.json()["error"]["code"] == "not_found"
    response = api_client.post(
        f"/api/diagnosis/{other_session.session_id}/runs/{traced_run.run_id}/feedback",
        {"rating": "down"},
        format="json",
    )
    assert response.status_code == 404
    assert not ReasoningAccessLog.objects.exists()


def test_reasoning_check_order(api_client, user, other_user, traced_run, django_user_model):
    """401 → 400 → 404 → 403: without the permission, an invisible session says 404 (never 403), and a
    missing runId says 400 before anything about the session."""
    sid, rid = traced_run.session_id, traced_run.run_id
    assert api_client.get(f"/api/diagnosis/{sid}/trace/reasoning").status_code == 401

    api_client.force_login(other_user)  # no permission, cannot see the session
    missing = api_client.get(f"/api/diagnosis/{sid}/trace/reasoning")
    assert missing.status_code == 400 and missing.json()["error"]["code"] == "invalid_request"
    assert "runId" in missing.json()["error"]["message"]
    assert api_client.get(f"/api/diagnosis/{sid}/trace/reasoning?runId=").status_code == 400
    assert api_client.get(f"/api/diagnosis/{sid}/trace/reasoning?runId={'x' * 65}").status_code == 400
    assert api_client.get(f"/api/diagnosis/{sid}/trace/reasoning?runId={rid}").status_code == 404
    assert api_client.get(f"/api/diagnosis/{sid}/trace/reasoning?runId=run_absent").status_code == 404

    api_client.force_login(user)  # owner without the permission
    assert api_client.get(f"/api/diagnosis/{sid}/trace/reasoning?runId=run_absent").status_code == 404
    denied = api_client.get(f"/api/diagnosis/{sid}/trace/reasoning?runId={rid}")
    assert denied.status_code == 403 and denied.json()["error"]["code"] == "permission_denied"
    assert not ReasoningAccessLog.objects.exists()


def test_an_auditor_who_is_not_staff_reads_only_own_sessions(api_client, traced_run, django_user_model):
    auditor = django_user_model.objects.create_user("plain-auditor", password="pw-x-1")
    auditor.groups.add(Group.objects.get(name="Reasoning Auditors"))
    api_client.force_login(auditor)
    url = f"/api/diagnosis/{traced_run.session_id}/trace/reasoning?runId={traced_run.run_id}"
    assert api_client.get(url).status_code == 404
    own = make_recorded_run(auditor)
    assert (
        api_client.get(f"/api/diagnosis/{own.session_id}/trace/reasoning?runId={own.run_id}").status_code
        == 200
    )


def test_session_list_shows_own_sessions_and_staff_all(api_client, user, other_user, staff_user, traced_run):
    mine = make_recorded_run(other_user)
    api_client.force_login(other_user)
    body = api_client.get("/api/diagnosis/sessions/").json()
    assert [s["sessionId"] for s in body["results"]] == [mine.session_id]
    api_client.force_login(staff_user)
    body = api_client.get("/api/diagnosis/sessions/").json()
    assert {s["sessionId"] for s in body["results"]} == {mine.session_id, traced_run.session_id}


def test_feedback_with_session_auth_needs_csrf(user, traced_run):
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(user)
    url = f"/api/diagnosis/{traced_run.session_id}/runs/{traced_run.run_id}/feedback"
    response = client.post(url, {"rating": "up"}, format="json")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "permission_denied"
