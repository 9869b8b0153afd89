"""The tool lifecycle (seed 002) as the recorder enforces it: declared calls only, each under an id
unique in the run, one RUNNING row committed before the tool executes, one terminal update; a repeated
start is reported (never executed twice), a repeated terminal with the same facts is a no-op, and a
conflict is refused and recorded on the timeline."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.utils import timezone

from audit.models import TOOL_CONFLICT, EventType, Phase, ToolStatus
from audit.payloads import bound_json, bound_text, canonical_json, clip, sha256_hex
from audit.verify import row_digests
from audit.write.chain_writer import _tables
from audit.write.ops import Insert, Update
from audit.write.runtime_facts import (
    ERROR_MESSAGE_CHARS,
    INPUT_STRING_CHARS,
    SUMMARY_CHARS,
    ChainEvent,
    DeclaredToolCall,
    RetrievalFacts,
    ToolCallNotDeclared,
    ToolCallRepeated,
    ToolLifecycleConflict,
)
from diagnosis.models import RunStatus

TOOL_CALL_ID_CHARS = 128
# Tool states that have no terminal yet: executing, or recorded and waiting for a person's decision.
OPEN_TOOL_STATUSES = frozenset({ToolStatus.RUNNING.value, ToolStatus.AWAITING_APPROVAL.value})
# Status of the TOOL_INVOCATION event that records a bare tool error kept until the run's verdict.
ERROR_OBSERVED = "ERROR_OBSERVED"


def arguments_digest(effective_input: Any) -> str:
    """sha256 of the canonical JSON of a call's effective input as recorded (the digest an approval
    names: a decision applies to exactly these arguments)."""
    return sha256_hex(canonical_json(effective_input))


# Room kept for the suffix of a run-unique id (`~s<step>` and, rarely, `.<n>`).
_SUFFIX_CHARS = 24


@dataclass(slots=True)
class _ToolState:
    name: str
    input_key: str
    step_index: int | None
    started_monotonic: float | None
    started_at: Any
    agent_name: str = ""
    input_params: Any = None
    provider_id: str = ""
    status: str = ToolStatus.RUNNING
    terminal_key: tuple | None = None
    # The tool row as last written (column -> value): the start of its terminal image.
    row: dict[str, Any] = field(default_factory=dict)
    # A bare error observed while the run may still be interrupted: (code, message), no terminal yet;
    # the run's verdict decides (seed 002, `tool_error_observed`).
    observed: tuple[str, str] | None = None


def terminal_key(status: str, output_sha256: str | None, error_code: str, error_message: str) -> tuple:
    """The facts a terminal is compared on (as stored: bounded code and message, sha256 of the output)."""
    message = clip(error_message, ERROR_MESSAGE_CHARS)
    return (str(status), output_sha256 or None, clip(error_code, 64), message)


class ToolLifecycle:
    """The tool half of `RunRecorder` (mixed into it; uses its chain writer)."""

    def is_declared(self, tool_call_id: str) -> bool:
        return tool_call_id in self._declared

    def run_unique_calls(
        self, calls: Sequence[DeclaredToolCall], *, step_index: int
    ) -> tuple[DeclaredToolCall, ...]:
        """The calls of step `step_index` under ids unique in the run, the provider's ids kept beside.

        A provider id no earlier call of this run (nor an earlier call of this step) used is kept as the
        run's id; a reused one becomes `<provider id>~s<step_index>` (then `.2`, `.3` … while taken).
        Deterministic: the same calls in the same order get the same ids, also in a resumed recorder.
        """
        with self._lock:
            taken = set(self._declared) | set(self._tools)
            out = []
            for call in calls:
                provider = call.provider_id
                unique = provider
                if unique in taken or len(unique) > TOOL_CALL_ID_CHARS:
                    base = f"{provider[: TOOL_CALL_ID_CHARS - _SUFFIX_CHARS]}~s{step_index}"
                    unique, n = base, 1
                    while unique in taken:
                        n += 1
                        unique = f"{base}.{n}"
                taken.add(unique)
                out.append(
                    DeclaredToolCall(
                        tool_call_id=unique,
                        name=call.name,
                        arguments=call.arguments,
                        provider_tool_call_id=provider,
                    )
                )
            return tuple(out)

    def _new_tool_row(
        self,
        t,
        *,
        tool_call_id,
        tool_name,
        provider_id,
        agent_name,
        step_index,
        status,
        input_params,
        started_at,
        now,
    ) -> Insert:
        """The INSERT of a tool call's first row (RUNNING, or AWAITING_APPROVAL with no start yet)."""
        return Insert(
            t.tool,
            t.tool.row(
                run_id=self.run_id,
                session_id=self.session_id,
                step_id=self._step_ids.get((agent_name, step_index)),
                step_index=step_index,
                agent_name=agent_name,
                tool_call_id=tool_call_id,
                provider_tool_call_id=provider_id,
                tool_name=tool_name,
                status=status,
                input_params=input_params,
                started_at=started_at,
                created_at=now,
                updated_at=now,
            ),
        )  # fmt: skip

    def _starting(
        self, tool_call_id: str, tool_name: str, input_params: dict[str, Any], *, status: str, now: Any
    ) -> _ToolState:
        """What every start of a new call begins with (under the recorder's lock): its effective input as
        recorded (bounded) and the key its facts are compared on, the refusals (`_refuse_start`), then
        the new call's state — its declaring step, the provider's id, `status`, started at `now` when it
        runs (a call awaiting approval has not started)."""
        effective_input = bound_json(input_params, max_string=INPUT_STRING_CHARS)
        input_key = canonical_json(effective_input)
        self._refuse_start(tool_call_id, tool_name, input_key)
        agent_name, step_index = self._declared[tool_call_id]
        return _ToolState(
            name=tool_name,
            input_key=input_key,
            step_index=step_index,
            agent_name=agent_name,
            started_monotonic=None,
            started_at=now if status == ToolStatus.RUNNING else None,
            input_params=effective_input,
            provider_id=self._provider_ids.get(tool_call_id, tool_call_id),
            status=status,
        )

    def _refuse_start(self, tool_call_id: str, tool_name: str, input_key: str) -> None:
        """The refusals every start shares: a repeat (same facts: ToolCallRepeated, nothing written;
        other facts: ToolLifecycleConflict, a CONFLICT event) and an id no recorded step declared
        (ToolCallNotDeclared, a REFUSED event)."""
        existing = self._tools.get(tool_call_id)
        if existing is not None:
            if existing.name == tool_name and existing.input_key == input_key:
                raise ToolCallRepeated(tool_call_id, existing.status)
            self._conflict(
                tool_call_id,
                tool_name,
                "CONFLICTING_START",
                {"recordedStatus": existing.status, "recordedToolName": existing.name},
            )
            raise ToolLifecycleConflict(f"tool call {tool_call_id} was already started with other facts")
        if tool_call_id not in self._declared:
            self._refused(tool_call_id, tool_name, "UNDECLARED_TOOL_CALL", "not declared by a recorded step")
            raise ToolCallNotDeclared(f"tool call {tool_call_id} was not declared by a recorded step")

    def _refused(self, tool_call_id: str, tool_name: str, reason: str, why: str) -> None:
        self._write(
            "tool_refused",
            [
                ChainEvent(
                    Phase.TOOL,
                    EventType.TOOL_INVOCATION,
                    "REFUSED",
                    clip(f"{tool_name} refused: call {tool_call_id} {why}", SUMMARY_CHARS),
                    {"toolCallId": tool_call_id, "toolName": tool_name, "reason": reason},
                )
            ],
        )

    def tool_started(self, *, tool_call_id: str, tool_name: str, input_params: dict[str, Any]) -> int | None:
        """Commit the RUNNING row and its TOOL_INVOCATION event before the tool executes.

        Raises ToolCallNotDeclared when no recorded step of this run declared the id (the refusal is
        itself recorded on the timeline), ToolLifecycleConflict when the id was started with another
        name or input (recorded as a CONFLICT event), ToolCallRepeated when it was started with the same
        facts (nothing is written; the caller must not execute the tool again).
        """
        with self._lock:
            now = timezone.now()
            state = self._starting(tool_call_id, tool_name, input_params, status=ToolStatus.RUNNING, now=now)
            effective_input, agent_name, step_index = state.input_params, state.agent_name, state.step_index
            provider_id = state.provider_id
            self._tools[tool_call_id] = state
            self.expected_tools += 1
            t = _tables()
            row = self._new_tool_row(
                t, tool_call_id=tool_call_id, tool_name=tool_name, provider_id=provider_id,
                agent_name=agent_name, step_index=step_index, status=ToolStatus.RUNNING,
                input_params=effective_input, started_at=now, now=now,
            )  # fmt: skip
            state.row = dict(zip(t.tool.columns, row.values, strict=True))
            sequence_no = self._write(
                "tool_started",
                [
                    ChainEvent(
                        Phase.TOOL,
                        EventType.TOOL_INVOCATION,
                        ToolStatus.RUNNING,
                        clip(f"{tool_name} started ({tool_call_id})", SUMMARY_CHARS),
                        {
                            "toolCallId": tool_call_id,
                            "providerToolCallId": provider_id,
                            "toolName": tool_name,
                            "stepIndex": step_index,
                            "agentName": agent_name,
                            "input": effective_input,
                            "rowForm": row_digests.TOOL.name,
                        },
                        bind={"rowDigest": row},
                    )
                ],
                inserts=[row],
                on_commit=lambda: _start_timing(state),
            )
            # Starting is the moment the executing process begins timing (again once the RUNNING row
            # committed, when it was written with other decisions: `record_together`).
            _start_timing(state)
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
        `finish` or `close_tools`). Same facts again: no-op; different facts, or no start:
        ToolLifecycleConflict, recorded as a CONFLICT event (the first terminal stands)."""
        with self._lock:
            state = self._tools.get(tool_call_id)
            if state is None:
                self._conflict(tool_call_id, "", "NOT_STARTED", {"refusedStatus": str(status)})
                raise ToolLifecycleConflict(f"tool call {tool_call_id} was never started")
            return self._terminate(
                tool_call_id, state, status, output, error_code, error_message, retrieval, summary_note
            )

    def close_tools(
        self, *, status: str, error_code: str = "", error_message: str = "", awaiting: bool = False
    ) -> dict[str, int | None]:
        """Give every still-RUNNING tool (with `awaiting`, every call waiting for approval instead) the
        terminal `status` (e.g. INTERRUPTED on cancel). Returns each closed tool's `tool_call_id` with
        the `sequence_no` of its terminal event (None if the write failed)."""
        which = ToolStatus.AWAITING_APPROVAL if awaiting else ToolStatus.RUNNING
        with self._lock:
            running = [(k, s) for k, s in self._tools.items() if s.status == which]
            # A call whose bare error was observed is closed with that error (the verdict is the run's).
            return {
                tool_call_id: self._terminate(
                    tool_call_id,
                    state,
                    status,
                    None,
                    state.observed[0] if state.observed else error_code,
                    state.observed[1] if state.observed else error_message,
                    None,
                    "",
                )
                for tool_call_id, state in running
            }

    def tool_error_observed(self, *, tool_call_id: str, error_code: str, error_message: str) -> int | None:
        """Seed 002: a bare tool error (the tool raised) observed while the run may still be interrupted
        (a call of the same step waits for approval) is recorded as an observation — a TOOL_INVOCATION
        event ERROR_OBSERVED with `awaitingRunTerminal: true` — and the call keeps no terminal: the run's
        verdict decides. FAILED, CANCELLED and a lease expiry close it with the observed error
        (`close_tools`); an interruption keeps it pending and the resumption runs it again
        (`tool_restarted`); a run that goes on uninterrupted gives it the observed error as its
        terminal (`tool_finished`)."""
        with self._lock:
            state = self._tools.get(tool_call_id)
            if state is None or state.status != ToolStatus.RUNNING:
                raise ToolLifecycleConflict(f"tool call {tool_call_id} is not running")
            code, message = clip(error_code, 64), clip(error_message, ERROR_MESSAGE_CHARS)
            state.observed = (code, message)
            return self._write(
                "tool_error_observed",
                [
                    ChainEvent(
                        Phase.TOOL,
                        EventType.TOOL_INVOCATION,
                        ERROR_OBSERVED,
                        clip(f"{state.name} error observed, awaiting the run's verdict", SUMMARY_CHARS),
                        {
                            "toolCallId": tool_call_id,
                            "toolName": state.name,
                            "errorCode": code,
                            "errorMessage": message,
                            "awaitingRunTerminal": True,
                        },
                    )
                ],
            )

    def tool_restarted(self, *, tool_call_id: str) -> int | None:
        """A call kept pending across an interruption (its bare error observed) runs again in the
        resumed run under its own id: TOOL_INVOCATION RUNNING (`restarted: true`, the row's new start
        bound). Only such a call: anything else raises ToolCallRepeated (never executed twice)."""
        with self._lock:
            state = self._tools.get(tool_call_id)
            if state is None or state.status != ToolStatus.RUNNING or state.observed is None:
                raise ToolCallRepeated(tool_call_id, state.status if state else "")
            now = timezone.now()
            fields = {"started_at": now, "updated_at": now}
            t = _tables()
            image = {**state.row, **fields}
            seq = self._write(
                "tool_restarted",
                [
                    ChainEvent(
                        Phase.TOOL,
                        EventType.TOOL_INVOCATION,
                        ToolStatus.RUNNING,
                        clip(
                            f"{state.name} started again after the resumption ({tool_call_id})", SUMMARY_CHARS
                        ),
                        {
                            "toolCallId": tool_call_id,
                            "providerToolCallId": state.provider_id or tool_call_id,
                            "toolName": state.name,
                            "stepIndex": state.step_index,
                            "agentName": state.agent_name,
                            "input": state.input_params,
                            "restarted": True,
                            "rowForm": row_digests.TOOL.name,
                        },
                        bind={"rowDigest": Insert(t.tool, t.tool.row(**image))},
                    )
                ],
                updates=[
                    Update(
                        t.tool,
                        tuple(fields),
                        tuple(fields.values()),
                        ("run_id", "tool_call_id", "status"),
                        (self.run_id, tool_call_id, ToolStatus.RUNNING.value),
                    )
                ],
            )
            state.observed = None
            state.row = image
            state.started_at = now
            state.started_monotonic = time.monotonic()
            return seq

    def _close_dangling_tools(self, run_status: str) -> None:
        closing = {
            RunStatus.FAILED.value: (ToolStatus.FAILED, "RUN_FAILED"),
            RunStatus.CANCELLED.value: (ToolStatus.INTERRUPTED, "RUN_CANCELLED"),
        }.get(str(run_status), (ToolStatus.ABANDONED, "RUN_ENDED"))
        self.close_tools(
            status=closing[0], error_code=closing[1], error_message="the run ended while the tool was running"
        )
        # Seed 002: a pending call the run's terminal verdict closes (FAILED, CANCELLED, lease expiry).
        self.close_tools(
            status=closing[0],
            error_code=closing[1],
            error_message="the run ended while the call waited for approval",
            awaiting=True,
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
        key = terminal_key(status, bounded.sha256 if bounded else None, error_code, error_message)
        if state.status not in OPEN_TOOL_STATUSES:
            if state.terminal_key == key:
                return
            self._conflict(
                tool_call_id,
                state.name,
                "CONFLICTING_TERMINAL",
                {
                    "recordedStatus": state.status,
                    "refusedStatus": str(status),
                    "refusedOutputSha256": bounded.sha256 if bounded else None,
                    "refusedErrorCode": error_code or None,
                },
            )
            raise ToolLifecycleConflict(f"tool call {tool_call_id} already ended as {state.status}")
        now = timezone.now()
        duration_ms = (
            int((time.monotonic() - state.started_monotonic) * 1000)
            if state.started_monotonic is not None
            else None
        )
        prior = str(state.status)
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
            "providerToolCallId": state.provider_id or tool_call_id,
            "toolName": state.name,
            "stepIndex": state.step_index,
            "agentName": state.agent_name or None,
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
        # The RUNNING row may never have committed (an earlier audit write failed): then the row the
        # terminal update would have produced is inserted instead (real input included), so the terminal
        # facts are kept and the one terminal digest verifies whichever way the row was written.
        terminal_row = {**state.row, **fields}
        fallback = Insert(t.tool, t.tool.row(**terminal_row))
        state.row = terminal_row
        update = Update(
            t.tool,
            tuple(fields),
            tuple(fields.values()),
            ("run_id", "tool_call_id", "status"),
            (self.run_id, tool_call_id, prior),
            fallback=fallback,
        )

        return self._write(
            "tool_finished",
            [
                ChainEvent(
                    Phase.TOOL,
                    EventType.TOOL_INVOCATION,
                    status,
                    clip(", ".join(parts), SUMMARY_CHARS),
                    {**details, "rowForm": row_digests.TOOL.name},
                    bind={"rowDigest": fallback},
                )
            ],
            updates=[update],
        )

    def _conflict(self, tool_call_id: str, tool_name: str, reason: str, facts: dict[str, Any]) -> None:
        """Record a refused lifecycle step as a CONFLICT event (the refusal itself is raised by the
        caller); the recorded row is left as it is."""
        self._write(
            "tool_conflict",
            [
                ChainEvent(
                    Phase.TOOL,
                    EventType.TOOL_INVOCATION,
                    TOOL_CONFLICT,
                    clip(
                        f"{tool_name or 'tool'} {reason.lower().replace('_', ' ')} refused ({tool_call_id})",
                        SUMMARY_CHARS,
                    ),
                    {"toolCallId": tool_call_id, "toolName": tool_name, "reason": reason, **facts},
                )
            ],
        )


def _start_timing(state: _ToolState) -> None:
    state.started_monotonic = time.monotonic()
