"""Tools per agent flow: the chat keeps exactly its tool list, AI Ops analyses get the metric and alert
tools besides the runbooks, a new tool is a chat tool unless it says otherwise, and the executor offers
a run the tools of its own `agent_flow` (recorded in RUN_STARTED)."""

from __future__ import annotations

import pytest

from agent.runtime.tools.registry import (
    FLOW_AI_OPS,
    FLOW_CHAT,
    ToolArgumentsError,
    ToolRegistry,
    default_registry,
)
from audit.models import EventType, TraceEvent
from diagnosis import services
from tests.agent.runtime.support import execute

CHAT_TOOLS = ["lookup_knowledge", "read_runbook"]
AI_OPS_TOOLS = ["create_silence", "list_alerts", "lookup_knowledge", "query_metrics", "read_runbook"]


def test_each_flow_gets_its_tools_and_the_chat_is_unchanged():
    assert default_registry().names() == CHAT_TOOLS
    assert default_registry(flow=FLOW_CHAT).names() == CHAT_TOOLS
    assert default_registry(flow=FLOW_AI_OPS).names() == AI_OPS_TOOLS
    assert default_registry(flow="NO_SUCH_FLOW").names() == []
    schemas = [t["function"]["name"] for t in default_registry(flow=FLOW_AI_OPS).openai_tools()]
    assert schemas == AI_OPS_TOOLS


def test_a_new_tool_is_a_chat_tool_unless_it_names_its_flows():
    registry = ToolRegistry()
    schema = {"type": "object", "properties": {}}
    registry.tool(name="plain", description="d", parameters=schema)(lambda: 1)
    registry.tool(name="ops", description="d", parameters=schema, flows=(FLOW_AI_OPS,))(lambda: 2)
    assert registry.get("plain").flows == frozenset({FLOW_CHAT})
    assert registry.for_flow(FLOW_CHAT).names() == ["plain"]
    assert registry.for_flow(FLOW_AI_OPS).names() == ["ops"]
    for flows in ("AI_OPS", ()):  # a bare string would be a set of letters
        with pytest.raises(ValueError, match="flows"):
            registry.tool(name="bad", description="d", parameters=schema, flows=flows)


def test_array_items_and_their_count_are_validated():
    spec = default_registry(flow=FLOW_AI_OPS).get("list_alerts")
    assert spec.validate("{}") == {"active_only": True, "filter": []}
    assert spec.validate('{"filter": ["severity=\\"warning\\""]}')["filter"] == ['severity="warning"']
    for bad, message in (
        ('{"filter": [1]}', r"filter\[0\] must be of type string"),
        ('{"filter": [""]}', r"filter\[0\] must have at least 1"),
        ('{"filter": ' + str(["a"] * 11).replace("'", '"') + "}", "at most 10 item"),
        ('{"filter": "alertname=x"}', "must be of type array"),
    ):
        with pytest.raises(ToolArgumentsError, match=message):
            spec.validate(bad)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("runtime_pools")
@pytest.mark.parametrize(("flow", "tools"), [(FLOW_CHAT, CHAT_TOOLS), (FLOW_AI_OPS, AI_OPS_TOOLS)])
def test_the_executor_offers_a_run_the_tools_of_its_flow(llm, chat_session, flow, tools, request):
    if flow == FLOW_AI_OPS:
        request.getfixturevalue("aiops_settings")  # its tools' servers configured and ready
    run = services.create_run(session=chat_session, query="Why is the API slow?", agent_flow=flow)
    execute(run.run_id)  # the provider is unscripted: the run ends at its first model call
    started = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.RUN_STARTED)
    assert started.details["tools"] == tools
