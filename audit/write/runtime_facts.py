"""Facts the runtime hands to the recorder (usage, declared tool calls, retrieval facts), the two
refusals it raises (and the repeat it reports), and the bounds it applies. Decision owners import these
from `audit.write`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from audit.verify.reconcile import CHAT_AGENT_NAME, USAGE_FIELDS, TokenCounts
from reasoning.capture import ToolCallPlan

SUMMARY_CHARS = 500
ERROR_MESSAGE_CHARS = 1000
INPUT_STRING_CHARS = 2000
WITHDRAWN = "WITHDRAWN"

# Reasoning rows of model calls other than agent steps. Agent steps are numbered 1, 2, 3 …; the other
# calls take negative step indexes, so no scheme can collide with an agent step: router attempt k is -k
# (k ≤ ROUTER_REASONING_SPAN), the run's n-th semantic guard call is -(ROUTER_REASONING_SPAN + n).
ROUTER_REASONING_SPAN = 100


def router_reasoning_step(attempt: int) -> int:
    if not 1 <= attempt <= ROUTER_REASONING_SPAN:
        raise ValueError(f"router attempt {attempt} outside 1..{ROUTER_REASONING_SPAN}")
    return -attempt


def guard_reasoning_step(call: int) -> int:
    if call < 1:
        raise ValueError("guard calls count from 1")
    return -(ROUTER_REASONING_SPAN + call)


def step_label(step_index: int | None, agent_name: str = "") -> str:
    """A reasoning row's step index in people's words, the one reading of the numbering above: "router"
    (its k-th attempt "router, attempt k"), "semantic guard" (the n-th call "semantic guard, call n"),
    else the agent's step ("agent step 2", "planner step 1")."""
    if step_index is None:
        return "—"
    if step_index < -ROUTER_REASONING_SPAN:
        call = -step_index - ROUTER_REASONING_SPAN
        return "semantic guard" if call == 1 else f"semantic guard, call {call}"
    if step_index < 0:
        return "router" if step_index == -1 else f"router, attempt {-step_index}"
    name = "agent" if agent_name in ("", CHAT_AGENT_NAME) else agent_name.replace("_", " ")
    return f"{name} step {step_index}"


class ToolCallNotDeclared(Exception):
    """A tool start named a `tool_call_id` that no recorded model step of this run declared."""


class ToolLifecycleConflict(Exception):
    """A tool start or terminal repeated with facts different from the ones already recorded."""


class ToolCallRepeated(Exception):
    """A tool start repeated with the facts already recorded: nothing is written (the first start
    stands) and the caller must not execute the tool again. `status` is the call's recorded status."""

    def __init__(self, tool_call_id: str, status: str) -> None:
        super().__init__(f"tool call {tool_call_id} was already started (now {status})")
        self.tool_call_id = tool_call_id
        self.status = status


@dataclass(frozen=True, slots=True)
class Usage(TokenCounts):
    """Token usage of one model call as the provider reported it; `available=False` means it reported
    none, and then every count is None (never 0). Its fields are `audit.verify.reconcile.TokenCounts`."""

    @classmethod
    def unavailable(cls) -> Usage:
        return cls(available=False)

    def as_details(self) -> dict[str, Any]:
        return {"usageAvailable": self.available, **{key: getattr(self, attr) for key, attr in USAGE_FIELDS}}


@dataclass(frozen=True, slots=True)
class DeclaredToolCall:
    """A tool call a model step declared: id, name and the raw argument string.

    `tool_call_id` names the call in the run's record and is unique in the run (see
    `RunRecorder.run_unique_calls`); `provider_tool_call_id` is the id as the provider sent it, which
    some providers make unique only within one response, and which the tool result message must carry
    back (the provider pairs results with calls by it). Empty means the same as `tool_call_id`.
    """

    tool_call_id: str
    name: str
    arguments: str
    provider_tool_call_id: str = ""

    @property
    def provider_id(self) -> str:
        """The id the provider knows this call by."""
        return self.provider_tool_call_id or self.tool_call_id

    def plan(self) -> ToolCallPlan:
        return ToolCallPlan(name=self.name, arguments=self.arguments)


@dataclass(frozen=True, slots=True)
class RetrievalFacts:
    """What a retrieval tool reports about how it found its evidence."""

    layer: str = ""
    l0_match_count: int | None = None
    l1_match_count: int | None = None
    details: dict[str, Any] = field(default_factory=dict)
    is_truncated: bool = False


@dataclass(frozen=True, slots=True)
class ChainEvent:
    """One timeline event to write. `bind` maps a details key to a row written in the same decision:
    the row's digest (`audit.verify.row_digests`, over the values as they are written) is put under that
    key."""

    phase: str
    event_type: str
    status: str
    summary: str
    details: dict[str, Any]
    bind: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Committed:
    """A timeline event as it committed: its sequence number, type, status and details (bounded
    metadata, exactly as chained). What a run's live listeners learn from the recorder: they pick the
    few fields they may show and never forward the details themselves."""

    sequence_no: int
    event_type: str
    status: str
    details: dict[str, Any]
