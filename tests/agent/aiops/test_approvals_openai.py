"""The approval flow through the real `openai` SDK (issue 16): the local OpenAI-compatible server scripts
an executor step that calls `query_metrics`, `lookup_knowledge` and `create_silence` in parallel (all
with the same provider id style `call_0`, `call_1`, `call_2` in every response); the run is interrupted,
approved, and resumed by the queue worker; the request the resumed executor sends carries one tool message
for each call of the interrupted step, paired by the provider's ids and in the step's order, with the
silence's real result — the saved state round-trips through the SDK's request building."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import Group
from django.core.management import call_command

from agent.aiops import intake
from agent.aiops.alertmanager import AlertmanagerClient
from agent.runtime import approvals, prompts
from audit.models import ToolInvocation, ToolStatus
from audit.verify.runs import verify_run
from bench.b7_aiops import AiOpsBenchProvider
from diagnosis.models import DiagnosisRun, RunStatus
from tests.agent.aiops.support import drain
from tests.fakes.openai_server import FakeLLMServer, finish_chunk, tool_call_chunks

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("chat_settings", "runtime_pools", "aiops_settings"),
]
RUNBOOKS = Path(django_settings.BASE_DIR) / "runbooks"
SILENCE = {
    "matchers": [{"name": "alertname", "value": "ApprovalViaSdk"}],
    "duration_minutes": 10,
    "comment": "sdk drill",
}


class SilencingProvider(AiOpsBenchProvider):
    """The bench's AI Ops provider whose executor also proposes a silence in its first tool step."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.report_requests: list[list[dict]] = []

    def __call__(self, request):
        if prompts.role_of(request.messages) == "executor":
            if not any(m.get("role") == "tool" for m in request.messages):
                calls = [
                    ("call_0", "query_metrics", json.dumps({"query": 'up{job="prometheus"}'})),
                    ("call_1", "lookup_knowledge", json.dumps({"query": "prometheus scrape slow"})),
                    ("call_2", "create_silence", json.dumps(SILENCE)),
                ]
                return self._stream(
                    [*tool_call_chunks(calls), finish_chunk("tool_calls")], prompt=900, completion=60
                )
            self.report_requests.append(list(request.messages))
        return super().__call__(request)


def test_interrupt_approve_resume_through_the_openai_sdk(settings, staff_user, django_user_model):
    call_command("load_knowledge", str(RUNBOOKS), stdout=io.StringIO())
    approver = django_user_model.objects.create_user("approver", is_staff=True)
    approver.groups.add(Group.objects.get(name=approvals.APPROVERS_GROUP))
    provider = SilencingProvider(call_seconds=0.0, chunk_interval=0.0)
    client = AlertmanagerClient(settings.ALERTMANAGER_URL, timeout=5, max_bytes=1 << 22)
    before = {s["id"] for s in client.silences()}
    with FakeLLMServer(handler=provider) as fake:
        for key, value in provider.settings(fake.base_url).items():
            setattr(settings, key, value)
        run_id = intake.start_staff_analysis(
            user=staff_user, query="Alert ApprovalViaSdk: slow scrapes"
        ).run_id
        drain()
        run = DiagnosisRun.objects.get(run_id=run_id)
        assert run.status == RunStatus.INTERRUPTED, run.error_code
        waiting = ToolInvocation.objects.get(run_id=run_id, tool_name="create_silence")
        assert waiting.status == ToolStatus.AWAITING_APPROVAL and provider.report_requests == []
        approvals.decide(
            run=run, tool_call_id=waiting.tool_call_id, decision=approvals.APPROVED, user=approver
        )
        drain()
        assert not fake.errors
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS, run.error_code
    waiting.refresh_from_db()
    assert waiting.status == ToolStatus.SUCCEEDED
    created = [s for s in client.silences() if s["id"] not in before]
    try:
        assert [s["matchers"][0]["value"] for s in created] == ["ApprovalViaSdk"]
    finally:
        import httpx

        for s in created:
            httpx.delete(f"{settings.ALERTMANAGER_URL}/api/v2/silence/{s['id']}", timeout=5)
    # The resumed executor's request: the step's assistant turn, then one tool message per call, paired
    # by the provider's ids in the step's order; the silence's message is its real result.
    messages = provider.report_requests[0]
    turn = next(i for i, m in enumerate(messages) if m.get("tool_calls"))
    ids = [c["id"] for c in messages[turn]["tool_calls"]]
    tool_messages = messages[turn + 1 : turn + 1 + len(ids)]
    assert [m["role"] for m in tool_messages] == ["tool"] * 3
    assert [m["tool_call_id"] for m in tool_messages] == ids == ["call_0", "call_1", "call_2"]
    assert json.loads(tool_messages[2]["content"])["silenceId"] == created[0]["id"]
    verification = verify_run(run_id)
    assert verification.ok, verification.problems
