"""The AI Ops plan: what the planner writes, what the executor may revise, and the default plan.

A plan is at most `PLAN_MAX_STEPS` steps `{"check", "why", "tool"?}`, read from a model's text as a JSON
object `{"steps": [...]}` (bare or fenced; a revision is fenced as `plan`). `parse_plan` is the one
reader: it bounds every text, drops unusable steps and tools the run lacks, names each repair in
`problems`, and gives no plan (`Plan.usable` false) when nothing usable is left. `default_plan(tool_names)`
is what the executor follows then, with only the tools the run has.
Details: docs/aiops.md, *How an analysis runs* (2. Planner).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from agent.runtime.llm import parse_json_object
from agent.runtime.prompts import PLAN_FENCE, PLAN_MAX_STEPS

CHECK_CHARS = 200
WHY_CHARS = 300
TOOL_CHARS = 64
_FENCED = re.compile(rf"```{PLAN_FENCE}[ \t]*\n(.*?)```", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Plan:
    steps: tuple[dict[str, Any], ...] = ()
    problems: tuple[str, ...] = field(default_factory=tuple)

    @property
    def usable(self) -> bool:
        return bool(self.steps)

    def as_list(self) -> list[dict[str, Any]]:
        return [dict(step) for step in self.steps]


def _text(value: Any, limit: int) -> str:
    return " ".join(str(value).split())[:limit] if isinstance(value, str | int | float) else ""


def parse_plan(text: str | None, *, tool_names: Iterable[str], fenced_only: bool = False) -> Plan:
    """The plan in `text` (see the module docstring). `fenced_only`: only a ```plan block counts (the
    executor's revision: its report is prose that may hold other JSON)."""
    if fenced_only:
        blocks = _FENCED.findall(text or "")
        data = parse_json_object(blocks[-1]) if blocks else None
        if not blocks:
            return Plan(problems=("no plan block",))
    else:
        data = parse_json_object(text)
    if data is None:
        return Plan(problems=("no JSON object in the answer",))
    raw = data.get("steps")
    if not isinstance(raw, list):
        return Plan(problems=('the answer has no "steps" list',))
    tools = set(tool_names)
    problems: list[str] = []
    steps: list[dict[str, Any]] = []
    for n, item in enumerate(raw, start=1):
        if not isinstance(item, dict):
            problems.append(f"step {n} is not an object")
            continue
        check = _text(item.get("check"), CHECK_CHARS)
        if not check:
            problems.append(f"step {n} has no check")
            continue
        if len(str(item.get("check"))) > CHECK_CHARS or len(str(item.get("why") or "")) > WHY_CHARS:
            problems.append(f"step {n}: text cut to its bound")
        tool = item.get("tool")
        tool = _text(tool, TOOL_CHARS) if tool else None
        if tool and tool not in tools:
            problems.append(f"step {n}: unknown tool {tool} dropped")
            tool = None
        steps.append({"check": check, "why": _text(item.get("why") or "", WHY_CHARS), "tool": tool})
    if len(steps) > PLAN_MAX_STEPS:
        problems.append(f"plan cut from {len(steps)} to {PLAN_MAX_STEPS} steps")
        steps = steps[:PLAN_MAX_STEPS]
    if not steps:
        problems.append("no usable step")
    return Plan(steps=tuple(steps), problems=tuple(problems))


def default_plan(tool_names: Iterable[str]) -> Plan:
    """The fallback plan, with the tools the run has (a step whose tool is absent is left out)."""
    tools = set(tool_names)
    candidates = [
        {"check": "Which alerts fire now, and since when", "why": "the alert's scope", "tool": "list_alerts"},
        {
            "check": "The metric behind the alert over the last 30 minutes",
            "why": "confirm the symptom and when it began",
            "tool": "query_metrics",
        },
        {
            "check": "The runbook for this alert",
            "why": "known causes and the documented fix",
            "tool": "lookup_knowledge",
        },
    ]
    steps = [step for step in candidates if step["tool"] in tools]
    if not steps:
        steps = [{"check": "What the alert text says", "why": "no tool is available", "tool": None}]
    return Plan(steps=tuple(steps))


def strip_plan_blocks(text: str) -> str:
    """The report without the ```plan blocks the executor wrote (recorded as revisions, not released)."""
    return _FENCED.sub("", text or "").strip()


def plan_json(plan: Plan) -> str:
    return json.dumps({"steps": plan.as_list()}, ensure_ascii=False)
