"""The demo model's AI Ops roles (`agent.runtime.aiops`, recognised by their system prompts).

* `aiops_plan`: as the planner, a plan grounded on the alert text (the alert's name and expression,
  `alert_facts`, with the tools the prompt lists);
* `aiops_execute`: as the executor, first `list_alerts` and `query_metrics` (the alert's expression, else
  `ALERTS{alertname=…}`) when they are offered, a `create_silence` when the alert asks for one
  (`silence_minutes`), then `lookup_knowledge` with the alert text (revising the plan with a ```plan
  block when a tool failed), and last the report from what the tools returned: metric sentences cited
  with the `prom:` ids of the results it got, runbook sentences with their `kb:` ids (never an id no
  tool returned), and a stated `Confidence:` line.

Each returns (text, reasoning, declared tool calls), as the client's roles do.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from agent.aiops.intake import alert_name_in_text
from agent.runtime import prompts
from agent.runtime.demo.answers import answer_from_evidence
from agent.runtime.demo.text import question_of
from agent.runtime.llm import parse_json_object
from audit.write import DeclaredToolCall
from diagnosis.evidence import METRIC_RESULT, RUNBOOK_CHUNK

_EXPR_RE = re.compile(r"^\s*(?:expression|expr|query)\s*:\s*(.+?)\s*$", re.I | re.M)
_TOOLS_LINE_RE = re.compile(r"can use these tools:\s*([^.\n]*)")


def alert_facts(text: str) -> tuple[str | None, str | None]:
    """The alert's name and PromQL expression as the alert text states them (None when it does not)."""
    name = alert_name_in_text(text)
    expr = _EXPR_RE.search(text or "")
    return name, (expr.group(1)[:500] if expr else None)


def _metric_query(name: str | None, expr: str | None) -> str:
    """The PromQL the demo executor runs: the alert's expression, else its ALERTS series, else `up`."""
    return expr or (f'ALERTS{{alertname="{name}"}}' if name else "up")


def _planner_tools(messages: Sequence[dict[str, Any]]) -> list[str]:
    system = str(messages[0].get("content") or "") if messages else ""
    found = _TOOLS_LINE_RE.search(system)
    return (
        [t.strip() for t in found.group(1).split(",") if t.strip() and t.strip() != "none"] if found else []
    )


def _alert_text(messages: Sequence[dict[str, Any]]) -> tuple[str, int]:
    """The alert the executor was given (without the plan) and the position of its message."""
    question, position = question_of(messages)
    alert = question.split("\n\nPlan:\n", 1)[0].removeprefix("Alert:\n")
    return alert, position


def aiops_plan(messages: Sequence[dict[str, Any]]) -> tuple[str, str, list[DeclaredToolCall]]:
    """The planner's answer: a plan grounded on the alert text, with the tools the prompt lists."""
    alert = str(messages[-1].get("content") or "") if messages else ""
    name, expr = alert_facts(alert)
    tools = set(_planner_tools(messages))
    subject = name or "the alert"
    steps = []
    if "list_alerts" in tools:
        steps.append(
            {
                "check": f"Which alerts fire with {subject}, on which instances, and since when",
                "why": "the scope of the incident: one instance or many",
                "tool": "list_alerts",
            }
        )
    if "query_metrics" in tools:
        steps.append(
            {
                "check": f"The metric behind {subject}: {_metric_query(name, expr)}"[:200],
                "why": "confirm the symptom from the metric itself and see its current value",
                "tool": "query_metrics",
            }
        )
    steps.append(
        {
            "check": f"The runbook for {subject}",
            "why": "the documented causes, how to confirm them and how to fix them",
            "tool": "lookup_knowledge" if "lookup_knowledge" in tools else None,
        }
    )
    reasoning = (
        f"The alert names {subject}; I plan {len(steps)} step(s) with the tools offered "
        f"({', '.join(sorted(tools)) or 'none'})."
    )
    return json.dumps({"steps": steps}, ensure_ascii=False), reasoning, []


def _tool_results(messages: Sequence[dict[str, Any]], start: int) -> list[tuple[str, dict[str, Any]]]:
    """The tool results after `start`: (tool name, parsed content), the name found from the call id."""
    names = {}
    for message in messages[start + 1 :]:
        for call in message.get("tool_calls") or []:
            names[call.get("id")] = (call.get("function") or {}).get("name")
    out = []
    for message in messages[start + 1 :]:
        if message.get("role") == "tool":
            data = parse_json_object(str(message.get("content") or "")) or {}
            out.append((str(names.get(message.get("tool_call_id")) or ""), data))
    return out


def _metric_items(results: Sequence[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The metric results the tools returned, `{"id": "prom:…", "text"}`: an evidence item of the
    result (`query_metrics`' shape, as `lookup_knowledge`'s) or a bare `evidenceId` beside its text."""
    items = []
    for _name, data in results:
        candidates = [i for i in data.get("evidence") or [] if isinstance(i, dict)]
        if isinstance(data.get("evidenceId"), str):
            candidates.append({"id": data["evidenceId"], "text": data.get("text")})
        items.extend(
            {"id": i["id"], "text": i["text"]}
            for i in candidates
            if METRIC_RESULT.owns(str(i.get("id", ""))) and isinstance(i.get("text"), str)
        )
    return items


def _metric_lines(items: Sequence[dict[str, Any]]) -> list[str]:
    """Lines of each metric result's readable text (its first three), cited with the id it came with."""
    lines = []
    for item in items:
        text_lines = [" ".join(line.split()) for line in item["text"].splitlines() if line.strip()]
        lines.extend(f"- {line.rstrip(':')} [{item['id']}]" for line in text_lines[:3])
    return lines


def aiops_execute(
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None,
    tool_choice: str | None,
) -> tuple[str, str, list[DeclaredToolCall]]:
    """The executor's next step: metrics and alerts first, then the runbooks, then the report."""
    alert, position = _alert_text(messages)
    name, expr = alert_facts(alert)
    offered = {str((t.get("function") or {}).get("name")) for t in tools or []}
    results = _tool_results(messages, position)
    called = {tool for tool, _data in results}
    count = sum(1 for m in messages if m.get("role") == "tool")
    may_call = tool_choice != "none" and bool(offered)

    if may_call and not results:
        calls = []
        if "list_alerts" in offered:
            arguments = {"filter": [f'alertname="{name}"']} if name else {}
            calls.append(("list_alerts", arguments))
        if "query_metrics" in offered:
            query = _metric_query(name, expr)
            calls.append(("query_metrics", {"query": query, "range_minutes": 30}))
        if not calls and "lookup_knowledge" in offered:
            calls.append(("lookup_knowledge", {"query": alert[:500], "top_k": 5}))
        if calls:
            declared = [
                DeclaredToolCall(
                    tool_call_id=f"call_demo_{count + n}",
                    name=tool,
                    arguments=json.dumps(arguments, ensure_ascii=False),
                )
                for n, (tool, arguments) in enumerate(calls, start=1)
            ]
            reasoning = f"Following the plan: {', '.join(tool for tool, _a in calls)} first."
            return "", reasoning, declared

    if may_call and "create_silence" in offered and "create_silence" not in called:
        minutes = silence_minutes(alert)
        # Only a named alert can be silenced: a matcher on a made-up name would silence nothing (or the
        # wrong thing), so an alert without a name gets no silence proposed.
        if minutes is not None and name:
            arguments = {
                "matchers": [{"name": "alertname", "value": name, "isRegex": False}],
                "duration_minutes": minutes,
                "comment": f"Silence {name} for {minutes} min while it is investigated",
            }
            call = DeclaredToolCall(
                tool_call_id=f"call_demo_{count + 1}",
                name="create_silence",
                arguments=json.dumps(arguments, ensure_ascii=False),
            )
            return "", f"The alert asks for a silence: I propose one for {minutes} minutes.", [call]

    if may_call and "lookup_knowledge" in offered and "lookup_knowledge" not in called:
        failed = [tool for tool, data in results if isinstance(data.get("error"), dict)]
        text = ""
        if failed:
            plan = {
                "steps": [
                    {
                        "check": f"The runbook for {name or 'the alert'}",
                        "why": f"{', '.join(failed)} failed: the runbooks are what is left to check",
                        "tool": "lookup_knowledge",
                    }
                ]
            }
            text = f"```{prompts.PLAN_FENCE}\n{json.dumps(plan, ensure_ascii=False)}\n```"
        call = DeclaredToolCall(
            tool_call_id=f"call_demo_{count + 1}",
            name="lookup_knowledge",
            arguments=json.dumps({"query": alert[:500], "top_k": 5}, ensure_ascii=False),
        )
        reasoning = "Metrics and alerts are in" + (f" ({', '.join(failed)} failed)" if failed else "")
        return text, reasoning + "; now the runbooks for this alert.", [call]

    return _report(alert, results)


_SILENCE_RE = re.compile(r"\bsilence\b(?:[^.\n]*?\bfor\s+(\d{1,4})\s*(?:min|minutes?)\b)?", re.IGNORECASE)


def silence_minutes(alert: str) -> int | None:
    """How long the alert text asks a silence for (`… silence it for 30 minutes …`; 60 when it names
    no duration), or None when it asks for none: the demo executor then proposes `create_silence`."""
    found = _SILENCE_RE.search(alert or "")
    if found is None:
        return None
    return int(found.group(1)) if found.group(1) else 60


def _report(
    alert: str, results: Sequence[tuple[str, dict[str, Any]]]
) -> tuple[str, str, list[DeclaredToolCall]]:
    """The report from what the tools returned (sentences of the evidence, each cited)."""
    items: list[dict[str, Any]] = []
    seen: set[str] = set()
    for _tool, data in results:
        for item in data.get("evidence") or []:
            if (
                isinstance(item, dict)
                and RUNBOOK_CHUNK.owns(str(item.get("id", "")))
                and item["id"] not in seen
            ):
                seen.add(item["id"])
                items.append(item)
    items.sort(key=lambda item: -float(item.get("score") or 0))
    kb_text, used = answer_from_evidence(alert, items)
    kb_lines = [line for line in kb_text.splitlines()[1:] if line.startswith("- ")]
    metrics = _metric_items(results)
    metric_lines = _metric_lines(metrics)
    # A metric result that matched no series confirms nothing about the alert.
    confirmed = [m for m in metrics if not re.search(r"\b0 series\b|no series matched", m["text"])]
    failed = [tool for tool, data in results if isinstance(data.get("error"), dict)]
    if not kb_lines and not metric_lines:
        text = (
            "## Summary\nThe tools returned no evidence that explains this alert.\n\n"
            "## Evidence\nNone.\n\n## Likely cause\nUnknown.\n\n## Next steps\n"
            "Check the alert's source directly.\n\nConfidence: low"
        )
        return text, "No tool result explains the alert; I say so.", []
    commands = [line for line in kb_lines if "`" in line]
    cause = [line for line in kb_lines if "`" not in line][:1] or kb_lines[:1] or metric_lines[:1]
    steps = commands[:2] or kb_lines[-1:] or metric_lines[-1:]
    summary = (metric_lines or kb_lines)[:1]
    confidence = "high" if kb_lines and confirmed else ("medium" if kb_lines or confirmed else "low")
    sections = [
        "## Summary",
        *summary,
        "",
        "## Evidence",
        *metric_lines,
        *kb_lines,
        "",
        "## Likely cause",
        *cause,
        "",
        "## Next steps",
        *steps,
        "",
        f"Confidence: {confidence}",
    ]
    reasoning = (
        f"{len(metric_lines)} metric sentence(s) and {len(kb_lines)} runbook sentence(s) "
        f"({', '.join(used) or 'no runbook'}) support the report"
        + (f"; {', '.join(failed)} failed" if failed else "")
        + "."
    )
    return "\n".join(sections), reasoning, []
