"""Two runs side by side: what the compare page draws, shaped from the API's trace body of each run.

Input is exactly what the trace endpoint returns for each run (`surfaces.api.trace_render.trace_data`),
so a fact shown here is the fact an API client sees. Pure: no query, no request. Each section (run,
configuration, steps, tools, citations, guards, release, tokens, cost, latency, audit and reviews) is a
list of rows (label, left, right, `differs`); a row differs when its two values are not equal as shown.
Details: docs/admin.md, *Compare two runs*.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

from agent.runtime.configuration import differences
from audit.models import EventType
from surfaces.admin.ledger import run_cost_label
from surfaces.answers import render_answer

NOT_RECORDED = "not recorded"
GUARDS = (
    (EventType.EVIDENCE_GUARD_INITIAL, "evidence guard"),
    (EventType.EVIDENCE_GUARD_RETRY, "evidence guard (retry)"),
    (EventType.SEMANTIC_GUARD_DECISION, "semantic guard"),
)


@dataclass(slots=True)
class Row:
    label: str
    left: str
    right: str
    differs: bool = False
    mono: bool = False
    markdown: bool = False  # left and right are answers rendered as the run page renders them


@dataclass(slots=True)
class Section:
    key: str
    title: str
    rows: list[Row] = field(default_factory=list)

    @property
    def differences(self) -> int:
        return sum(1 for r in self.rows if r.differs)


@dataclass(slots=True)
class Comparison:
    left_id: str
    right_id: str
    sections: list[Section]

    @property
    def differences(self) -> int:
        return sum(s.differences for s in self.sections)


def _shown(value: Any) -> str:
    if value is None or value == "":
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Mapping) and "preview" in value:
        return f"{value['preview']}… ({value.get('length')} chars)"
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(", ", ": "))
    return str(value)


def _row(label: str, left: Any, right: Any, *, mono: bool = False) -> Row:
    a, b = _shown(left), _shown(right)
    return Row(label, a, b, a != b, mono)


def _answer_row(left: str | None, right: str | None) -> Row:
    """The released answers as the run page and the chat show them (`surfaces.answers.render_answer`:
    Markdown without raw HTML, sanitized, citations linked); compared on their text."""
    shown = [render_answer(text) if text else _shown(None) for text in (left, right)]
    return Row("answer", shown[0], shown[1], (left or "") != (right or ""), markdown=True)


def _pairs(left: list[Any], right: list[Any]) -> list[tuple[Any, Any]]:
    n = max(len(left), len(right))
    return [(left[i] if i < len(left) else None, right[i] if i < len(right) else None) for i in range(n)]


def _last_event(trace: Mapping[str, Any], event_type: str) -> Mapping[str, Any] | None:
    return next((e for e in reversed(trace["timeline"]) if e["eventType"] == event_type), None)


def _route(trace: Mapping[str, Any]) -> dict[str, Any]:
    event = _last_event(trace, EventType.ROUTING_DECISION)
    details = (event or {}).get("details") or {}
    return {
        "intent": details.get("intent") or trace["run"]["intent"],
        "confidence": details.get("confidence"),
        "fallback": details.get("fallback"),
        "reason": details.get("reason"),
    }


def _steps_by_agent(trace: Mapping[str, Any]) -> dict[str, tuple[int, list[str]]]:
    agents: dict[str, tuple[int, list[str]]] = {}
    for step in trace["steps"]:
        count, models = agents.get(step["agentName"], (0, []))
        if step["model"] not in models:
            models = [*models, step["model"]]
        agents[step["agentName"]] = (count + 1, models)
    return agents


def _citations(trace: Mapping[str, Any]) -> list[str]:
    for event_type in (EventType.EVIDENCE_GUARD_RETRY, EventType.EVIDENCE_GUARD_INITIAL):
        event = _last_event(trace, event_type)
        if event is not None:
            return [_shown(c) for c in (event.get("details") or {}).get("cited") or []]
    return []


def _cost(run: Mapping[str, Any]) -> Any:
    """The run's cost as the run page words it (`surfaces.admin.ledger.run_cost_label`, one home),
    from the trace's `run.cost` (amount, status, unpriced calls); "not recorded" when the trace has none.
    No amount is never shown as 0."""
    cost = run.get("cost")
    if not isinstance(cost, Mapping):
        return NOT_RECORDED
    amount = cost.get("amount")
    status = cost.get("status") or ""
    stored = SimpleNamespace(
        cost=None if amount is None else Decimal(str(amount)),
        cost_status="" if status == "not_priced" else status,
        cost_unpriced_calls=int(cost.get("unpricedCalls") or 0),
    )
    text, _priced, note = run_cost_label(stored)
    return f"{text} ({note})" if note else text


def _ms(value: Any) -> str:
    return "—" if value is None else f"{value} ms"


def _configuration(trace: Mapping[str, Any]) -> tuple[str | None, Mapping[str, Any] | None]:
    """RUN_STARTED's chained fingerprint and configuration document (None: not recorded)."""
    details = (_last_event(trace, EventType.RUN_STARTED) or {}).get("details") or {}
    document = details.get("configuration")
    return details.get("configFingerprint"), document if isinstance(document, Mapping) else None


def configuration_section(
    left: Mapping[str, Any],
    right: Mapping[str, Any],
    prompts: tuple[Mapping[str, str], Mapping[str, str]] | None = None,
) -> Section:
    """The configuration rows: both fingerprints, then each differing part of the two documents (a
    prompt's digest followed by both texts when `prompts`, each side's texts by role, are given)."""
    section = Section("configuration", "Configuration")
    (fa, da), (fb, db) = _configuration(left), _configuration(right)
    section.rows.append(_row("fingerprint", fa or NOT_RECORDED, fb or NOT_RECORDED, mono=True))
    if da is None or db is None:
        return section
    texts = prompts or ({}, {})
    for diff in differences(da, db):
        section.rows.append(_row(diff.path, diff.left, diff.right, mono=True))
        role = diff.path.removeprefix("prompts.")
        if role != diff.path and prompts is not None:
            section.rows.append(_row(f"{role} prompt (text)", texts[0].get(role), texts[1].get(role)))
    return section


def compare_traces(
    left: Mapping[str, Any],
    right: Mapping[str, Any],
    *,
    prompts: tuple[Mapping[str, str], Mapping[str, str]] | None = None,
) -> Comparison:
    """The comparison of two API trace bodies (see the module docstring); `prompts`: each side's
    configuration prompt texts by role (`diagnosis.RunConfiguration.prompts`), when the caller has them."""
    a, b = left["run"], right["run"]
    sections: list[Section] = []

    run = Section("run", "Run")
    run.rows += [
        _row("question", a["query"], b["query"]),
        _row("status", a["status"], b["status"]),
        _row("flow", a["agentFlow"], b["agentFlow"]),
        _row("provider", (a["provider"] or {}).get("name"), (b["provider"] or {}).get("name")),
        _row("error", (a["error"] or {}).get("code"), (b["error"] or {}).get("code"), mono=True),
    ]
    sections.append(run)
    sections.append(configuration_section(left, right, prompts))

    sections += _process_sections(left, right)
    sections += _outcome_sections(left, right)
    return Comparison(left_id=a["runId"], right_id=b["runId"], sections=sections)


def _process_sections(left: Mapping[str, Any], right: Mapping[str, Any]) -> list[Section]:
    """What each run did: its route, steps per agent, tool calls, citations and guard verdicts."""
    sections: list[Section] = []
    route = Section("route", "Route")
    ra, rb = _route(left), _route(right)
    route.rows += [_row(key, ra[key], rb[key]) for key in ("intent", "confidence", "fallback", "reason")]
    sections.append(route)

    steps = Section("steps", "Steps per agent")
    sa, sb = _steps_by_agent(left), _steps_by_agent(right)
    for agent in sorted(set(sa) | set(sb)):
        ca, ma = sa.get(agent, (0, []))
        cb, mb = sb.get(agent, (0, []))
        steps.rows.append(_row(f"{agent}: steps", ca, cb))
        steps.rows.append(_row(f"{agent}: models", ", ".join(ma), ", ".join(mb), mono=True))
    steps.rows.append(_row("model steps in all", len(left["steps"]), len(right["steps"])))
    sections.append(steps)

    tools = Section("tools", "Tools and their inputs")
    for i, (ta, tb) in enumerate(_pairs(left["tools"], right["tools"]), start=1):
        tools.rows.append(
            _row(
                f"call {i}",
                f"{ta['toolName']} {_shown(ta['inputParams'])} → {ta['status']}" if ta else None,
                f"{tb['toolName']} {_shown(tb['inputParams'])} → {tb['status']}" if tb else None,
                mono=True,
            )
        )
    tools.rows.append(_row("tool calls in all", len(left["tools"]), len(right["tools"])))
    sections.append(tools)

    citations = Section("citations", "Citations")
    citations.rows.append(_row("cited", ", ".join(_citations(left)), ", ".join(_citations(right)), mono=True))
    sections.append(citations)

    guards = Section("guards", "Guard verdicts")
    for event_type, label in GUARDS:
        ga, gb = _last_event(left, event_type), _last_event(right, event_type)
        if ga is None and gb is None:
            continue
        guards.rows.append(_row(label, (ga or {}).get("status"), (gb or {}).get("status")))
    sections.append(guards)
    return sections


def _outcome_sections(left: Mapping[str, Any], right: Mapping[str, Any]) -> list[Section]:
    """What each run produced and cost: its release, tokens, cost, latency, audit and reviews."""
    a, b = left["run"], right["run"]
    sections: list[Section] = []
    release = Section("release", "Release")
    ea, eb = _last_event(left, EventType.RELEASE_DECISION), _last_event(right, EventType.RELEASE_DECISION)
    release.rows += [
        _row("decision", a["releaseDecision"], b["releaseDecision"]),
        _row(
            "reason",
            ((ea or {}).get("details") or {}).get("reason"),
            ((eb or {}).get("details") or {}).get("reason"),
        ),
        _row("release mode", a["delivery"]["releaseMode"], b["delivery"]["releaseMode"]),
        _row(
            "unverified text delivered",
            a["delivery"]["unverifiedTextDelivered"],
            b["delivery"]["unverifiedTextDelivered"],
        ),
        _answer_row(a["content"], b["content"]),
    ]
    sections.append(release)

    tokens = Section("tokens", "Tokens")
    for key in ("router", "agent", "guard", "total", "reasoning", "cachedInput", "modelCalls"):
        tokens.rows.append(_row(key, a["tokens"][key], b["tokens"][key]))
    tokens.rows.append(_row("reconciled", a["tokens"]["reconciled"], b["tokens"]["reconciled"]))
    sections.append(tokens)

    cost = Section("cost", "Cost")
    cost.rows.append(_row("run cost", _cost(a), _cost(b)))
    sections.append(cost)

    latency = Section("latency", "Latency")
    ta, tb = a["timing"], b["timing"]
    latency.rows += [
        _row("total", _ms(ta["totalDurationMs"]), _ms(tb["totalDurationMs"])),
        _row("first output", _ms(ta["firstOutputLatencyMs"]), _ms(tb["firstOutputLatencyMs"])),
        _row("release", _ms(ta["releaseLatencyMs"]), _ms(tb["releaseLatencyMs"])),
    ]
    sections.append(latency)

    audit = Section("audit", "Audit and reviews")
    audit.rows += [
        _row("audit complete", left["summary"]["auditComplete"], right["summary"]["auditComplete"]),
        _row("rows verified", left["summary"]["rowsVerified"], right["summary"]["rowsVerified"]),
        _row("latest review", _latest_review(left), _latest_review(right)),
    ]
    sections.append(audit)
    return sections


def _latest_review(trace: Mapping[str, Any]) -> str | None:
    current = [r for r in trace.get("reviews") or [] if not r["superseded"]]
    return f"{current[-1]['verdict']} by {current[-1]['reviewer']}" if current else None
