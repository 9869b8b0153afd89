"""What a run's chain binds: the row digests its events carry, collected in one pass; no Django.

`audit.binding.verify_rows` (the store) and `audit.transparency.bundle` (the offline verifier) share
this one reading of the chain, so both agree on which event binds which row (see `audit.binding` for
the rules). Event types and tool statuses are the plain strings of `audit.models`' choices
(`tests/audit/test_row_binding.py` holds the two equal).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

AGENT_MODEL_STEP = "AGENT_MODEL_STEP"
TOOL_INVOCATION = "TOOL_INVOCATION"
RUN_FINISHED = "RUN_FINISHED"
REASONING_PURGED = "REASONING_PURGED"
REASONING_REKEYED = "REASONING_REKEYED"
GOVERNANCE_EVENTS = frozenset({REASONING_PURGED, REASONING_REKEYED})
TOOL_STATUSES = frozenset({"RUNNING", "SUCCEEDED", "FAILED", "INTERRUPTED", "ABANDONED"})


@dataclass(slots=True)
class Bound:
    sequence_no: int
    digest: str | None
    purged: bool = False


@dataclass(slots=True)
class Bindings:
    """The latest binding of each row in a run's chain, and what the chain says about its finish.

    `finished`: (sequence, runDigest, expected counts, runForm) of the last RUN_FINISHED, or None (a
    `runForm` of None means the first run form, `run`); `digests_seen`:
    whether any event carries a row digest (a run recorded before row digests carries none)."""

    steps: dict[Any, Bound] = field(default_factory=dict)
    tools: dict[str, Bound] = field(default_factory=dict)
    reasoning: dict[tuple[Any, Any], Bound] = field(default_factory=dict)
    finished: tuple[int, str | None, dict | None, str | None] | None = None
    digests_seen: bool = False
    governance: int = 0
    step_events: int = 0
    reasoning_events: int = 0
    tool_starts: int = 0


def collect(events: Sequence[Any]) -> Bindings:
    """The bindings of ordered events (objects with `sequence_no`, `event_type`, `status`, `details`)."""
    b = Bindings()
    for event in events:
        d = event.details if isinstance(event.details, dict) else {}
        seq, kind = event.sequence_no, event.event_type
        if kind == AGENT_MODEL_STEP:
            b.step_events += 1
            b.steps[d.get("stepIndex")] = Bound(seq, d.get("stepDigest"))
            b.digests_seen |= "stepDigest" in d
            if "reasoningDigest" not in d:
                b.reasoning[(d.get("stepIndex"), d.get("agentName"))] = Bound(seq, None)
        elif kind == TOOL_INVOCATION and event.status in TOOL_STATUSES and "toolCallId" in d:
            b.tools[d["toolCallId"]] = Bound(seq, d.get("rowDigest"))
            b.digests_seen |= "rowDigest" in d
            b.tool_starts += event.status == "RUNNING"
        elif kind in GOVERNANCE_EVENTS:
            b.governance += 1
            for row in d.get("rows") or []:
                b.reasoning[(row.get("stepIndex"), row.get("agentName"))] = Bound(
                    seq, row.get("digest"), purged=kind == REASONING_PURGED
                )
        elif kind == RUN_FINISHED:
            b.finished = (seq, d.get("runDigest"), d.get("expected"), d.get("runForm"))
            b.digests_seen |= "runDigest" in d
        # A router or guard decision names its reasoning row's step index as `reasoningStepIndex`.
        reasoning_step = d.get("reasoningStepIndex", d.get("stepIndex"))
        if "reasoningDigest" in d and reasoning_step is not None and "agentName" in d:
            b.reasoning[(reasoning_step, d["agentName"])] = Bound(seq, d["reasoningDigest"])
            b.digests_seen = True
            b.reasoning_events += 1
    return b
