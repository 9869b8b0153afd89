"""The self-evaluation of an AI Ops run (seed 003 `self_evaluation`): signals computed from the run's own
record when its guards and release are done, plus the model's own stated confidence, labelled as such.

`self_evaluation(...)` reads the run's timeline and tool rows (two queries) and its `model_calls` column,
and returns counts only, no content beyond evidence ids: `evidence` (cited against gathered), `tools`,
`guards`, `modelCalls`, `plan` (planned against done), and `statedByModel`, the report's `Confidence:`
line, which is the model's claim about itself, not a measurement. The terminal update writes it
(`RunRecorder.finish(self_evaluation=…)`), bound by the terminal digest.
Details: docs/aiops.md, *How an analysis runs* (6. Self-evaluation).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from agent.runtime.guards import extract_citations
from audit.failed_calls import stated_confidence as stated_confidence  # the one rule, re-exported
from audit.models import EventType, ToolInvocation, ToolStatus, TraceEvent
from diagnosis.models import DiagnosisRun

VERSION = 1


def _plan_done(steps: Sequence[dict[str, Any]], succeeded: Counter) -> tuple[int, int]:
    """(steps done, steps naming no tool) of the plan, each successful call counting for one step."""
    left = Counter(succeeded)
    done = untooled = 0
    for step in steps:
        tool = step.get("tool")
        if not tool:
            untooled += 1
        elif left[tool] > 0:
            left[tool] -= 1
            done += 1
    return done, untooled


def self_evaluation(
    *,
    run_id: str,
    report: str,
    gathered: Sequence[str],
    plan_steps: Sequence[dict[str, Any]],
    revisions: int,
    fallback: bool,
    executor: str,
) -> dict[str, Any]:
    """Synchronous (reads the database); see the module docstring. `executor` is the agent name whose
    successful tool calls count as plan steps done."""
    events = list(
        TraceEvent.objects.filter(
            run_id=run_id,
            event_type__in=(
                EventType.MODEL_TOKEN_USAGE,
                EventType.EVIDENCE_GUARD_INITIAL,
                EventType.EVIDENCE_GUARD_RETRY,
                EventType.SEMANTIC_GUARD_DECISION,
            ),
        )
        .order_by("sequence_no")
        .values_list("event_type", "status")
    )
    tools = list(
        ToolInvocation.objects.filter(run_id=run_id).values_list("agent_name", "tool_name", "status")
    )
    started_calls = (
        DiagnosisRun.objects.filter(run_id=run_id).values_list("model_calls", flat=True).first() or 0
    )

    cited = extract_citations(report)
    gathered_ids = list(dict.fromkeys(gathered))
    known = set(gathered_ids)
    usage = [status for kind, status in events if kind == EventType.MODEL_TOKEN_USAGE]
    evidence_verdicts = [
        status
        for kind, status in events
        if kind in (EventType.EVIDENCE_GUARD_INITIAL, EventType.EVIDENCE_GUARD_RETRY)
    ]
    semantic = [status for kind, status in events if kind == EventType.SEMANTIC_GUARD_DECISION]
    succeeded = Counter(
        name for agent, name, status in tools if agent == executor and status == ToolStatus.SUCCEEDED
    )
    done, untooled = _plan_done(plan_steps, succeeded)
    confidence = stated_confidence(report)
    return {
        "version": VERSION,
        "evidence": {
            "cited": len(cited),
            "gathered": len(gathered_ids),
            "citedGathered": sum(1 for i in cited if i in known),
            "citedNotGathered": [i for i in cited if i not in known][:10],
            "gatheredUncited": sum(1 for i in gathered_ids if i not in set(cited)),
        },
        "tools": {
            "total": len(tools),
            "failed": sum(1 for _agent, _name, status in tools if status != ToolStatus.SUCCEEDED),
        },
        "guards": {
            "evidenceRetries": sum(1 for kind, _s in events if kind == EventType.EVIDENCE_GUARD_RETRY),
            "evidence": evidence_verdicts[-1] if evidence_verdicts else None,
            "semantic": semantic[-1] if semantic else None,
        },
        "modelCalls": {
            "total": max(int(started_calls), len(usage)),
            "withoutUsage": sum(1 for s in usage if s != "REPORTED")
            + max(0, int(started_calls) - len(usage)),
        },
        "plan": {
            "planned": len(plan_steps),
            "done": done,
            "withoutTool": untooled,
            "revisions": revisions,
            "fallback": fallback,
        },
        "statedByModel": {"confidence": confidence} if confidence else None,
    }
