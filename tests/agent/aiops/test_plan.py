"""The plan reader's bounds, the default plan, and the self-evaluation's reading of stated confidence."""

import json

from agent.runtime.plan import CHECK_CHARS, default_plan, parse_plan, strip_plan_blocks
from agent.runtime.prompts import PLAN_MAX_STEPS
from agent.runtime.selfeval import stated_confidence

TOOLS = ["lookup_knowledge", "query_metrics", "list_alerts"]


def test_a_plan_is_bounded_and_unknown_tools_are_dropped():
    steps = [{"check": f"check {n}", "why": "w", "tool": "query_metrics"} for n in range(12)]
    steps[0] = {"check": "x" * 500, "why": "y" * 900, "tool": "rm_rf"}
    plan = parse_plan("Here it is:\n" + json.dumps({"steps": steps}), tool_names=TOOLS)
    assert plan.usable and len(plan.steps) == PLAN_MAX_STEPS
    assert len(plan.steps[0]["check"]) == CHECK_CHARS and plan.steps[0]["tool"] is None
    assert "step 1: unknown tool rm_rf dropped" in plan.problems
    assert f"plan cut from 12 to {PLAN_MAX_STEPS} steps" in plan.problems


def test_answers_without_a_usable_plan_are_unusable():
    assert parse_plan("I would look at the disk.", tool_names=TOOLS).problems == (
        "no JSON object in the answer",
    )
    assert not parse_plan('{"plan": []}', tool_names=TOOLS).usable
    empty = parse_plan('{"steps": [{"why": "no check"}, 3]}', tool_names=TOOLS)
    assert not empty.usable and empty.problems[-1] == "no usable step"


def test_a_revision_counts_only_in_a_plan_block_and_is_not_released():
    report = '## Summary\nSee {"steps": [{"check": "not a plan"}]}'
    assert not parse_plan(report, tool_names=TOOLS, fenced_only=True).usable
    text = (
        'Revising.\n```plan\n{"steps": [{"check": "runbook", "tool": "lookup_knowledge"}]}\n```\n## Summary'
    )
    revised = parse_plan(text, tool_names=TOOLS, fenced_only=True)
    assert revised.steps == ({"check": "runbook", "why": "", "tool": "lookup_knowledge"},)
    assert strip_plan_blocks(text) == "Revising.\n\n## Summary"


def test_the_default_plan_uses_only_the_tools_the_run_has():
    assert [s["tool"] for s in default_plan(TOOLS).steps] == [
        "list_alerts",
        "query_metrics",
        "lookup_knowledge",
    ]
    assert [s["tool"] for s in default_plan(["lookup_knowledge"]).steps] == ["lookup_knowledge"]
    assert [s["tool"] for s in default_plan([]).steps] == [None]


def test_stated_confidence_is_read_from_the_report_only_when_stated():
    assert stated_confidence("## Next steps\n- rotate\n\nConfidence: High") == "high"
    assert stated_confidence("**Confidence:** low") == "low"
    assert stated_confidence("I am confident the disk is full.") is None


def test_the_demo_reads_the_alert_name_from_the_intake_description():
    from agent.aiops.intake import Alert, describe_alerts
    from agent.runtime.demo import alert_facts

    alert = Alert(
        status="firing",
        labels={"alertname": "PrometheusScrapeSlow", "severity": "warning", "job": "prometheus"},
        annotations={"summary": "Scrapes take long"},
        starts_at="2026-12-01T13:00:00Z",
    )
    assert alert_facts(describe_alerts(alerts=[alert])) == ("PrometheusScrapeSlow", None)
    grouped = describe_alerts(alerts=[alert], group_labels={"alertname": "PrometheusScrapeSlow"})
    assert alert_facts(grouped)[0] == "PrometheusScrapeSlow"
    assert alert_facts("Alert DiskFull firing\nExpression: up == 0") == ("DiskFull", "up == 0")
