"""AI Ops analyses end to end: the planner and the executor recorded apart (per-agent step counters,
tool and reasoning rows naming their agent), PLAN_DECISION chained like every decision, plan fallback
and revision, the shared guards and release, the per-agent token ledger and the self-evaluation in the
trace and the admin, with the offline demo provider and with the local OpenAI-compatible server through
the real `openai` SDK. The Prometheus and Alertmanager tools are the stand-ins of `tests.agent.aiops.support`
(same names, arguments and evidence shapes); nothing else is replaced."""

import json

import pytest
from django.test import Client
from django.urls import reverse

from agent.runtime.events import ProgressEvent
from agent.runtime.guards import extract_citations
from agent.runtime.pipeline import BLOCKED_MESSAGE
from audit.models import AgentStep, EventType, Phase, ToolInvocation, ToolStatus, TraceEvent
from audit.verify import row_digests
from audit.verify.hash_chain import verify_chain
from audit.verify.row_digests import stored_reasoning_rows
from audit.verify.runs import verify_run
from diagnosis.models import ReleaseDecision, RunStatus
from reasoning.models import AgentReasoningAudit
from tests.agent.aiops.support import aiops_registry, metric_result, run_aiops
from tests.agent.runtime.support import AGENT, GUARD, ask, evidence_ids
from tests.fakes.openai_server import stream_answer, stream_tool_calls, usage

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("runtime_pools")]


def _events(run):
    return list(TraceEvent.objects.filter(run_id=run.run_id).order_by("sequence_no"))


def _plans(run):
    return [e for e in _events(run) if e.event_type == EventType.PLAN_DECISION]


def _steps(run):
    return [(s.agent_name, s.step_index) for s in AgentStep.objects.filter(run_id=run.run_id).order_by("id")]


def _trace(user, run):
    client = Client()
    client.force_login(user)
    response = client.get(f"/api/diagnosis/{run.session_id}/trace?runId={run.run_id}")
    assert response.status_code == 200, response.content
    return response.json()


def _assert_verifies(run):
    verdict = verify_run(run.run_id)
    assert verdict.ok and verdict.chain_valid, (verdict.invalid, verdict.incomplete)
    assert not verdict.notes, verdict.notes  # every row bound, none recorded before digests
    return verdict


@pytest.fixture
def demo(settings, corpus):
    settings.LLM_PROVIDER = "demo"


# --------------------------------------------------------------------------------------------------
# The demo provider drives the whole flow
# --------------------------------------------------------------------------------------------------
def test_demo_analysis_records_planner_and_executor_apart_and_verifies(demo, user):
    run, outcome, sink = run_aiops(user, registry=aiops_registry())

    assert outcome.status == run.status == RunStatus.SUCCESS
    assert run.release_decision == ReleaseDecision.PUBLISHED and run.intent == "DIAGNOSIS"
    # Live progress names the agent of each model step, STARTED and FINISHED alike.
    for status in ("STARTED", "FINISHED"):
        steps_seen = [
            (e.agent_name, e.step_index)
            for e in sink.of_type(ProgressEvent)
            if e.stage == "MODEL_STEP" and e.status == status
        ]
        assert steps_seen == [("planner", 1), ("executor", 1), ("executor", 2), ("executor", 3)], status
    for section in ("## Summary", "## Evidence", "## Likely cause", "## Next steps"):
        assert section in run.content

    # Each agent counts its own steps from 1; the planner calls no tool.
    assert _steps(run) == [("planner", 1), ("executor", 1), ("executor", 2), ("executor", 3)]
    steps = {(s.agent_name, s.step_index): s for s in AgentStep.objects.filter(run_id=run.run_id)}
    assert not steps[("planner", 1)].has_tool_call
    tools = list(ToolInvocation.objects.filter(run_id=run.run_id).order_by("id"))
    assert [(t.agent_name, t.step_index, t.tool_name) for t in tools] == [
        ("executor", 1, "list_alerts"),
        ("executor", 1, "query_metrics"),
        ("executor", 2, "lookup_knowledge"),
    ]
    assert all(t.status == ToolStatus.SUCCEEDED for t in tools)
    assert all(t.step_id == steps[(t.agent_name, t.step_index)].pk for t in tools)
    reasoning = set(
        AgentReasoningAudit.objects.filter(run_id=run.run_id).values_list("agent_name", "step_index")
    )
    assert {("planner", 1), ("executor", 1), ("executor", 2), ("executor", 3)} <= reasoning
    assert any(agent == "semantic_guard" for agent, _i in reasoning)

    # The report cites what the tools returned: the metric result's prom id and runbook chunks.
    metric = next(t for t in tools if t.tool_name == "query_metrics")
    prom_id = metric_result(metric.input_params["query"]).evidence[0].id
    cited = extract_citations(run.content)
    assert prom_id in cited and any(c.startswith("kb:") for c in cited)

    # No router call: routing is recorded as not applicable; the plan is a chained AGENT decision.
    events = _events(run)
    routing = next(e for e in events if e.event_type == EventType.ROUTING_DECISION)
    assert routing.status == "NOT_APPLICABLE" and routing.details["notApplicable"] is True
    assert not any(e.event_type == EventType.ROUTING_ATTEMPT for e in events)
    (plan,) = _plans(run)
    assert plan.phase == Phase.AGENT and plan.status == "ACCEPTED"
    assert plan.details["agentName"] == "planner" and plan.details["planStepIndex"] == 1
    assert [s["tool"] for s in plan.details["steps"]] == ["list_alerts", "query_metrics", "lookup_knowledge"]
    assert "DiskFull" in plan.details["steps"][0]["check"]  # grounded on the alert text
    assert verify_chain(events).valid
    finished = events[-1]
    assert finished.event_type == EventType.RUN_FINISHED and finished.details["runForm"] == "run/4"
    _assert_verifies(run)

    # The trace: tools name their agent, tokens per agent, the self-evaluation.
    body = _trace(user, run)
    assert [(t["agentName"], t["stepIndex"]) for t in body["tools"]] == [
        ("executor", 1),
        ("executor", 1),
        ("executor", 2),
    ]
    tokens = body["run"]["tokens"]
    usage_events = [e.details for e in events if e.event_type == EventType.MODEL_TOKEN_USAGE]
    by_agent = {}
    for d in usage_events:
        by_agent[d["agentName"]] = by_agent.get(d["agentName"], 0) + d["totalTokens"]
    assert tokens["byAgent"] == by_agent and set(by_agent) == {"planner", "executor", "semantic_guard"}
    assert tokens["reconciled"] and tokens["agent"] == by_agent["planner"] + by_agent["executor"]
    assert body["summary"]["auditComplete"] and body["summary"]["rowsVerified"], body["summary"]["gaps"]
    evaluation = body["run"]["selfEvaluation"]
    assert evaluation == run.self_evaluation
    assert evaluation["evidence"]["cited"] == len(cited) and evaluation["evidence"]["citedNotGathered"] == []
    assert evaluation["evidence"]["gathered"] >= evaluation["evidence"]["citedGathered"] == len(cited)
    assert evaluation["tools"] == {"total": 3, "failed": 0}
    assert evaluation["guards"] == {"evidenceRetries": 0, "evidence": "PASS", "semantic": "PASS"}
    assert evaluation["modelCalls"] == {"total": 5, "withoutUsage": 0}
    assert evaluation["plan"] == {
        "planned": 3,
        "done": 3,
        "withoutTool": 0,
        "revisions": 0,
        "fallback": False,
    }
    assert evaluation["statedByModel"] == {"confidence": "high"}


def test_demo_revises_its_plan_when_the_metrics_tool_fails(demo, user):
    run, _outcome, _sink = run_aiops(user, registry=aiops_registry(metrics_fail=True))

    metric = ToolInvocation.objects.get(run_id=run.run_id, tool_name="query_metrics")
    assert metric.status == ToolStatus.FAILED and metric.error_code == "TOOL_ERROR"
    accepted, revised = _plans(run)
    assert accepted.status == "ACCEPTED"
    assert revised.status == "REVISED" and revised.details["revision"] == 1
    assert revised.details["agentName"] == "executor" and revised.details["planStepIndex"] == 2
    assert "query_metrics failed" in revised.details["steps"][0]["why"]
    # The revision is recorded right after the executor step that wrote it, before its tool started.
    seqs = {e.sequence_no: e for e in _events(run)}
    before = seqs[revised.sequence_no - 1]
    assert before.event_type == EventType.MODEL_TOKEN_USAGE and before.details["agentName"] == "executor"
    # The released report carries no plan block, and cites no metric it did not get.
    assert run.release_decision == ReleaseDecision.PUBLISHED and "```plan" not in run.content
    assert not any(c.startswith("prom:") for c in extract_citations(run.content))
    evaluation = run.self_evaluation
    assert evaluation["tools"] == {"total": 3, "failed": 1}
    assert evaluation["plan"]["revisions"] == 1 and evaluation["plan"] == {
        "planned": 1,
        "done": 1,
        "withoutTool": 0,
        "revisions": 1,
        "fallback": False,
    }
    assert evaluation["statedByModel"] == {"confidence": "medium"}
    _assert_verifies(run)


def test_demo_without_metrics_tools_uses_the_runbooks_only(demo, user):
    from agent.runtime.tools.registry import default_registry

    run, _outcome, _sink = run_aiops(user, registry=default_registry())
    assert [t.tool_name for t in ToolInvocation.objects.filter(run_id=run.run_id)] == ["lookup_knowledge"]
    (plan,) = _plans(run)
    assert [s["tool"] for s in plan.details["steps"]] == ["lookup_knowledge"]
    assert run.release_decision == ReleaseDecision.PUBLISHED
    assert all(c.startswith("kb:") for c in extract_citations(run.content))
    _assert_verifies(run)


def test_chat_runs_keep_their_agent_numbering_and_have_no_self_evaluation(demo, user):
    run, outcome, _sink = ask(user, "The disk is full on /var/log and writes fail. What should I check?")
    assert outcome.status == RunStatus.SUCCESS
    assert {agent for agent, _i in _steps(run)} == {"diagnosis_agent"}
    assert [i for _a, i in _steps(run)] == list(range(1, len(_steps(run)) + 1))
    assert {t.agent_name for t in ToolInvocation.objects.filter(run_id=run.run_id)} == {"diagnosis_agent"}
    assert run.self_evaluation is None and not _plans(run)
    body = _trace(user, run)
    assert body["run"]["selfEvaluation"] is None
    assert set(body["run"]["tokens"]["byAgent"]) == {"router", "diagnosis_agent", "semantic_guard"}
    _assert_verifies(run)


# --------------------------------------------------------------------------------------------------
# The local OpenAI-compatible server through the real SDK
# --------------------------------------------------------------------------------------------------
def _report(ids, confidence="low"):
    return (
        "## Summary\nThe disk on /var/log is full.\n\n## Evidence\n"
        + "".join(f"- Evidence item [{i}]\n" for i in ids)
        + f"\n## Likely cause\nLogs without rotation [{ids[-1]}].\n\n"
        + f"## Next steps\nRotate the logs [{ids[-1]}].\n\nConfidence: {confidence}"
    )


def _metric_ids(request):
    """The `prom:` ids of the metric results in the tool messages of a request, in order."""
    ids = []
    for message in request.messages:
        if message.get("role") == "tool":
            data = json.loads(message.get("content") or "{}")
            ids += [i["id"] for i in data.get("evidence") or [] if str(i.get("id", "")).startswith("prom:")]
    return ids


REVISION = (
    "The alert is about one mount point; checking the runbook before the metrics.\n"
    "```plan\n"
    + json.dumps(
        {
            "steps": [
                {"check": "The runbook for a full disk", "why": "known causes", "tool": "lookup_knowledge"},
                {"check": "Free bytes on /var/log", "why": "confirm the symptom", "tool": "query_metrics"},
            ]
        }
    )
    + "\n```"
)


def test_openai_sdk_unusable_plan_falls_back_and_an_uncited_report_is_repaired(llm, corpus, user):
    # Planner: prose with no plan; executor: a revision and two tools, an uncited report, then the repair.
    llm.add(AGENT, stream_answer("I would look at the disk first.", usage=usage(200, 10)))
    llm.add(
        AGENT,
        stream_tool_calls(
            [
                ("call_0", "lookup_knowledge", json.dumps({"query": "disk full /var/log"})),
                (
                    "call_1",
                    "query_metrics",
                    json.dumps({"query": "node_filesystem_avail_bytes", "range_minutes": 30}),
                ),
            ],
            text=REVISION,
            reasoning="The plan is generic; I revise it.",
            usage=usage(500, 60, reasoning=20),
        ),
        stream_answer("## Summary\nThe disk is full.\n\nConfidence: high", usage=usage(900, 30)),
        lambda request: stream_answer(
            _report(_metric_ids(request) + evidence_ids(request)[:1], "medium"), usage=usage(1100, 90)
        ),
    )
    llm.supported(usage=usage(300, 15))

    run, outcome, _sink = run_aiops(user, registry=aiops_registry())

    assert outcome.status == RunStatus.SUCCESS and run.release_decision == ReleaseDecision.PUBLISHED
    unusable, fallback, revised = _plans(run)
    assert (unusable.status, unusable.details["agentName"], unusable.details["steps"]) == (
        "UNUSABLE",
        "planner",
        [],
    )
    assert unusable.details["problems"] == ["no JSON object in the answer"]
    assert fallback.status == "FALLBACK" and fallback.details["source"] == "default"
    assert [s["tool"] for s in fallback.details["steps"]] == [
        "list_alerts",
        "query_metrics",
        "lookup_knowledge",
    ]
    assert (
        revised.status == "REVISED"
        and revised.details["revision"] == 1
        and revised.details["planStepIndex"] == 1
    )
    # The executor was given the default plan.
    executor_first = llm.requests[AGENT][1]
    assert "list_alerts" in executor_first.messages[1]["content"]
    assert executor_first.messages[0]["content"].startswith("You carry out the investigation")
    # Uncited report → evidence guard FAIL → one repair round by the executor → PASS.
    events = _events(run)
    guard = [
        e
        for e in events
        if e.event_type in (EventType.EVIDENCE_GUARD_INITIAL, EventType.EVIDENCE_GUARD_RETRY)
    ]
    assert [(e.event_type, e.status) for e in guard] == [
        (EventType.EVIDENCE_GUARD_INITIAL, "FAIL"),
        (EventType.EVIDENCE_GUARD_RETRY, "PASS"),
    ]
    assert guard[0].details["reasons"] == ["NO_CITATION"]
    repair = llm.requests[AGENT][3].messages[-1]["content"]
    assert repair.startswith("EVIDENCE CHECK FAILED") and "[prom:<id>]" in repair
    assert _steps(run) == [("planner", 1), ("executor", 1), ("executor", 2), ("executor", 3)]
    assert "```plan" not in run.content

    evaluation = run.self_evaluation
    assert evaluation["guards"]["evidenceRetries"] == 1
    assert evaluation["plan"]["fallback"] is True and evaluation["plan"]["revisions"] == 1
    assert evaluation["plan"]["planned"] == 2 and evaluation["plan"]["done"] == 2
    assert evaluation["statedByModel"] == {"confidence": "medium"}
    assert evaluation["modelCalls"] == {"total": 5, "withoutUsage": 0}
    body = _trace(user, run)
    assert body["run"]["tokens"]["byAgent"] == {
        "planner": 210,
        "executor": 560 + 930 + 1190,
        "semantic_guard": 315,
    }
    assert body["run"]["tokens"]["reconciled"]
    _assert_verifies(run)


def test_openai_sdk_report_still_uncited_after_the_repair_is_blocked(llm, corpus, user):
    plan = json.dumps(
        {"steps": [{"check": "Free bytes on /var/log", "why": "the symptom", "tool": "query_metrics"}]}
    )
    llm.add(AGENT, stream_answer(plan, usage=usage(200, 40)))
    llm.add(
        AGENT,
        stream_answer("## Summary\nThe disk is full.", usage=usage(600, 20)),
        stream_answer("## Summary\nStill the disk [prom:0000000000000000].", usage=usage(700, 20)),
    )

    run, outcome, _sink = run_aiops(user, registry=aiops_registry())

    assert outcome.status == RunStatus.SUCCESS and run.release_decision == ReleaseDecision.BLOCKED
    assert run.content == BLOCKED_MESSAGE and not llm.requests[GUARD]
    (accepted,) = _plans(run)
    assert accepted.status == "ACCEPTED" and accepted.details["steps"][0]["tool"] == "query_metrics"
    retry = next(e for e in _events(run) if e.event_type == EventType.EVIDENCE_GUARD_RETRY)
    assert retry.status == "FAIL" and retry.details["unknown"] == ["prom:0000000000000000"]
    evaluation = run.self_evaluation
    assert evaluation["evidence"]["citedNotGathered"] == ["prom:0000000000000000"]
    assert evaluation["guards"] == {"evidenceRetries": 1, "evidence": "FAIL", "semantic": None}
    assert evaluation["plan"]["done"] == 0 and evaluation["statedByModel"] is None
    _assert_verifies(run)


# --------------------------------------------------------------------------------------------------
# The admin run page
# --------------------------------------------------------------------------------------------------
def test_admin_run_page_shows_one_lane_per_agent_the_ledger_per_agent_and_the_self_evaluation(
    demo, user, superuser
):
    run, _outcome, _sink = run_aiops(user, registry=aiops_registry())
    client = Client()
    client.force_login(superuser)
    response = client.get(reverse("admin:diagnosis_diagnosisrun_change", args=[run.pk]))
    assert response.status_code == 200
    html = response.content.decode()
    lanes = [line for line in html.splitlines() if "dc-wf-lane" in line and "data-lane=" in line]
    assert [line.split('data-lane="')[1].split('"')[0] for line in lanes] == [
        "planner",
        "executor",
        "semantic_guard",
    ]
    assert 'data-lane="executor"' in html and "step-executor-3" in html and "step-planner-1" in html
    for agent in ("planner", "executor", "semantic_guard"):
        assert f'data-agent="{agent}"' in html
    assert 'id="self-evaluation"' in html and "confidence high" in html
    assert "plan steps done / planned" in html


# --------------------------------------------------------------------------------------------------
# Old row forms keep verifying
# --------------------------------------------------------------------------------------------------
def test_tool_rows_verify_in_the_form_their_event_names(demo, user):
    """A tool row bound before per-agent steps (form `tool`, no `rowForm`) verifies as it was recorded;
    the same digest under the new form's name is a mismatch."""
    from audit.verify.rows import verify_rows

    run, _outcome, _sink = run_aiops(user, registry=aiops_registry())
    events = _events(run)
    tools = list(ToolInvocation.objects.filter(run_id=run.run_id))
    assert all(row_digests.TOOL.digest_of(t) != row_digests.TOOL_V1.digest_of(t) for t in tools)

    class Event:
        def __init__(self, e, details):
            self.sequence_no, self.event_type, self.status, self.details = (
                e.sequence_no,
                e.event_type,
                e.status,
                details,
            )

    by_id = {t.tool_call_id: t for t in tools}

    def legacy(keep_form):
        out = []
        for e in events:
            d = dict(e.details or {})
            if e.event_type == EventType.TOOL_INVOCATION and "rowDigest" in d:
                d["rowDigest"] = row_digests.TOOL_V1.digest_of(by_id[d["toolCallId"]])
                if not keep_form:
                    d.pop("rowForm")
            out.append(Event(e, d))
        return out

    kwargs = {
        "run": None,
        "steps": list(AgentStep.objects.filter(run_id=run.run_id)),
        "tools": tools,
        "reasoning": stored_reasoning_rows(run_id=run.run_id),
    }
    assert verify_rows(events=legacy(False), **kwargs).problems == []
    problems = verify_rows(events=legacy(True), **kwargs).problems
    assert len(problems) == len(tools) and all("does not match its digest" in p for p in problems)
