"""Bad input: every refusal is the contract's error shape, nothing is written by a refused request, and
what is accepted is stored exactly and shown escaped.

* hostile identifiers (absent, another user's, SQL and HTML injection, 4-byte UTF-8, control characters,
  over-long) on every endpoint that takes a `sessionId` or `runId`: 400 or 404 in the error shape, never a
  5xx, another user's ids answered exactly like absent ones, and nothing written (no feedback, no access
  log row, no cancel);
* bodies that are too large, not UTF-8, not JSON, not an object: 400/413/415 on every POST endpoint, no
  run or feedback created;
* 4-byte UTF-8 and control characters through a real run, the API, feedback and the admin: stored and
  returned byte for byte, the hash chain verifies;
* SQL and HTML injection strings in a question, an answer, a tool input and a feedback comment: stored
  as text, the tables intact, and escaped in the admin's list, search and run page (the chat page is
  checked in a browser by tests/core/test_browser.py).

Empty and over-long queries, malformed JSON and malformed or oversized WebSocket frames at the chat
transport are proven by tests/surfaces/chat/test_sse.py and tests/surfaces/chat/test_ws.py (cited in
docs/reliability.md).
"""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest

from audit.models import ToolInvocation, TraceEvent
from audit.read import get_trace
from diagnosis import services
from diagnosis.models import DiagnosisRun, ReleaseDecision, RunFeedback, RunStatus
from reasoning.models import ReasoningAccessLog
from tests.agent.runtime.support import AGENT, ask, evidence_ids, load_corpus
from tests.factories import issue_token, make_recorded_run
from tests.fakes.openai_server import stream_answer, stream_tool_calls
from tests.surfaces.admin.support import grant_console

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("runtime_pools")]

HOSTILE_IDS = {
    "sql-injection": "x' OR '1'='1",
    "sql-comment": "1; DROP TABLE diagnosis_run; --",
    "html": "<script>alert(1)</script>",
    "four-byte-utf8": "ses_🧯🔥",
    "control-chars": "ses_\x01\x1b[31m",
    "nul": "ses_\x00",
    "over-long": "s" * 65,
    "very-long": "r" * 5000,
    "dot-dot": "..",
}


@pytest.fixture
def token_client(client, user):
    key = issue_token(user)
    client.defaults["HTTP_AUTHORIZATION"] = f"Token {key}"
    return client


def _assert_error(response, statuses=(400, 404)):
    assert response.status_code in statuses, (response.status_code, response.content[:300])
    body = response.json()
    assert set(body) == {"error"} and {"code", "message"} <= set(body["error"])
    assert "Traceback" not in body["error"]["message"] and "SELECT" not in body["error"]["message"]
    return body


def _requests(sid: str, rid: str):
    """Every endpoint that takes a session or run id, as (method, path, query, body)."""
    s, r = quote(sid, safe=""), quote(rid, safe="")
    return [
        ("get", f"/api/diagnosis/{s}/runs/", {}, None),
        ("get", f"/api/diagnosis/{s}/trace", {"runId": rid}, None),
        ("get", f"/api/diagnosis/{s}/trace/reasoning", {"runId": rid}, None),
        ("get", f"/api/diagnosis/{s}/audits", {}, None),
        ("post", f"/api/diagnosis/{s}/runs/{r}/feedback", {}, {"rating": "up", "comment": "x"}),
        ("get", f"/api/diagnosis/{s}/runs/{r}/events", {}, None),
        ("post", f"/api/diagnosis/{s}/runs/{r}/cancel", {}, None),
    ]


def _send(client, method, path, query, body):
    if method == "get":
        return client.get(path, query)
    return client.post(path, data=json.dumps(body or {}), content_type="application/json")


def test_hostile_and_foreign_ids_are_refused_alike_everywhere_and_write_nothing(token_client, other_user):
    theirs = make_recorded_run(other_user)
    absent = _requests("ses_absent0000", "run_absent0000")
    foreign = _requests(theirs.session_id, theirs.run_id)
    for a, f in zip(absent, foreign, strict=True):
        ra, rf = _send(token_client, *a), _send(token_client, *f)
        assert ra.status_code == rf.status_code == 404, a[1]
        assert ra.content == rf.content, a[1]  # no existence leak, not even in the wording
        _assert_error(ra, (404,))

    for name, hostile in HOSTILE_IDS.items():
        for as_session, as_run in ((hostile, theirs.run_id), (theirs.session_id, hostile)):
            for request in _requests(as_session, as_run):
                response = _send(token_client, *request)
                body = _assert_error(response)
                assert hostile not in body["error"]["message"] or len(hostile) < 3, (name, request[1])

    assert not RunFeedback.objects.exists()
    assert not ReasoningAccessLog.objects.exists()
    theirs.refresh_from_db()
    assert theirs.cancel_requested is False and theirs.status == RunStatus.SUCCESS
    assert DiagnosisRun.objects.count() == 1


def test_bodies_too_large_not_utf8_or_not_json_are_refused_and_create_nothing(token_client, user):
    mine = make_recorded_run(user)
    before = DiagnosisRun.objects.count()
    posts = [
        "/api/chat",
        f"/api/diagnosis/{mine.session_id}/runs/{mine.run_id}/feedback",
    ]
    cases = [
        (json.dumps({"query": "q" * (3 * 1024 * 1024), "rating": "up"}), "application/json", (413,)),
        (b'{"query": "\xff\xfe", "rating": "up"}', "application/json", (400,)),
        (b"\xff\xfe\x00{", "application/json", (400,)),
        ('{"query": "unterminated', "application/json", (400,)),
        ('["query", "rating"]', "application/json", (400,)),
        ("null", "application/json", (400,)),
        ("query=hi&rating=up", "text/plain", (400, 415)),
    ]
    for path in posts:
        for data, content_type, statuses in cases:
            response = token_client.post(path, data=data, content_type=content_type)
            _assert_error(response, statuses)
    assert DiagnosisRun.objects.count() == before
    assert not RunFeedback.objects.exists()


# --------------------------------------------------------------------------------------------------
# Text that is hard to store: 4-byte UTF-8 and control characters, end to end
# --------------------------------------------------------------------------------------------------
HARD_TEXT = "磁盘满了 🧯🔥 (emoji U+1F9EF) tab\there cr\rlf bell\x07 esc\x1b[0m zwsp\u200b ls\u2028 del\x7f"


def test_four_byte_utf8_and_control_characters_round_trip_through_a_run_the_api_and_the_admin(
    llm, tmp_path, user, staff_user, client
):
    load_corpus(tmp_path / "kb")
    llm.route("DIAGNOSIS")
    llm.add(
        AGENT,
        stream_tool_calls([("c_kb", "lookup_knowledge", json.dumps({"query": "disk full " + HARD_TEXT}))]),
        lambda request: stream_answer(f"清理日志 🧹 [{evidence_ids(request)[0]}] {HARD_TEXT}"),
    )
    llm.supported()
    run, outcome, _sink = ask(user, HARD_TEXT)
    assert outcome.release_decision == ReleaseDecision.PUBLISHED
    stored = DiagnosisRun.objects.get(run_id=run.run_id)
    assert stored.query == HARD_TEXT and stored.content == outcome.content and HARD_TEXT in stored.content
    tool = ToolInvocation.objects.get(run_id=run.run_id)
    assert tool.input_params["query"] == "disk full " + HARD_TEXT
    assert get_trace(run=stored).summary.audit_complete

    client.force_login(user)
    trace = client.get(f"/api/diagnosis/{run.session_id}/trace", {"runId": run.run_id}).json()
    assert trace["run"]["query"] == HARD_TEXT and trace["run"]["content"] == stored.content
    assert trace["tools"][0]["inputParams"]["query"] == "disk full " + HARD_TEXT
    assert trace["summary"]["chainValid"] is True
    comment = "👍 " + HARD_TEXT
    response = client.post(
        f"/api/diagnosis/{run.session_id}/runs/{run.run_id}/feedback",
        {"rating": "up", "comment": comment},
        content_type="application/json",
    )
    assert response.status_code == 201
    assert RunFeedback.objects.get(run__run_id=run.run_id).comment == comment

    grant_console(staff_user)
    client.force_login(staff_user)
    page = client.get(f"/admin/diagnosis/diagnosisrun/{stored.pk}/change/")
    assert page.status_code == 200
    assert "磁盘满了 🧯🔥" in page.content.decode()


# --------------------------------------------------------------------------------------------------
# Injection strings: stored as text, shown escaped
# --------------------------------------------------------------------------------------------------
SQL = "Robert'); DROP TABLE diagnosis_run; --"
HTML = '<script>alert("q")</script><img src=x onerror=alert(2)>'
INJECTION = f"{SQL} {HTML}"


def test_injection_strings_are_stored_as_text_and_escaped_in_the_admin(
    llm, tmp_path, user, staff_user, client
):
    load_corpus(tmp_path / "kb")
    llm.route("DIAGNOSIS")
    llm.add(
        AGENT,
        stream_tool_calls([("c_kb", "lookup_knowledge", json.dumps({"query": f"nginx 502 {INJECTION}"}))]),
        lambda request: stream_answer(f"Check the upstream [{evidence_ids(request)[0]}]. {HTML}"),
    )
    llm.supported()
    run, outcome, _sink = ask(user, INJECTION)
    assert outcome.status == RunStatus.SUCCESS
    run = DiagnosisRun.objects.get(run_id=run.run_id)
    assert run.query == INJECTION and HTML in run.content  # stored verbatim: parameters, never SQL text
    assert DiagnosisRun.objects.count() == 1 and TraceEvent.objects.filter(run_id=run.run_id).exists()
    services.create_session(owner=user)  # the tables are all still there and writable

    grant_console(staff_user)
    client.force_login(staff_user)
    pages = {
        "list": client.get("/admin/diagnosis/diagnosisrun/"),
        "search": client.get("/admin/diagnosis/diagnosisrun/", {"q": INJECTION}),
        "run": client.get(f"/admin/diagnosis/diagnosisrun/{run.pk}/change/"),
    }
    for name, page in pages.items():
        assert page.status_code == 200, name
        html = page.content.decode()
        assert "<script>alert(" not in html and "<img src=x onerror" not in html, name
        assert "&lt;script&gt;alert(" in html, name
        assert "Robert&#x27;); DROP TABLE diagnosis_run; --" in html, name
    assert run.run_id in pages["search"].content.decode()  # the search found it by its words
    injected_search = client.get("/admin/diagnosis/diagnosisrun/", {"q": "' OR '1'='1"})
    assert injected_search.status_code == 200 and run.run_id not in injected_search.content.decode()
