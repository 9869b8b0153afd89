"""The tool lifecycle (seed 002) as the recorder enforces it: declared calls only, each under an id
unique in the run, one RUNNING row committed before the tool executes, one terminal update; a repeated
start is reported (never executed twice), a repeated terminal with the same facts is a no-op, and a
conflict is refused and recorded on the timeline."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from django.utils import timezone

from audit.models import (
    CHAT_AGENT_NAME,
    TOOL_CONFLICT,
    AgentStep,
    EventType,
    Phase,
    ToolInvocation,
    ToolStatus,
    TraceEvent,
)
from audit.payloads import BoundedText, bound_json, bound_text, canonical_json, clip
from audit.verify import row_digests
from audit.write.chain_writer import RunChain
from audit.write.ops import Insert, Update
from audit.write.rows import tables
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
from audit.write.tool_facts import (
    ERROR_OBSERVED,
    OPEN_TOOL_STATUSES,
    ToolState,
    terminal_event,
    terminal_fields,
    terminal_key,
)
from diagnosis.models import RunStatus

TOOL_CALL_ID_CHARS = 128
# Room kept for the suffix of a run-unique id (`~s<step>` and, rarely, `.<n>`).
_SUFFIX_CHARS = 24


class ToolCalls:
    """The recorder's tool part (`recorder.tools`): the calls the run's model steps declared (with the
    provider's ids and the declaring step's row id) and the state of every call started, written through
    the run's chain."""

    def __init__(self, chain: RunChain) -> None:
        self.chain = chain
        self.run_id = chain.run_id
        self.session_id = chain.session_id
        # tool_call_id -> the declaring step, (agent_name, step_index); and the provider's id of each.
        self.declared: dict[str, tuple[str, int]] = {}
        self.provider_ids: dict[str, str] = {}
        # (agent_name, step_index) -> the step row's id, once that step committed.
        self.step_ids: dict[tuple[str, int], int] = {}
        # tool_call_id -> the state of every call started (or waiting for approval).
        self.calls: dict[str, ToolState] = {}

    def declare(self, calls: Sequence[DeclaredToolCall], *, agent_name: str, step_index: int) -> None:
        """The tool calls a model step declares: their starts are accepted from now on."""
        for call in calls:
            self.declared[call.tool_call_id] = (agent_name, step_index)
            self.provider_ids[call.tool_call_id] = call.provider_id

    def restore(self) -> Any:
        """Rebuild the state of a run taken over from what is stored (`RunRecorder.resume`): the steps'
        declared calls (with the provider's ids) and row ids, the tool states (with their input and
        terminal facts, so that a conflicting terminal is still refused; started elsewhere, so their
        duration stays unknown), and the bare errors observed and kept until the run's verdict (seed
        002: the last event of such a call is its ERROR_OBSERVED). Returns the latest end of a stored
        step (the answer's last token so far), or None."""
        last_token_at = None
        for agent_name, step_index, step_id, ids, output, finished_at in AgentStep.objects.filter(
            run_id=self.run_id
        ).values_list("agent_name", "step_index", "id", "tool_call_ids", "model_output", "finished_at"):
            self.step_ids[(agent_name, step_index)] = step_id
            if finished_at is not None and (last_token_at is None or finished_at > last_token_at):
                last_token_at = finished_at
            for tool_call_id in ids or []:
                self.declared[tool_call_id] = (agent_name, step_index)
            for call in (output or {}).get("toolCalls") or []:
                if isinstance(call, dict) and call.get("providerToolCallId"):
                    self.provider_ids[str(call.get("id"))] = str(call["providerToolCallId"])
        columns = tables().tool.columns
        for tool in ToolInvocation.objects.filter(run_id=self.run_id):
            self.calls[tool.tool_call_id] = ToolState(
                name=tool.tool_name,
                input_key=canonical_json(tool.input_params),
                step_index=tool.step_index,
                agent_name=tool.agent_name or CHAT_AGENT_NAME,
                started_monotonic=None,
                started_at=tool.started_at,
                input_params=tool.input_params,
                provider_id=tool.provider_tool_call_id or tool.tool_call_id,
                status=tool.status,
                terminal_key=(
                    None
                    if tool.status in OPEN_TOOL_STATUSES
                    else terminal_key(tool.status, tool.output_sha256, tool.error_code, tool.error_message)
                ),
                row={c: getattr(tool, c) for c in columns},
            )
        last: dict[str, tuple[str, dict]] = {}
        for status, details in (
            TraceEvent.objects.filter(run_id=self.run_id, event_type=EventType.TOOL_INVOCATION)
            .order_by("sequence_no")
            .values_list("status", "details")
        ):
            if isinstance(details, dict) and details.get("toolCallId"):
                last[str(details["toolCallId"])] = (status, details)
        for tool_call_id, (status, details) in last.items():
            state = self.calls.get(tool_call_id)
            if status == ERROR_OBSERVED and state is not None and state.status == ToolStatus.RUNNING:
                state.observed = (str(details.get("errorCode") or ""), str(details.get("errorMessage") or ""))
        return last_token_at

    def is_declared(self, tool_call_id: str) -> bool:
        return tool_call_id in self.declared

    def any_failed(self) -> bool:
        """Whether a call of this run (this recorder's or, resumed, an earlier attempt's) ended FAILED:
        then the release reads the chain's failed calls (`audit.failed_calls`)."""
        with self.chain.lock:
            return any(state.status == ToolStatus.FAILED for state in self.calls.values())

    def run_unique_calls(
        self, calls: Sequence[DeclaredToolCall], *, step_index: int
    ) -> tuple[DeclaredToolCall, ...]:
        """The calls of step `step_index` under ids unique in the run, the provider's ids kept beside.

        A provider id no earlier call of this run (nor an earlier call of this step) used is kept as the
        run's id; a reused one becomes `<provider id>~s<step_index>` (then `.2`, `.3` … while taken).
        Deterministic: the same calls in the same order get the same ids, also in a resumed recorder.
        """
        with self.chain.lock:
            taken = set(self.declared) | set(self.calls)
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

    def new_row(
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
                step_id=self.step_ids.get((agent_name, step_index)),
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

    def starting(
        self, tool_call_id: str, tool_name: str, input_params: dict[str, Any], *, status: str, now: Any
    ) -> ToolState:
        """What every start of a new call begins with (under the recorder's lock): its effective input as
        recorded (bounded) and the key its facts are compared on, the refusals (`_refuse_start`), then
        the new call's state — its declaring step, the provider's id, `status`, started at `now` when it
        runs (a call awaiting approval has not started)."""
        effective_input = bound_json(input_params, max_string=INPUT_STRING_CHARS)
        input_key = canonical_json(effective_input)
        self._refuse_start(tool_call_id, tool_name, input_key)
        agent_name, step_index = self.declared[tool_call_id]
        return ToolState(
            name=tool_name,
            input_key=input_key,
            step_index=step_index,
            agent_name=agent_name,
            started_monotonic=None,
            started_at=now if status == ToolStatus.RUNNING else None,
            input_params=effective_input,
            provider_id=self.provider_ids.get(tool_call_id, tool_call_id),
            status=status,
        )

    def _refuse_start(self, tool_call_id: str, tool_name: str, input_key: str) -> None:
        """The refusals every start shares: a repeat (same facts: ToolCallRepeated, nothing written;
        other facts: ToolLifecycleConflict, a CONFLICT event) and an id no recorded step declared
        (ToolCallNotDeclared, a REFUSED event)."""
        existing = self.calls.get(tool_call_id)
        if existing is not None:
            if existing.name == tool_name and existing.input_key == input_key:
                raise ToolCallRepeated(tool_call_id, existing.status)
            self.conflict(
                tool_call_id,
                tool_name,
                "CONFLICTING_START",
                {"recordedStatus": existing.status, "recordedToolName": existing.name},
            )
            raise ToolLifecycleConflict(f"tool call {tool_call_id} was already started with other facts")
        if tool_call_id not in self.declared:
            self.refused(tool_call_id, tool_name, "UNDECLARED_TOOL_CALL", "not declared by a recorded step")
            raise ToolCallNotDeclared(f"tool call {tool_call_id} was not declared by a recorded step")

    def refused(self, tool_call_id: str, tool_name: str, reason: str, why: str) -> None:
        self.chain.write(
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
        with self.chain.lock:
            now = timezone.now()
            state = self.starting(tool_call_id, tool_name, input_params, status=ToolStatus.RUNNING, now=now)
            effective_input, agent_name, step_index = state.input_params, state.agent_name, state.step_index
            provider_id = state.provider_id
            self.calls[tool_call_id] = state
            self.chain.expected_tools += 1
            t = tables()
            row = self.new_row(
                t, tool_call_id=tool_call_id, tool_name=tool_name, provider_id=provider_id,
                agent_name=agent_name, step_index=step_index, status=ToolStatus.RUNNING,
                input_params=effective_input, started_at=now, now=now,
            )  # fmt: skip
            state.row = dict(zip(t.tool.columns, row.values, strict=True))
            sequence_no = self.chain.write(
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
        with self.chain.lock:
            state = self.calls.get(tool_call_id)
            if state is None:
                self.conflict(tool_call_id, "", "NOT_STARTED", {"refusedStatus": str(status)})
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
        with self.chain.lock:
            running = [(k, s) for k, s in self.calls.items() if s.status == which]
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
        with self.chain.lock:
            state = self.calls.get(tool_call_id)
            if state is None or state.status != ToolStatus.RUNNING:
                raise ToolLifecycleConflict(f"tool call {tool_call_id} is not running")
            code, message = clip(error_code, 64), clip(error_message, ERROR_MESSAGE_CHARS)
            state.observed = (code, message)
            return self.chain.write(
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
        with self.chain.lock:
            state = self.calls.get(tool_call_id)
            if state is None or state.status != ToolStatus.RUNNING or state.observed is None:
                raise ToolCallRepeated(tool_call_id, state.status if state else "")
            now = timezone.now()
            fields = {"started_at": now, "updated_at": now}
            t = tables()
            image = {**state.row, **fields}
            seq = self.chain.write(
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

    def close_dangling(self, run_status: str) -> None:
        """The run ends (`finish`): close what still runs or waits for approval, with the terminal
        status the run's ending gives it."""
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
        state: ToolState,
        status: str,
        output: str | None,
        error_code: str,
        error_message: str,
        retrieval: RetrievalFacts | None,
        summary_note: str,
    ) -> int | None:
        """A call's one terminal: refused when it ended already with other facts (a no-op with the
        same), else its row's terminal update and its TOOL_INVOCATION event, written together."""
        bounded = bound_text(output) if output is not None else None
        key = terminal_key(status, bounded.sha256 if bounded else None, error_code, error_message)
        if state.status not in OPEN_TOOL_STATUSES:
            if state.terminal_key == key:
                return None
            self._refuse_terminal(tool_call_id, state, status, bounded, error_code)
        now = timezone.now()
        duration_ms = (
            int((time.monotonic() - state.started_monotonic) * 1000)
            if state.started_monotonic is not None
            else None
        )
        prior = str(state.status)
        state.status = status
        state.terminal_key = key
        fields = terminal_fields(status, now, duration_ms, bounded, error_code, error_message, retrieval)
        t = tables()
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
        event = terminal_event(
            tool_call_id, state, status, duration_ms, bounded, error_code, retrieval, summary_note, fallback
        )
        return self.chain.write("tool_finished", [event], updates=[update])

    def _refuse_terminal(
        self, tool_call_id: str, state: ToolState, status: str, bounded: BoundedText | None, error_code: str
    ) -> None:
        """A second terminal with other facts than the first: a CONFLICT event, and the refusal raised."""
        self.conflict(
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

    def conflict(self, tool_call_id: str, tool_name: str, reason: str, facts: dict[str, Any]) -> None:
        """Record a refused lifecycle step as a CONFLICT event (the refusal itself is raised by the
        caller); the recorded row is left as it is."""
        self.chain.write(
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


def _start_timing(state: ToolState) -> None:
    state.started_monotonic = time.monotonic()
