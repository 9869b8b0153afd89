"""`read_runbook`, the tool added by following docs/contributing.md's recipe (one module in
agent/runtime/tools/): offered to both flows, it returns a section and its neighbours as citable evidence
that the guards accept like `lookup_knowledge`'s, and an unknown id fails the call without a guess — on
runs the real runtime executed against the fake OpenAI-compatible server."""

from __future__ import annotations

import json

import pytest

from agent.runtime.tools.registry import FLOW_AI_OPS, FLOW_CHAT, default_registry
from audit.models import ToolInvocation, ToolStatus
from diagnosis.models import ReleaseDecision, RunStatus
from tests.agent.runtime.support import AGENT, GUARD, ROUTE, ROUTER, VERDICT, ask, evidence_ids
from tests.fakes.openai_server import stream_answer, stream_tool_calls, usage

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("runtime_pools", "corpus"),
]


def test_both_flows_offer_it():
    assert "read_runbook" in default_registry(flow=FLOW_CHAT).names()
    assert "read_runbook" in default_registry(flow=FLOW_AI_OPS).names()


def _script(llm, arguments: dict, *answers) -> None:
    llm.add(ROUTER, stream_answer(ROUTE, usage=usage(40, 10)))
    llm.add(
        AGENT,
        stream_tool_calls([("call_1", "read_runbook", json.dumps(arguments))], usage=usage(200, 20)),
        *answers,
    )
    llm.add(GUARD, stream_answer(VERDICT, usage=usage(100, 10)))


def test_a_section_and_its_neighbours_are_citable_evidence(llm, user):
    _script(
        llm,
        {"id": "kb:disk-full#2"},
        lambda request: stream_answer(
            f"Check deleted files still held open with lsof [{evidence_ids(request)[-1]}].",
            usage=usage(300, 30),
        ),
    )
    run, outcome, _ = ask(user, "Disk full on /var/log")
    assert run.status == RunStatus.SUCCESS and outcome.release_decision == ReleaseDecision.PUBLISHED
    (tool,) = ToolInvocation.objects.filter(run_id=run.run_id)
    assert (tool.tool_name, tool.status) == ("read_runbook", ToolStatus.SUCCEEDED)
    assert tool.input_params == {"id": "kb:disk-full#2", "around": 1}
    # Sections 1-3 of the runbook, each under the id lookup_knowledge gives it; the answer cites one.
    assert "[kb:disk-full#3]" in outcome.content
    request = llm.requests[AGENT][-1]
    assert evidence_ids(request) == ["kb:disk-full#1", "kb:disk-full#2", "kb:disk-full#3"]


def test_an_unknown_section_fails_the_call_and_nothing_is_invented(llm, user):
    _script(
        llm,
        {"id": "kb:disk-full#99", "around": 0},
        # The uncited answer, and again when the evidence guard asks for citations.
        stream_answer("Delete the old logs.", usage=usage(300, 30)),
        stream_answer("Delete the old logs.", usage=usage(300, 30)),
    )
    run, outcome, _ = ask(user, "Disk full on /var/log")
    (tool,) = ToolInvocation.objects.filter(run_id=run.run_id)
    assert (tool.status, tool.error_code) == (ToolStatus.FAILED, "TOOL_ERROR")
    assert "UnknownEvidenceId" in tool.error_message and "kb:disk-full#99" in tool.error_message
    # The model saw the error, no evidence: an answer without a citation is not published.
    assert outcome.release_decision == ReleaseDecision.BLOCKED
