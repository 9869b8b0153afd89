"""The record over MCP, end to end: the official `mcp` client against a daphne process serving
`config.asgi` with `MCP_SERVER_ENABLED`, on runs the real runtime executed (fake OpenAI-compatible
server, reasoning stored). A token's owner sees their own runs and nothing of another user's (the REST
API's 404 text), staff see what the REST API lets them see (the same trace and evidence bundle),
reasoning is never served, a wrong token is refused and counted, and without the setting `/mcp` is
absent."""

from __future__ import annotations

import httpx
import pytest
from mcp.shared.exceptions import MCPError

from core.api import NOT_FOUND_RUN
from surfaces.mcp.reads import STAFF_ONLY
from surfaces.mcp.server import TOOLS
from tests.agent.runtime.support import ROUTER_THINKING
from tests.surfaces.mcp.support import (
    QUIET,
    REASONING_TEXTS,
    executed_run,
    json_of,
    mcp_server,
    refusal_of,
    text_of,
    token_of,
    with_client,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("runtime_pools", "corpus"),
]


@pytest.fixture
def server():
    daphne = mcp_server(MCP_SERVER_ENABLED="true")
    yield daphne
    daphne.stop()


def _everything(client, run_id: str, session_id: str) -> dict:
    """Every read the endpoint offers, for one run, as the client receives it."""

    async def work():
        tools = await client.list_tools()
        resources = await client.list_resources()
        first = resources.resources[0]
        return {
            "tools": sorted(t.name for t in tools.tools),
            "readOnly": {t.name: t.annotations.read_only_hint for t in tools.tools},
            "search": await client.call_tool("search_runs", {}),
            "searchText": await client.call_tool("search_runs", {"text": "disk"}),
            "trace": await client.call_tool("get_run_trace", {"runId": run_id}),
            "latest": await client.call_tool("get_run_trace", {"sessionId": session_id}),
            "bundle": await client.call_tool(
                "get_evidence_bundle", {"sessionId": session_id, "runId": run_id}
            ),
            "verify": await client.call_tool("verify_run", {"runId": run_id}),
            "queue": await client.call_tool("list_review_queue", {}),
            "resources": [(r.uri, r.title) for r in resources.resources],
            "runbook": (await client.read_resource(str(first.uri))).contents[0].text,
        }

    return work()


def _served_text(answers: dict) -> str:
    parts = []
    for value in answers.values():
        parts.append(text_of(value) if hasattr(value, "content") else str(value))
    return "\n".join(parts)


def test_an_owner_reads_their_runs_and_nothing_of_another_users(llm, user, other_user, server):
    mine = executed_run(llm, user)
    theirs = executed_run(llm, other_user, "Nginx answers 502 Bad Gateway")
    url = f"{server.url}/mcp"
    token = token_of(user)

    answers = with_client(url, token, lambda client: _everything(client, mine.run_id, mine.session_id))

    assert answers["tools"] == sorted(spec.name for spec in TOOLS)
    assert all(answers["readOnly"].values())
    found = json_of(answers["search"])
    assert [r["runId"] for r in found["runs"]] == [mine.run_id] and found["more"] is False
    assert found["runs"][0]["releaseDecision"] == "PUBLISHED"
    assert [r["runId"] for r in json_of(answers["searchText"])["runs"]] == [mine.run_id]
    trace = json_of(answers["trace"])
    assert trace["run"]["runId"] == mine.run_id and trace["runResolution"] == "EXACT"
    assert trace["summary"]["auditComplete"] is True
    assert json_of(answers["latest"])["runResolution"] == "LATEST"
    verified = json_of(answers["verify"])
    assert verified["ok"] is True and verified["chainValid"] is True and verified["rowsVerified"] > 0
    # Visible, but the role is missing: the REST API's 403 texts (after the 404 check).
    assert answers["bundle"].is_error and "staff and reasoning auditors" in text_of(answers["bundle"])
    assert answers["queue"].is_error and text_of(answers["queue"]) == STAFF_ONLY
    assert ("runbook://disk-full", "Disk full on /var/log") in [(str(u), t) for u, t in answers["resources"]]
    assert "[kb:disk-full#1]" in answers["runbook"]
    served = _served_text(answers)
    for reasoning in REASONING_TEXTS:
        assert reasoning not in served

    async def another_users(client):
        return [
            await client.call_tool("get_run_trace", {"runId": theirs.run_id}),
            await client.call_tool("get_run_trace", {"sessionId": theirs.session_id}),
            await client.call_tool("get_evidence_bundle", {"runId": theirs.run_id}),
            await client.call_tool("verify_run", {"sessionId": mine.session_id, "runId": theirs.run_id}),
            await client.call_tool("get_run_trace", {"runId": "made-up-run"}),
            await client.call_tool("search_runs", {"text": theirs.run_id}),
            await client.call_tool("search_runs", {"sessionId": theirs.session_id}),
        ]

    async def mistakes(client):
        unknown = None
        try:
            await client.read_resource("runbook://no-such-runbook")
        except MCPError as exc:
            unknown = exc
        return await client.call_tool("search_runs", {"createdAfter": "yesterday"}), unknown

    *refused, by_id, by_session = with_client(url, token, another_users)
    # Another user's run and a made-up one: one answer, the REST API's 404 text.
    assert [(r.is_error, text_of(r)) for r in refused] == [(True, NOT_FOUND_RUN)] * 5
    assert json_of(by_id)["runs"] == []
    assert by_session.is_error and text_of(by_session) == "No such session."
    invalid, unknown = with_client(url, token, mistakes)
    assert invalid.is_error and text_of(invalid).startswith("Invalid arguments: createdAfter:")
    assert (unknown.code, unknown.message) == (-32002, "No such runbook.")


def test_staff_read_what_the_rest_api_lets_them_read(llm, user, other_user, auditor, api_client, server):
    """A staff reasoning auditor, whose token reads reasoning over REST, still gets none over MCP."""
    mine = executed_run(llm, user)
    theirs = executed_run(llm, other_user, "Nginx answers 502 Bad Gateway")
    api_client.credentials(HTTP_AUTHORIZATION=f"Token {token_of(other_user)}")
    vote = api_client.post(
        f"/api/diagnosis/{theirs.session_id}/runs/{theirs.run_id}/feedback", {"rating": "down"}
    )
    assert vote.status_code == 201  # on the review queue: voted down
    token = token_of(auditor, otp_verified=True)

    answers = with_client(
        f"{server.url}/mcp", token, lambda client: _everything(client, theirs.run_id, theirs.session_id)
    )

    assert {r["runId"] for r in json_of(answers["search"])["runs"]} == {mine.run_id, theirs.run_id}
    # The same bodies as the REST endpoints answer the same token.
    api_client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    rest_trace = api_client.get(f"/api/diagnosis/{theirs.session_id}/trace", {"runId": theirs.run_id})
    rest_bundle = api_client.get(f"/api/diagnosis/{theirs.session_id}/runs/{theirs.run_id}/evidence")
    assert rest_trace.status_code == rest_bundle.status_code == 200
    assert json_of(answers["trace"]) == rest_trace.json()
    assert json_of(answers["bundle"]) == rest_bundle.json()
    queue = json_of(answers["queue"])
    assert [(r["runId"], r["reasons"]) for r in queue["runs"]] == [(theirs.run_id, ["downvoted"])]
    assert queue["total"] == 1 and {"reason": "downvoted", "label": "voted down by a user", "count": 1} in [
        {k: c[k] for k in ("reason", "label", "count")} for c in queue["counts"]
    ]
    rest_reasoning = api_client.get(
        f"/api/diagnosis/{theirs.session_id}/trace/reasoning", {"runId": theirs.run_id}
    )
    assert rest_reasoning.status_code == 200 and ROUTER_THINKING in rest_reasoning.content.decode()
    served = _served_text(answers)
    for reasoning in REASONING_TEXTS:
        assert reasoning not in served


def test_a_wrong_token_is_refused_and_every_request_counted(llm, user, server):
    executed_run(llm, user)
    url = f"{server.url}/mcp"

    # The official client: the connection is refused with the REST API's message, never opened.
    refused = refusal_of(lambda: with_client(url, "0" * 40, lambda client: client.list_tools()))
    assert refused.message == "Invalid token."
    for headers in ({}, {"Authorization": "Bearer not-a-token"}, {"Authorization": "Basic dXNlcjpwdw=="}):
        answer = httpx.post(
            url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers=headers, timeout=10
        )
        assert answer.status_code == 401 and answer.headers["www-authenticate"].startswith("Bearer")
        assert answer.json()["error"]["message"]
    foreign = httpx.post(
        url,
        json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
        headers={"Authorization": f"Bearer {token_of(user)}", "Origin": "http://evil.example"},
        timeout=10,
    )
    assert foreign.status_code == 403

    tools = with_client(url, token_of(user), lambda client: client.list_tools())
    assert tools.tools
    metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    assert 'diagnosis_mcp_server_requests_total{method="http",outcome="unauthenticated"}' in metrics
    assert 'diagnosis_mcp_server_requests_total{method="http",outcome="bad_origin"} 1.0' in metrics
    assert 'diagnosis_mcp_server_requests_total{method="tools/list",outcome="ok"}' in metrics


def test_the_endpoint_is_absent_when_disabled(user):
    daphne = mcp_server(**QUIET)
    try:
        answer = httpx.post(
            f"{daphne.url}/mcp",
            json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
            headers={"Authorization": f"Bearer {token_of(user)}"},
            timeout=10,
        )
        assert answer.status_code == 404 and "jsonrpc" not in answer.text  # Django's 404, no MCP
        token = token_of(user)
        refused = refusal_of(
            lambda: with_client(f"{daphne.url}/mcp", token, lambda client: client.list_tools())
        )
        assert refused.message == "Not Found"
    finally:
        daphne.stop()
