"""The one write API for decision owners: every audit record of a run is written through a RunRecorder.

Decision owners (router, agent step hook, tool boundary, guards, release, executor) call the typed method
for their decision at the moment they decide. The recorder:

* allocates the run's timeline `sequence_no` 1, 2, 3 … with no gap: a number is consumed only when its
  event commits, so a failed write leaves no hole in what is stored (the miss shows in the counts);
* chains `hash = sha256(prev_hash + canonical JSON of the event)` (see `audit.integrity`);
* bounds every payload (`audit.payloads`: previews ≤ 500 characters plus full length and sha256);
* writes a decision's rows in one transaction, durable before the method returns (a model step is its
  step row, its reasoning row and its two timeline events);
* keeps the run's *expected* counts (what it attempted) beside what committed, and its token ledger;
* is **fail-open**: a database error is logged with the run id, the operation and the error class only
  (never content), counted in `audit_write_failures`, and never raised into the caller.

Two refusals are *not* audit failures and are raised to the caller: starting a tool whose `tool_call_id`
no recorded step of this run declared (`ToolCallNotDeclared`, fail-closed per seed 002), and repeating a
tool start or terminal with different facts (`ToolLifecycleConflict`). Repeats with the same facts are
no-ops.

Every writing method returns the `sequence_no` of its (last) timeline event, or None when the write
failed or was a no-op; transports use it as the resumption id of live events.

Rows reach the database as one `audit.write_ops.WriteOp` per decision (statements built from the models'
fields; on MariaDB one round trip per decision), directly on the calling thread's connection or, with
`settings.AUDIT_GROUP_COMMIT`, through `audit.group_commit` together with other runs' decisions that wait
for a COMMIT at the same time. Either way a method returns only once its decision committed.

One RunRecorder exists per run, in the process holding the run's lease. It is thread-safe (one lock per
run; parallel tool calls may record from several threads). `RunRecorder.resume` rebuilds the state from
the database for another process (the sweeper) that takes over a run whose owner died. All methods are
synchronous Django ORM code; async callers wrap them with `asgiref.sync.sync_to_async`.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import DatabaseError, IntegrityError, connection
from django.db.models import F
from django.utils import timezone

from audit.group_commit import get_committer
from audit.integrity import GENESIS_HASH, event_payload_json
from audit.models import (
    AgentStep,
    EventType,
    Phase,
    ToolInvocation,
    ToolStatus,
    TraceEvent,
    UsageSource,
)
from audit.payloads import bound_json, bound_json_text, bound_text, canonical_json, clip, sha256_hex
from audit.write_ops import Insert, RawJSON, Update, WriteOp, execute
from audit.write_ops import Table as RowTable
from diagnosis.models import DiagnosisRun, ReleaseDecision, RunStatus
from reasoning.capture import CapturedReasoning, ToolCallPlan
from reasoning.models import AgentReasoningAudit

logger = logging.getLogger(__name__)

SUMMARY_CHARS = 500
ERROR_MESSAGE_CHARS = 1000
INPUT_STRING_CHARS = 2000


class ToolCallNotDeclared(Exception):
    """A tool start named a `tool_call_id` that no recorded model step of this run declared."""


class ToolLifecycleConflict(Exception):
    """A tool start or terminal repeated with facts different from the ones already recorded."""


@dataclass(frozen=True, slots=True)
class Usage:
    """Token usage of one model call as the provider reported it; `available=False` means it reported
    none, and then every count is None (never 0)."""

    available: bool
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    reasoning_tokens: int | None = None
    cached_tokens: int | None = None

    @classmethod
    def unavailable(cls) -> Usage:
        return cls(available=False)

    def as_details(self) -> dict[str, Any]:
        return {
            "usageAvailable": self.available,
            "promptTokens": self.prompt_tokens,
            "completionTokens": self.completion_tokens,
            "totalTokens": self.total_tokens,
            "reasoningTokens": self.reasoning_tokens,
            "cachedTokens": self.cached_tokens,
        }


@dataclass(frozen=True, slots=True)
class DeclaredToolCall:
    """A tool call a model step declared: id, name and the raw argument string."""

    tool_call_id: str
    name: str
    arguments: str

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


@dataclass(slots=True)
class _ToolState:
    name: str
    input_key: str
    step_index: int | None
    started_monotonic: float | None
    started_at: Any
    status: str = ToolStatus.RUNNING
    terminal_key: tuple | None = None


@dataclass(frozen=True, slots=True)
class _Event:
    phase: str
    event_type: str
    status: str
    summary: str
    details: dict[str, Any]


@dataclass(slots=True)
class _Ledger:
    """The run's token ledger: attempted totals and what the persisted per-call records add up to."""

    by_source: dict[str, int] = field(default_factory=lambda: {s.value: 0 for s in UsageSource})
    reasoning: int = 0
    cached_input: int = 0
    calls: int = 0
    unavailable_calls: int = 0
    persisted_calls: int = 0
    persisted_total: int = 0

    @property
    def total(self) -> int:
        return sum(self.by_source.values())

    def add(self, source: str, usage: Usage) -> None:
        self.calls += 1
        if not usage.available:
            self.unavailable_calls += 1
            return
        self.by_source[source] += usage.total_tokens or 0
        self.reasoning += usage.reasoning_tokens or 0
        self.cached_input += usage.cached_tokens or 0

    @property
    def reconciled(self) -> bool:
        return (
            self.unavailable_calls == 0
            and self.persisted_calls == self.calls
            and self.persisted_total == self.total
        )


class RunRecorder:
    """Writes one run's audit records. Create it with `RunRecorder.for_run(run)` in the lease owner, or
    `RunRecorder.resume(run_id)` in a process taking over a run. See the module docstring for the rules."""

    def __init__(
        self, *, run_id: str, session_id: str, created_at: Any = None, group_commit: bool | None = None
    ) -> None:
        self.run_id = run_id
        self.session_id = session_id
        self._created_at = created_at
        self._group_commit = (
            bool(getattr(settings, "AUDIT_GROUP_COMMIT", False)) if group_commit is None else group_commit
        )
        self._lock = threading.RLock()
        self._next_sequence = 1
        self._prev_hash = GENESIS_HASH
        self._declared: dict[str, int] = {}
        self._step_ids: dict[int, int] = {}
        self._tools: dict[str, _ToolState] = {}
        self._ledger = _Ledger()
        self._first_model_request_at = None
        self._first_output_at = None
        self._started_at = None
        self.release_decision: str | None = None
        self.expected_events = 0
        self.expected_steps = 0
        self.expected_tools = 0
        self.audit_write_failures = 0

    # ----------------------------------------------------------------------------------------------
    # Construction
    # ----------------------------------------------------------------------------------------------
    @classmethod
    def for_run(cls, run: DiagnosisRun, *, group_commit: bool | None = None) -> RunRecorder:
        """A recorder for a run that has written no audit record yet. `group_commit` overrides
        `settings.AUDIT_GROUP_COMMIT` for this recorder."""
        return cls(
            run_id=run.run_id, session_id=run.session_id, created_at=run.created_at, group_commit=group_commit
        )

    @classmethod
    def resume(cls, run_id: str) -> RunRecorder:
        """Rebuild a recorder from what is stored: chain head, declared tool calls, tool states and counts.

        Used by a process that takes over a run (the sweeper). Tools started elsewhere have no monotonic
        start here, so their duration stays unknown (NULL) when this recorder closes them.
        """
        run = DiagnosisRun.objects.get(run_id=run_id)
        rec = cls(run_id=run.run_id, session_id=run.session_id, created_at=run.created_at)
        rec._started_at = run.started_at
        rec._first_model_request_at = run.first_model_request_at
        rec._first_output_at = run.first_output_at
        rec.release_decision = run.release_decision
        rec._reload_head()
        for step_index, step_id, ids in AgentStep.objects.filter(run_id=run_id).values_list(
            "step_index", "id", "tool_call_ids"
        ):
            rec._step_ids[step_index] = step_id
            for tool_call_id in ids or []:
                rec._declared[tool_call_id] = step_index
        for tool in ToolInvocation.objects.filter(run_id=run_id):
            rec._tools[tool.tool_call_id] = _ToolState(
                name=tool.tool_name,
                input_key=canonical_json(tool.input_params),
                step_index=tool.step_index,
                started_monotonic=None,
                started_at=tool.started_at,
                status=tool.status,
            )
        persisted = rec._persisted_counts()
        rec.expected_events = max(run.expected_events, persisted["events"])
        rec.expected_steps = max(run.expected_steps, persisted["steps"])
        rec.expected_tools = max(run.expected_tools, persisted["tools"])
        rec.audit_write_failures = run.audit_write_failures
        for details in TraceEvent.objects.filter(
            run_id=run_id, event_type=EventType.MODEL_TOKEN_USAGE
        ).values_list("details", flat=True):
            usage = Usage(
                available=bool(details.get("usageAvailable")),
                total_tokens=details.get("totalTokens"),
                reasoning_tokens=details.get("reasoningTokens"),
                cached_tokens=details.get("cachedTokens"),
            )
            rec._ledger.add(details.get("source", UsageSource.AGENT), usage)
            rec._ledger.persisted_calls += 1
            rec._ledger.persisted_total += (usage.total_tokens or 0) if usage.available else 0
        rec._ledger.calls = max(rec._ledger.calls, run.model_calls)
        return rec

    # ----------------------------------------------------------------------------------------------
    # Run lifecycle
    # ----------------------------------------------------------------------------------------------
    def run_started(self, *, agent_flow: str = "", details: dict[str, Any] | None = None) -> int | None:
        """RUN_STARTED; the run becomes RUNNING with its `started_at`."""
        now = timezone.now()
        self._started_at = now
        return self._write(
            "run_started",
            [_Event(Phase.RUN, EventType.RUN_STARTED, RunStatus.RUNNING, "run started", details or {})],
            run_fields={"status": RunStatus.RUNNING, "started_at": now},
        )

    def mark_first_model_request(self) -> None:
        """The first request to a model left this process (timing only; written once)."""
        if self._first_model_request_at is None:
            self._first_model_request_at = timezone.now()
            self._update_run("first_model_request", first_model_request_at=self._first_model_request_at)

    def mark_first_output(self) -> None:
        """The first visible answer text reached the user (timing only; written once)."""
        if self._first_output_at is None:
            self._first_output_at = timezone.now()
            fields: dict[str, Any] = {"first_output_at": self._first_output_at}
            if self._created_at is not None:
                fields["first_output_latency_ms"] = _ms(self._first_output_at - self._created_at)
            self._update_run("first_output", **fields)

    def run_cancelled(self, *, reason: str) -> int | None:
        """RUN_CANCELLED: the run stops at a safe point; `finish(status=CANCELLED)` follows."""
        return self._write(
            "run_cancelled",
            [_Event(Phase.RUN, EventType.RUN_CANCELLED, RunStatus.CANCELLED, clip(reason, 200), {})],
        )

    def finish(
        self,
        *,
        status: str,
        content: str = "",
        error_code: str = "",
        error_message: str = "",
    ) -> int | None:
        """Close dangling tools, write RUN_FINISHED, then the run's terminal row: status, content,
        release decision, error, timing, token ledger (with its reconciliation verdict) and counts."""
        with self._lock:
            self._close_dangling_tools(status)
            now = timezone.now()
            ledger = self._ledger
            sequence_no = self._write(
                "run_finished",
                [
                    _Event(
                        Phase.RUN,
                        EventType.RUN_FINISHED,
                        status,
                        clip(
                            f"run {status.lower()}"
                            + (f", release {self.release_decision}" if self.release_decision else "")
                            + (f", error {error_code}" if error_code else ""),
                            SUMMARY_CHARS,
                        ),
                        {
                            "status": status,
                            "releaseDecision": self.release_decision,
                            "errorCode": error_code or None,
                            "tokensTotal": ledger.total,
                            "modelCalls": ledger.calls,
                            "unavailableCalls": ledger.unavailable_calls,
                            "contentLength": len(content),
                        },
                    )
                ],
            )
            fields: dict[str, Any] = {
                "status": status,
                "content": content,
                "release_decision": self.release_decision,
                "error_code": clip(error_code, 64),
                "error_message": clip(error_message, ERROR_MESSAGE_CHARS),
                "finished_at": now,
                "tokens_router": ledger.by_source[UsageSource.ROUTER],
                "tokens_agent": ledger.by_source[UsageSource.AGENT],
                "tokens_guard": ledger.by_source[UsageSource.GUARD],
                "tokens_total": ledger.total,
                "tokens_reasoning": ledger.reasoning,
                "tokens_cached_input": ledger.cached_input,
                "model_calls": ledger.calls,
                "usage_unavailable_calls": ledger.unavailable_calls,
                "tokens_reconciled": ledger.reconciled,
                "lease_owner": "",
                "lease_expires_at": None,
            }
            if self._created_at is not None:
                fields["total_duration_ms"] = _ms(now - self._created_at)
            if not self._update_run("finish", **fields):
                # The terminal row is the business result: one more try after a failed write.
                self._update_run("finish_retry", **fields)
            return sequence_no

    # ----------------------------------------------------------------------------------------------
    # Router
    # ----------------------------------------------------------------------------------------------
    def routing_attempt(
        self,
        *,
        attempt: int,
        model: str,
        usage: Usage,
        ok: bool,
        intent: str | None = None,
        confidence: float | None = None,
        reason: str = "",
        error: str = "",
        raw_output: str | None = None,
        duration_ms: int | None = None,
        provider_attempts: Sequence[dict[str, Any]] = (),
    ) -> int | None:
        """ROUTING_ATTEMPT (parse failures included) and its MODEL_TOKEN_USAGE (source ROUTER)."""
        raw = bound_text(raw_output, 200) if raw_output is not None else None
        details = {
            "attempt": attempt,
            "model": model,
            "ok": ok,
            "intent": intent,
            "confidence": confidence,
            "reason": clip(reason, 300),
            "error": clip(error, 300) or None,
            "durationMs": duration_ms,
            "providerAttempts": list(provider_attempts),
        }
        if raw is not None:
            details["rawOutput"] = {"preview": raw.preview, "length": raw.length, "sha256": raw.sha256}
        summary = (
            f"attempt {attempt}: {intent} ({confidence})"
            if ok
            else f"attempt {attempt}: unusable ({clip(error, 120)})"
        )
        return self._write(
            "routing_attempt",
            [
                _Event(Phase.ROUTING, EventType.ROUTING_ATTEMPT, "OK" if ok else "INVALID", summary, details),
                self._usage_event(UsageSource.ROUTER, model, usage, phase=Phase.ROUTING),
            ],
            usage=usage,
        )

    def routing_decision(
        self, *, intent: str, confidence: float | None, reason: str, fallback: bool
    ) -> int | None:
        """ROUTING_DECISION; the run's `intent` is set in the same transaction."""
        summary = f"{intent}" + (" (fallback: router answer unusable)" if fallback else f" ({confidence})")
        return self._write(
            "routing_decision",
            [
                _Event(
                    Phase.ROUTING,
                    EventType.ROUTING_DECISION,
                    "FALLBACK" if fallback else "DECIDED",
                    summary,
                    {
                        "intent": intent,
                        "confidence": confidence,
                        "reason": clip(reason, 300),
                        "fallback": fallback,
                    },
                )
            ],
            run_fields={"intent": intent},
        )

    # ----------------------------------------------------------------------------------------------
    # Agent model step
    # ----------------------------------------------------------------------------------------------
    def model_step(
        self,
        *,
        step_index: int,
        agent_name: str,
        model: str,
        usage: Usage,
        reasoning: CapturedReasoning,
        tool_calls: Sequence[DeclaredToolCall] = (),
        finish_reason: str = "",
        started_at: Any = None,
        finished_at: Any = None,
        duration_ms: int | None = None,
        model_input: Sequence[dict[str, Any]] = (),
        text_length: int = 0,
        provider_attempts: Sequence[dict[str, Any]] = (),
    ) -> int | None:
        """One agent model call: step row + reasoning row + AGENT_MODEL_STEP + MODEL_TOKEN_USAGE (AGENT),
        in one transaction. Declares the step's tool calls so that their starts are accepted.

        `model_input` is a bounded summary of the messages sent (roles and sizes, never content);
        no reasoning or assistant text reaches the step row or the timeline, only their byte counts.
        """
        now = timezone.now()
        with self._lock:
            for call in tool_calls:
                self._declared[call.tool_call_id] = step_index
            self.expected_steps += 1
            names = [c.name for c in tool_calls]
            summary = f"step {step_index}: {model}, finish {finish_reason or 'unknown'}"
            if names:
                summary += f", {len(names)} tool call(s): {', '.join(names)}"
            t = _tables()
            step = Insert(
                t.step,
                t.step.row(
                    run_id=self.run_id,
                    session_id=self.session_id,
                    step_index=step_index,
                    agent_name=agent_name,
                    model=clip(model, 128),
                    model_input=bound_json(list(model_input)),
                    model_output=bound_json(
                        {
                            "textLength": text_length,
                            "finishReason": finish_reason,
                            "toolCalls": [
                                {"id": c.tool_call_id, "name": c.name, "argumentsLength": len(c.arguments)}
                                for c in tool_calls
                            ],
                        }
                    ),
                    tool_call_ids=[c.tool_call_id for c in tool_calls],
                    has_tool_call=bool(tool_calls),
                    finish_reason=clip(finish_reason, 32),
                    attempts=bound_json(list(provider_attempts)),
                    started_at=started_at,
                    finished_at=finished_at,
                    duration_ms=duration_ms,
                    usage_available=usage.available,
                    prompt_tokens=usage.prompt_tokens,
                    completion_tokens=usage.completion_tokens,
                    reasoning_tokens=usage.reasoning_tokens,
                    cached_tokens=usage.cached_tokens,
                    total_tokens=usage.total_tokens,
                    reasoning_available=reasoning.reasoning_available,
                    reasoning_bytes=reasoning.reasoning_bytes,
                    assistant_bytes=reasoning.assistant_bytes,
                    content_source=reasoning.content_source,
                    created_at=now,
                ),
                want_id=True,
            )
            reasoning_row = Insert(
                t.reasoning,
                t.reasoning.row(
                    session_id=self.session_id,
                    run_id=self.run_id,
                    step_index=step_index,
                    agent_name=agent_name,
                    reasoning_available=reasoning.reasoning_available,
                    reasoning_content=reasoning.reasoning_content,
                    assistant_text=reasoning.assistant_text,
                    content_source=reasoning.content_source,
                    content_bytes=reasoning.content_bytes,
                    created_at=now,
                ),
            )
            events = [
                _Event(
                    Phase.AGENT,
                    EventType.AGENT_MODEL_STEP,
                    "TOOL_CALLS" if tool_calls else "ANSWER",
                    clip(summary, SUMMARY_CHARS),
                    {
                        "stepIndex": step_index,
                        "agentName": agent_name,
                        "model": model,
                        "finishReason": finish_reason,
                        "toolCalls": [{"id": c.tool_call_id, "name": c.name} for c in tool_calls],
                        "durationMs": duration_ms,
                        "reasoningAvailable": reasoning.reasoning_available,
                        "reasoningBytes": reasoning.reasoning_bytes,
                        "assistantBytes": reasoning.assistant_bytes,
                        "contentSource": reasoning.content_source,
                        "providerAttempts": len(provider_attempts),
                    },
                ),
                self._usage_event(UsageSource.AGENT, model, usage, phase=Phase.AGENT, step_index=step_index),
            ]

            sequence_no = self._write("model_step", events, inserts=[step, reasoning_row], usage=usage)
            if step.id is not None:
                self._step_ids[step_index] = step.id
            return sequence_no

    # ----------------------------------------------------------------------------------------------
    # Tool boundary
    # ----------------------------------------------------------------------------------------------
    def is_declared(self, tool_call_id: str) -> bool:
        return tool_call_id in self._declared

    def tool_started(self, *, tool_call_id: str, tool_name: str, input_params: dict[str, Any]) -> int | None:
        """Commit the RUNNING row and its TOOL_INVOCATION event before the tool executes.

        Raises ToolCallNotDeclared when no recorded step of this run declared the id (the refusal is
        itself recorded on the timeline), ToolLifecycleConflict when the id was started with another
        name or input. A repeat with the same facts is a no-op.
        """
        effective_input = bound_json(input_params, max_string=INPUT_STRING_CHARS)
        input_key = canonical_json(effective_input)
        with self._lock:
            existing = self._tools.get(tool_call_id)
            if existing is not None:
                if existing.name == tool_name and existing.input_key == input_key:
                    return
                raise ToolLifecycleConflict(f"tool call {tool_call_id} was already started with other facts")
            if tool_call_id not in self._declared:
                self._write(
                    "tool_refused",
                    [
                        _Event(
                            Phase.TOOL,
                            EventType.TOOL_INVOCATION,
                            "REFUSED",
                            clip(
                                f"{tool_name} refused: call {tool_call_id} not declared by a recorded step",
                                SUMMARY_CHARS,
                            ),
                            {
                                "toolCallId": tool_call_id,
                                "toolName": tool_name,
                                "reason": "UNDECLARED_TOOL_CALL",
                            },
                        )
                    ],
                )
                raise ToolCallNotDeclared(f"tool call {tool_call_id} was not declared by a recorded step")

            step_index = self._declared[tool_call_id]
            now = timezone.now()
            state = _ToolState(
                name=tool_name,
                input_key=input_key,
                step_index=step_index,
                started_monotonic=None,
                started_at=now,
            )
            self._tools[tool_call_id] = state
            self.expected_tools += 1
            t = _tables()
            row = Insert(
                t.tool,
                t.tool.row(
                    run_id=self.run_id,
                    session_id=self.session_id,
                    step_id=self._step_ids.get(step_index),
                    step_index=step_index,
                    tool_call_id=tool_call_id,
                    tool_name=tool_name,
                    status=ToolStatus.RUNNING,
                    input_params=effective_input,
                    started_at=now,
                    created_at=now,
                    updated_at=now,
                ),
            )
            sequence_no = self._write(
                "tool_started",
                [
                    _Event(
                        Phase.TOOL,
                        EventType.TOOL_INVOCATION,
                        ToolStatus.RUNNING,
                        clip(f"{tool_name} started ({tool_call_id})", SUMMARY_CHARS),
                        {
                            "toolCallId": tool_call_id,
                            "toolName": tool_name,
                            "stepIndex": step_index,
                            "input": effective_input,
                        },
                    )
                ],
                inserts=[row],
            )
            # Starting is the moment the executing process begins timing.
            state.started_monotonic = time.monotonic()
            return sequence_no

    def tool_finished(
        self,
        *,
        tool_call_id: str,
        status: str,
        output: str | None = None,
        error_code: str = "",
        error_message: str = "",
        retrieval: RetrievalFacts | None = None,
        summary_note: str = "",
    ) -> int | None:
        """The tool's one terminal update (SUCCEEDED or FAILED here; INTERRUPTED/ABANDONED come from
        `finish` or `close_tools`). Same facts again: no-op; different facts: ToolLifecycleConflict."""
        with self._lock:
            state = self._tools.get(tool_call_id)
            if state is None:
                raise ToolLifecycleConflict(f"tool call {tool_call_id} was never started")
            return self._terminate(
                tool_call_id, state, status, output, error_code, error_message, retrieval, summary_note
            )

    def close_tools(
        self, *, status: str, error_code: str = "", error_message: str = ""
    ) -> dict[str, int | None]:
        """Give every still-RUNNING tool the terminal `status` (e.g. INTERRUPTED on cancel). Returns each
        closed tool's `tool_call_id` with the `sequence_no` of its terminal event (None if the write
        failed)."""
        with self._lock:
            running = [(k, s) for k, s in self._tools.items() if s.status == ToolStatus.RUNNING]
            return {
                tool_call_id: self._terminate(
                    tool_call_id, state, status, None, error_code, error_message, None, ""
                )
                for tool_call_id, state in running
            }

    def _close_dangling_tools(self, run_status: str) -> None:
        closing = {
            RunStatus.FAILED.value: (ToolStatus.FAILED, "RUN_FAILED"),
            RunStatus.CANCELLED.value: (ToolStatus.INTERRUPTED, "RUN_CANCELLED"),
        }.get(str(run_status), (ToolStatus.ABANDONED, "RUN_ENDED"))
        self.close_tools(
            status=closing[0], error_code=closing[1], error_message="the run ended while the tool was running"
        )

    def _terminate(
        self,
        tool_call_id: str,
        state: _ToolState,
        status: str,
        output: str | None,
        error_code: str,
        error_message: str,
        retrieval: RetrievalFacts | None,
        summary_note: str,
    ) -> int | None:
        bounded = bound_text(output) if output is not None else None
        key = (
            status,
            bounded.sha256 if bounded else None,
            error_code,
            clip(error_message, ERROR_MESSAGE_CHARS),
        )
        if state.status != ToolStatus.RUNNING:
            if state.terminal_key == key or (state.terminal_key is None and state.status == status):
                return
            raise ToolLifecycleConflict(f"tool call {tool_call_id} already ended as {state.status}")
        now = timezone.now()
        duration_ms = (
            int((time.monotonic() - state.started_monotonic) * 1000)
            if state.started_monotonic is not None
            else None
        )
        state.status = status
        state.terminal_key = key
        fields: dict[str, Any] = {
            "status": status,
            "finished_at": now,
            "duration_ms": duration_ms,
            "error_code": clip(error_code, 64),
            "error_message": clip(error_message, ERROR_MESSAGE_CHARS),
            "updated_at": now,
        }
        if bounded is not None:
            fields.update(
                output_preview=bounded.preview,
                output_length=bounded.length,
                output_sha256=bounded.sha256,
                is_truncated=bounded.truncated or bool(retrieval and retrieval.is_truncated),
            )
        if retrieval is not None:
            fields.update(
                retrieval_layer=retrieval.layer,
                l0_match_count=retrieval.l0_match_count,
                l1_match_count=retrieval.l1_match_count,
                retrieval_details=bound_json(retrieval.details),
            )
        parts = [f"{state.name} {status.lower()}"]
        if duration_ms is not None:
            parts.append(f"in {duration_ms} ms")
        if bounded is not None:
            parts.append(f"{bounded.length} chars")
        if error_code:
            parts.append(f"error {error_code}")
        if summary_note:
            parts.append(summary_note)
        details: dict[str, Any] = {
            "toolCallId": tool_call_id,
            "toolName": state.name,
            "stepIndex": state.step_index,
            "durationMs": duration_ms,
            "outputLength": bounded.length if bounded else None,
            "outputSha256": bounded.sha256 if bounded else None,
            "errorCode": error_code or None,
        }
        if retrieval is not None:
            details.update(
                retrievalLayer=retrieval.layer,
                l0MatchCount=retrieval.l0_match_count,
                l1MatchCount=retrieval.l1_match_count,
            )

        t = _tables()
        # The RUNNING row may never have committed (an earlier audit write failed): then the terminal
        # facts are inserted as the tool's row instead, so they are kept anyway.
        fallback = Insert(
            t.tool,
            t.tool.row(
                run_id=self.run_id,
                session_id=self.session_id,
                step_id=self._step_ids.get(state.step_index) if state.step_index is not None else None,
                step_index=state.step_index,
                tool_call_id=tool_call_id,
                tool_name=state.name,
                input_params={},
                started_at=state.started_at,
                created_at=now,
                **fields,
            ),
        )
        update = Update(
            t.tool,
            tuple(fields),
            tuple(fields.values()),
            ("run_id", "tool_call_id", "status"),
            (self.run_id, tool_call_id, ToolStatus.RUNNING.value),
            fallback=fallback,
        )

        return self._write(
            "tool_finished",
            [
                _Event(
                    Phase.TOOL,
                    EventType.TOOL_INVOCATION,
                    status,
                    clip(", ".join(parts), SUMMARY_CHARS),
                    details,
                )
            ],
            updates=[update],
        )

    # ----------------------------------------------------------------------------------------------
    # Guards and release
    # ----------------------------------------------------------------------------------------------
    def evidence_guard(
        self,
        *,
        retry: bool,
        passed: bool,
        reasons: Iterable[str] = (),
        cited: Iterable[str] = (),
        unknown: Iterable[str] = (),
        required: bool = True,
    ) -> int | None:
        """EVIDENCE_GUARD_INITIAL or EVIDENCE_GUARD_RETRY with PASS/FAIL and reasons
        (NO_CITATION, UNKNOWN_CITATION, CANONICAL_UNAVAILABLE)."""
        reasons, cited, unknown = list(reasons), list(cited), list(unknown)
        verdict = "PASS" if passed else "FAIL"
        summary = f"{verdict}: {len(cited)} citation(s)" + (
            f", reasons {', '.join(reasons)}" if reasons else ""
        )
        if not required:
            summary = f"{verdict}: evidence not required for this intent"
        return self._write(
            "evidence_guard",
            [
                _Event(
                    Phase.GUARD,
                    EventType.EVIDENCE_GUARD_RETRY if retry else EventType.EVIDENCE_GUARD_INITIAL,
                    verdict,
                    clip(summary, SUMMARY_CHARS),
                    {
                        "passed": passed,
                        "required": required,
                        "reasons": reasons,
                        "cited": cited,
                        "unknown": unknown,
                    },
                )
            ],
        )

    def semantic_guard(
        self,
        *,
        model: str,
        usage: Usage,
        supported: bool | None,
        unsupported_claims: Iterable[str] = (),
        reason: str = "",
        error: str = "",
        duration_ms: int | None = None,
        provider_attempts: Sequence[dict[str, Any]] = (),
    ) -> int | None:
        """SEMANTIC_GUARD_DECISION and its MODEL_TOKEN_USAGE (source GUARD). `supported=None` means the
        guard model's answer was unusable (`error` says why), which the release treats as not supported."""
        claims = [clip(c, 300) for c in unsupported_claims]
        verdict = "PASS" if supported else ("ERROR" if supported is None else "FAIL")
        summary = (
            f"{verdict}"
            + (f": {len(claims)} unsupported claim(s)" if claims else "")
            + (f" ({clip(error, 120)})" if error else "")
        )
        return self._write(
            "semantic_guard",
            [
                _Event(
                    Phase.GUARD,
                    EventType.SEMANTIC_GUARD_DECISION,
                    verdict,
                    clip(summary, SUMMARY_CHARS),
                    {
                        "model": model,
                        "supported": supported,
                        "unsupportedClaims": claims,
                        "reason": clip(reason, 300),
                        "error": clip(error, 300) or None,
                        "durationMs": duration_ms,
                        "providerAttempts": list(provider_attempts),
                    },
                ),
                self._usage_event(UsageSource.GUARD, model, usage, phase=Phase.GUARD),
            ],
            usage=usage,
        )

    def release(self, *, decision: str, reason: str, details: dict[str, Any] | None = None) -> int | None:
        """RELEASE_DECISION: PUBLISHED or BLOCKED, and why."""
        if decision not in ReleaseDecision.values:
            raise ValueError(f"unknown release decision {decision!r}")
        self.release_decision = decision
        return self._write(
            "release",
            [
                _Event(
                    Phase.RELEASE,
                    EventType.RELEASE_DECISION,
                    decision,
                    clip(f"{decision}: {reason}", SUMMARY_CHARS),
                    {"decision": decision, "reason": clip(reason, 300), **(details or {})},
                )
            ],
            run_fields={"release_decision": decision},
        )

    # ----------------------------------------------------------------------------------------------
    # Internals
    # ----------------------------------------------------------------------------------------------
    def _usage_event(
        self, source: str, model: str, usage: Usage, *, phase: str, step_index: int | None = None
    ) -> _Event:
        if usage.available:
            summary = (
                f"{source}: {usage.total_tokens} tokens "
                f"({usage.prompt_tokens} in, {usage.completion_tokens} out)"
            )
        else:
            summary = f"{source}: usage not reported by the provider"
        details = {"source": str(source), "model": model, "stepIndex": step_index, **usage.as_details()}
        return _Event(
            phase,
            EventType.MODEL_TOKEN_USAGE,
            "REPORTED" if usage.available else "UNAVAILABLE",
            summary,
            details,
        )

    def _write(
        self,
        what: str,
        events: Sequence[_Event],
        *,
        inserts: Sequence[Insert] = (),
        updates: Sequence[Update] = (),
        run_fields: dict[str, Any] | None = None,
        usage: Usage | None = None,
    ) -> int | None:
        """Write the decision's rows (`inserts`, `updates`), its events and the run fields in one
        transaction, durable before returning; fail-open.

        Returns the `sequence_no` of the last event written (transports use it as the resumption id of
        live events), or None when the write failed.

        The usage, when given, enters the ledger whether or not the write commits (the call happened);
        it counts as *persisted* only when its MODEL_TOKEN_USAGE event committed.
        """
        with self._lock:
            self.expected_events += len(events)
            source = next(
                (e.details["source"] for e in events if e.event_type == EventType.MODEL_TOKEN_USAGE), None
            )
            if usage is not None and source is not None:
                self._ledger.add(source, usage)
            for attempt in (1, 2):
                try:
                    self._commit(events, inserts, updates, run_fields)
                except IntegrityError as exc:
                    # Another process wrote this run's timeline (e.g. a sweeper that thought it dead):
                    # reload the chain head once and retry; anything else is an audit failure.
                    if attempt == 1 and self._sequence_taken():
                        self._reload_head()
                        continue
                    self._failed(what, exc)
                    return None
                except DatabaseError as exc:
                    self._failed(what, exc)
                    return None
                if usage is not None and source is not None:
                    self._ledger.persisted_calls += 1
                    self._ledger.persisted_total += (usage.total_tokens or 0) if usage.available else 0
                return self._next_sequence - 1
            return None

    def _commit(
        self,
        events: Sequence[_Event],
        inserts: Sequence[Insert],
        updates: Sequence[Update],
        run_fields: dict[str, Any] | None,
    ) -> None:
        t = _tables()
        seq = self._next_sequence
        prev = self._prev_hash
        op = WriteOp(inserts=list(inserts), updates=list(updates))
        for event in events:
            created_at = timezone.now()
            _, details_json = bound_json_text(event.details)
            summary = clip(event.summary, SUMMARY_CHARS)
            phase, event_type, status = str(event.phase), str(event.event_type), str(event.status)
            digest = sha256_hex(
                prev
                + event_payload_json(
                    run_id=self.run_id,
                    session_id=self.session_id,
                    sequence_no=seq,
                    phase=phase,
                    event_type=event_type,
                    status=status,
                    summary=summary,
                    details_json=details_json,
                    created_at=created_at,
                )
            )
            op.inserts.append(
                Insert(
                    t.event,
                    (
                        self.run_id,
                        self.session_id,
                        seq,
                        phase,
                        event_type,
                        status,
                        summary,
                        # Stored as the hashed canonical text (ASCII-escaped when it holds non-ASCII,
                        # so that any string the JSON module accepts can be stored).
                        RawJSON(details_json if details_json.isascii() else _ascii_json(details_json)),
                        prev,
                        digest,
                        created_at,
                    ),
                )
            )
            prev = digest
            seq += 1
        if run_fields:
            fields = {**run_fields, **self._count_fields()}
            op.updates.append(
                Update(t.run, tuple(fields), tuple(fields.values()), ("run_id",), (self.run_id,))
            )
        self._submit(op)
        self._next_sequence = seq
        self._prev_hash = prev

    def _submit(self, op: WriteOp) -> None:
        """Write `op` durably (group commit when enabled and the caller is in autocommit mode, else
        directly on this thread's connection); raise its database error."""
        if self._group_commit and not connection.in_atomic_block:
            get_committer().submit(op)
        else:
            try:
                execute([op], connection)
            except DatabaseError as exc:
                op.error = exc
        if op.error is not None:
            raise op.error

    def _count_fields(self) -> dict[str, int]:
        return {
            "expected_events": self.expected_events,
            "expected_steps": self.expected_steps,
            "expected_tools": self.expected_tools,
            "audit_write_failures": self.audit_write_failures,
        }

    def _update_run(self, what: str, **fields: Any) -> bool:
        with self._lock:
            fields.update(self._count_fields())
            update = Update(_tables().run, tuple(fields), tuple(fields.values()), ("run_id",), (self.run_id,))
            try:
                self._submit(WriteOp(updates=[update]))
                return True
            except DatabaseError as exc:
                self._failed(what, exc)
                return False

    def _failed(self, what: str, exc: Exception) -> None:
        self.audit_write_failures += 1
        code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
        # Never the message: database errors can quote the values they rejected.
        logger.error(
            "audit write failed run=%s op=%s error=%s code=%s", self.run_id, what, type(exc).__name__, code
        )
        _recover_connection()
        try:
            DiagnosisRun.objects.filter(run_id=self.run_id).update(
                audit_write_failures=F("audit_write_failures") + 1
            )
        except DatabaseError:
            _recover_connection()

    def _sequence_taken(self) -> bool:
        try:
            return TraceEvent.objects.filter(run_id=self.run_id, sequence_no=self._next_sequence).exists()
        except DatabaseError:
            return False

    def _reload_head(self) -> None:
        last = (
            TraceEvent.objects.filter(run_id=self.run_id)
            .order_by("-sequence_no")
            .values_list("sequence_no", "hash")
            .first()
        )
        self._next_sequence, self._prev_hash = (last[0] + 1, last[1]) if last else (1, GENESIS_HASH)

    def _persisted_counts(self) -> dict[str, int]:
        return {
            "events": TraceEvent.objects.filter(run_id=self.run_id).count(),
            "steps": AgentStep.objects.filter(run_id=self.run_id).count(),
            "tools": ToolInvocation.objects.filter(run_id=self.run_id).count(),
        }


def _ascii_json(canonical: str) -> str:
    return json.dumps(json.loads(canonical), sort_keys=True, separators=(",", ":"))


class _Tables:
    """Row layouts of the recorder's tables (every concrete column but the auto primary key)."""

    def __init__(self) -> None:
        self.event = _table(TraceEvent)
        self.step = _table(AgentStep)
        self.reasoning = _table(AgentReasoningAudit)
        self.tool = _table(ToolInvocation)
        self.run = _table(DiagnosisRun)


def _table(model) -> RowTable:
    return RowTable(model, [f.attname for f in model._meta.concrete_fields if not f.primary_key])


@functools.cache
def _tables() -> _Tables:
    return _Tables()


def _ms(delta) -> int:
    return int(delta.total_seconds() * 1000)


def _recover_connection() -> None:
    """After a database error outside any atomic block, drop a broken connection so the next write
    reconnects (a long-running run never passes through Django's request-boundary cleanup)."""
    if not connection.in_atomic_block:
        connection.close_if_unusable_or_obsolete()
