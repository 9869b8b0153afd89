"""What a run's chain binds: the row digests its events carry, collected in one pass; no Django.

`audit.verify.rows.verify_rows` (the store) and `audit.transparency.bundle` (the offline verifier) share
this one reading of the chain, so both agree on which event binds which row (see `audit.verify.rows` for
the rules). Event types and tool statuses are the plain strings of `audit.models`' choices
(`tests/audit/test_row_binding.py` holds the two equal).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from audit.events import APPENDED_EVENTS, KEYED_ROWS

RUN_STARTED = "RUN_STARTED"
AGENT_MODEL_STEP = "AGENT_MODEL_STEP"
TOOL_INVOCATION = "TOOL_INVOCATION"
RUN_FINISHED = "RUN_FINISHED"
REASONING_PURGED = "REASONING_PURGED"
REASONING_REKEYED = "REASONING_REKEYED"
REVIEW_RECORDED = "REVIEW_RECORDED"
# Events appended to a finished run's chain by others than its recorder (never expected by it, allowed
# after the anchored head): declared `APPENDED` in the registry.
GOVERNANCE_EVENTS = APPENDED_EVENTS
# (A bare tool error kept until the run's verdict, ERROR_OBSERVED, binds no row: the row is unchanged.)
TOOL_STATUSES = frozenset({"AWAITING_APPROVAL", "RUNNING", "SUCCEEDED", "FAILED", "INTERRUPTED", "ABANDONED"})
# `audit.models.CHAT_AGENT_NAME`: the agent of a step event that names none.
CHAT_AGENT_NAME = "diagnosis_agent"


def step_key(step_index: Any, agent_name: Any) -> tuple[Any, str]:
    """A model step's key in its run: (step index, agent name); each agent counts its steps from 1."""
    return (step_index, str(agent_name or CHAT_AGENT_NAME))


def step_label(key: tuple[Any, Any]) -> str:
    """`model step 2` for the chat agent's steps (as before per-agent counters), `model step 2
    (executor)` for another agent's."""
    step_index, agent_name = key
    if agent_name in (None, "", CHAT_AGENT_NAME):
        return f"model step {step_index}"
    return f"model step {step_index} ({agent_name})"


@dataclass(slots=True)
class Bound:
    sequence_no: int
    digest: str | None
    purged: bool = False
    # The row form the event names (`rowForm` of tool events; None: the form's first version).
    form: str | None = None


@dataclass(slots=True)
class Bindings:
    """The latest binding of each row in a run's chain, and what the chain says about its finish.

    `finished`: (sequence, runDigest, expected counts, runForm) of the last RUN_FINISHED, or None (a
    `runForm` of None means the first run form, `run`); `digests_seen`:
    whether any event carries a row digest (a run recorded before row digests carries none)."""

    steps: dict[tuple[Any, str], Bound] = field(default_factory=dict)
    tools: dict[str, Bound] = field(default_factory=dict)
    reasoning: dict[tuple[Any, Any], Bound] = field(default_factory=dict)
    # reviewId -> the REVIEW_RECORDED event that binds the review row (`reviewDigest`).
    reviews: dict[str, Bound] = field(default_factory=dict)
    # (event type, row id) -> the appended event binding a higher layer's row (`audit.verify.appended_rows`).
    appended: dict[tuple[str, str], Bound] = field(default_factory=dict)
    finished: tuple[int, str | None, dict | None, str | None] | None = None
    # RUN_STARTED's bindings of the run's identity (`startDigest`, form `startForm`) and of its
    # session's (`sessionDigest`, `sessionForm`); None without a RUN_STARTED, a digest of None for a
    # run started before identity digests.
    started: Bound | None = None
    session: Bound | None = None
    # RUN_STARTED's `configFingerprint` ("" when it carries none) and its `configuration` document
    # (None when absent): `DiagnosisRun.config_fingerprint` must equal the one, the SHA-256 of the
    # other's canonical JSON the fingerprint itself.
    config_fingerprint: str = ""
    configuration: Any = None
    # RUN_STARTED's `purpose` (None when it carries none: a run started before purposes, production).
    purpose: str | None = None
    digests_seen: bool = False
    governance: int = 0
    # Reasoning rows bound by appended events (a judge's call): beyond the recorder's expected count.
    appended_reasoning: int = 0
    step_events: int = 0
    reasoning_events: int = 0
    tool_starts: int = 0


def collect(events: Sequence[Any]) -> Bindings:
    """The bindings of ordered events (objects with `sequence_no`, `event_type`, `status`, `details`)."""
    b = Bindings()
    for event in events:
        d = event.details if isinstance(event.details, dict) else {}
        seq, kind = event.sequence_no, event.event_type
        if kind == RUN_STARTED:
            b.started = Bound(seq, d.get("startDigest"), form=d.get("startForm"))
            b.session = Bound(seq, d.get("sessionDigest"), form=d.get("sessionForm"))
            b.config_fingerprint = str(d.get("configFingerprint") or "")
            b.configuration = d.get("configuration")
            b.purpose = d.get("purpose")
        elif kind == AGENT_MODEL_STEP:
            b.step_events += 1
            b.steps[step_key(d.get("stepIndex"), d.get("agentName"))] = Bound(seq, d.get("stepDigest"))
            b.digests_seen |= "stepDigest" in d
            if "reasoningDigest" not in d:
                b.reasoning[(d.get("stepIndex"), d.get("agentName"))] = Bound(seq, None)
        elif kind == TOOL_INVOCATION and event.status in TOOL_STATUSES and "toolCallId" in d:
            b.tools[d["toolCallId"]] = Bound(seq, d.get("rowDigest"), form=d.get("rowForm"))
            b.digests_seen |= "rowDigest" in d
            # A call that waited for approval is one tool row: its AWAITING_APPROVAL event counts it, the
            # RUNNING of its approved start does not count it again.
            if event.status == "AWAITING_APPROVAL" or (
                event.status == "RUNNING" and "approvedDigest" not in d and not d.get("restarted")
            ):
                b.tool_starts += 1
        elif kind == REVIEW_RECORDED:
            b.governance += 1
            if "reviewId" in d:
                b.reviews[str(d["reviewId"])] = Bound(seq, d.get("reviewDigest"))
        elif kind in (REASONING_PURGED, REASONING_REKEYED):
            b.governance += 1
            for row in d.get("rows") or []:
                b.reasoning[(row.get("stepIndex"), row.get("agentName"))] = Bound(
                    seq, row.get("digest"), purged=kind == REASONING_PURGED
                )
        elif kind in KEYED_ROWS:
            b.governance += 1
            id_key, digest_key = KEYED_ROWS[kind]
            if id_key in d:
                b.appended[(kind, str(d[id_key]))] = Bound(seq, d.get(digest_key))
            if "reasoningDigest" in d:
                b.appended_reasoning += 1
        elif kind in APPENDED_EVENTS:
            b.governance += 1
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


def reasoning_label(key: tuple[Any, Any]) -> str:
    """`step 2 (executor)`: a reasoning row named by its key (step index, agent name)."""
    step_index, agent_name = key
    return f"step {step_index} ({agent_name})"


def unclaimed(
    steps: Mapping[Any, Bound], tools: Mapping[str, Bound], reasoning: Mapping[Any, Bound]
) -> Iterator[tuple[str, Bound]]:
    """The rule both verifiers apply to the bindings no row claimed (the server's `audit.verify.rows`, the
    offline bundle's `audit.transparency.bundle`): a step, tool call or reasoning row the chain binds
    with a digest but no stored (or bundled) row matched is missing; one bound without a digest
    (recorded before row digests, or a step that bound no reasoning) is not. Yields (what, binding) in
    that order, `what` naming the row as both report it: `model step 2`, `tool call c1`, `reasoning
    row for step 2 (executor)`."""
    for key, bound in steps.items():
        if bound.digest is not None:
            yield step_label(key), bound
    for tool_call_id, bound in tools.items():
        if bound.digest is not None:
            yield f"tool call {tool_call_id}", bound
    for key, bound in reasoning.items():
        if bound.digest is not None:
            yield f"reasoning row for {reasoning_label(key)}", bound
