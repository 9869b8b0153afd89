"""The tool boundary: every tool call of the agent passes here, through the audited lifecycle (seed 002).

`ToolBoundary.run` takes a step's declared calls (concurrently): each is validated, recorded RUNNING
before it runs (an undeclared call or a repeat never runs), run under its timeout and the cancel token,
and ends in one recorded terminal: SUCCEEDED only once its full result is in the canonical store, else
FAILED with a code and a bounded message (a refused terminal never stops the run); the model gets the
bounded `model_content` or `{"error": …}`. A tool that `requires_approval` runs only once approved
(AWAITING_APPROVAL, `run_decided`); in a replay never (FAILED `NOT_EXECUTED_REPLAY`, `agent.runtime.replay`).
Details: docs/runtime.md, *Tool boundary*; docs/aiops.md, *Approvals* (`rerun_pending`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import DatabaseError

from agent.redaction import Redactor
from agent.runtime.approval_checks import approved_call_problem
from agent.runtime.approvals import APPROVED, EXPIRED, approval_request
from agent.runtime.cancel import RunCancelled
from agent.runtime.canonical import CanonicalUnavailable
from agent.runtime.context import RunContext
from agent.runtime.db import db, run_blocking
from agent.runtime.events import ToolEvent
from agent.runtime.replay import NOT_EXECUTED_REPLAY
from agent.runtime.tools.registry import EvidenceRecord, ToolArgumentsError, ToolResult, ToolSpec
from audit.models import ToolStatus
from audit.payloads import canonical_json, clip
from audit.write import DeclaredToolCall, ToolCallNotDeclared, ToolCallRepeated, ToolLifecycleConflict

logger = logging.getLogger(__name__)

TOOL_ERROR = "TOOL_ERROR"
TOOL_TIMEOUT = "TOOL_TIMEOUT"
TOOL_REFUSED = "TOOL_REFUSED"
TOOL_BAD_ARGUMENTS = "TOOL_BAD_ARGUMENTS"
TOOL_REPEATED = "TOOL_REPEATED"
APPROVAL_REJECTED = "APPROVAL_REJECTED"
APPROVAL_EXPIRED = "APPROVAL_EXPIRED"
APPROVAL_UNRECORDED = "APPROVAL_UNRECORDED"
# An approved call whose tool this process cannot offer when the run resumes (e.g. its MCP server is down).
TOOL_UNAVAILABLE = "TOOL_UNAVAILABLE"
ERROR_OBSERVED = "ERROR_OBSERVED"

ERROR_MESSAGE_CHARS = 300
MODEL_CONTENT_CHARS = 12000


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """One call's result as the agent loop needs it: the tool message for the model and the status."""

    call: DeclaredToolCall
    status: str
    content: str
    error_code: str = ""

    def message(self) -> dict[str, Any]:
        # The provider pairs the result with its call by the id it sent (not the run-unique one).
        return {"role": "tool", "tool_call_id": self.call.provider_id, "content": self.content}


class _Timeout(Exception):
    pass


@dataclass(frozen=True, slots=True)
class _Checked:
    """A call as checked before it starts: its tool (None: unknown), validated arguments (None: invalid,
    `argument_error` says why), the input recorded, and whether it asks for a person's approval."""

    spec: ToolSpec | None
    arguments: dict[str, Any] | None
    argument_error: str
    input: dict[str, Any]
    approval: bool


def _error_content(code: str, message: str) -> str:
    return json.dumps({"error": {"code": code, "message": message}}, ensure_ascii=False)


def _exception_message(exc: BaseException) -> str:
    """A bounded, content-safe description of a tool's exception."""
    if isinstance(exc, DatabaseError):
        return f"{type(exc).__name__} (database error)"  # never the message: it may quote values
    text = str(exc).strip()
    return clip(f"{type(exc).__name__}: {text}" if text else type(exc).__name__, ERROR_MESSAGE_CHARS)


def _normalise(raw: Any) -> ToolResult:
    return raw if isinstance(raw, ToolResult) else ToolResult(data=raw)


class ToolBoundary:
    """Runs one model step's tool calls through the lifecycle above, for one run."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.may_interrupt = False

    async def run(self, calls: Sequence[DeclaredToolCall]) -> list[ToolOutcome]:
        self.ctx.token.raise_if_cancelled()
        # A step with a call that will ask for approval may end in an interruption: its other calls'
        # bare errors then wait for the run's verdict (seed 002; `_observe`).
        self.may_interrupt = self.ctx.asks_approvals and any(self._asks_approval(c) for c in calls)
        checked = [self._checked(call) for call in calls]
        # Arguments are redacted (agent.redaction) before anything records or executes them.
        await self.ctx.record_redaction("tool_input")
        started = await self._start(calls, checked)
        results = await asyncio.gather(
            *(self._run_one(c, k, r) for c, k, r in zip(calls, checked, started, strict=True)),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, RunCancelled):
                raise result
        for result in results:
            if isinstance(result, BaseException):
                raise result
        self.ctx.token.raise_if_cancelled()
        outcomes = list(results)
        if not any(o.status == ToolStatus.AWAITING_APPROVAL for o in outcomes):
            # No interruption after all: an observed error becomes the call's terminal now.
            outcomes = [await self._settle(o) if o.status == ERROR_OBSERVED else o for o in outcomes]
        return outcomes

    def _asks_approval(self, call: DeclaredToolCall) -> bool:
        spec = self.ctx.registry.get(call.name)
        if spec is None or not spec.requires_approval:
            return False
        try:
            spec.validate(call.arguments)
        except ToolArgumentsError:
            return False
        return True

    async def _observe(self, call: DeclaredToolCall, code: str, message: str) -> ToolOutcome:
        """A bare tool error while the run may still be interrupted: recorded as an observation, no
        terminal (the run's verdict decides: `recorder.tool_error_observed`)."""
        try:
            await db(
                self.ctx.recorder.tool_error_observed,
                tool_call_id=call.tool_call_id,
                error_code=code,
                error_message=message,
            )
        except ToolLifecycleConflict:
            return await self._fail(call, code, message)
        return ToolOutcome(call, ERROR_OBSERVED, _error_content(code, message), code)

    async def _settle(self, outcome: ToolOutcome) -> ToolOutcome:
        """The run went on uninterrupted: the observed error is the call's FAILED terminal."""
        message = json.loads(outcome.content)["error"]["message"]
        return await self._fail(outcome.call, outcome.error_code, message)

    async def rerun_pending(self, call: DeclaredToolCall) -> ToolOutcome:
        """In the resumed run: a call the interruption kept pending (its bare error observed) runs again
        under its own id (`recorder.tool_restarted`), once."""
        ctx = self.ctx
        spec = ctx.registry.get(call.name)
        try:
            if spec is None:
                raise ToolArgumentsError("unknown tool")
            arguments = ctx.redactor.redact_value(spec.validate(call.arguments))
            seq = await db(ctx.recorder.tool_restarted, tool_call_id=call.tool_call_id)
        except (ToolArgumentsError, ToolCallRepeated) as exc:
            logger.warning(
                "pending rerun refused run=%s tool=%s error=%s", ctx.run_id, call.name, type(exc).__name__
            )
            message = "the tool call could not be run again"
            return ToolOutcome(call, "REFUSED", _error_content(TOOL_REFUSED, message), TOOL_REFUSED)
        ctx.running_tools[call.tool_call_id] = call.name
        await self._emit(call, ToolStatus.RUNNING, seq)
        self.may_interrupt = False
        return await self._execute_started(call, spec, arguments)

    async def _emit(self, call: DeclaredToolCall, status: str, sequence_no: int | None) -> None:
        await self.ctx.sink.emit(
            ToolEvent(
                run_id=self.ctx.run_id,
                tool_call_id=call.tool_call_id,
                name=call.name,
                status=status,
                sequence_no=sequence_no,
            )
        )

    async def _terminal(self, call: DeclaredToolCall, status: str, **facts: Any) -> None:
        """Record the call's terminal and emit its live frame. A terminal the recorder refuses as a
        conflict (recorded there as a CONFLICT event) is logged and never stops the run."""
        try:
            seq = await db(
                self.ctx.recorder.tool_finished, tool_call_id=call.tool_call_id, status=status, **facts
            )
        except ToolLifecycleConflict as exc:
            seq = exc
        await self._terminated(call, status, seq)

    async def _terminated(self, call: DeclaredToolCall, status: str, seq: int | Exception | None) -> None:
        """After the call's terminal write (`seq`: its sequence, or the conflict that refused it)."""
        if isinstance(seq, ToolLifecycleConflict):
            run_id, error = self.ctx.run_id, type(seq).__name__
            logger.warning("tool terminal refused run=%s tool=%s error=%s", run_id, call.name, error)
            seq = None
        self.ctx.running_tools.pop(call.tool_call_id, None)
        await self._emit(call, status, seq)

    async def _fail(self, call: DeclaredToolCall, code: str, message: str) -> ToolOutcome:
        await self._terminal(call, ToolStatus.FAILED, error_code=code, error_message=message)
        return ToolOutcome(call, ToolStatus.FAILED, _error_content(code, message), code)

    def _checked(self, call: DeclaredToolCall) -> _Checked:
        """The call's tool, its validated arguments (or why they are invalid) and the input recorded."""
        spec = self.ctx.registry.get(call.name)
        arguments: dict[str, Any] | None = None
        argument_error = ""
        if spec is not None:
            try:
                arguments = spec.validate(call.arguments)
            except ToolArgumentsError as exc:
                argument_error = clip(str(exc), ERROR_MESSAGE_CHARS)
        approval = arguments is not None and spec.requires_approval and self.ctx.asks_approvals
        redact = self.ctx.redactor.redact_value
        if arguments is not None:
            arguments = redact(arguments)
            input_params: dict[str, Any] = arguments
        else:
            try:
                parsed = json.loads(call.arguments) if call.arguments.strip() else {}
            except ValueError:
                parsed = None
            input_params = redact(parsed if isinstance(parsed, dict) else {"arguments": call.arguments})
            argument_error = self.ctx.redactor.redact(argument_error)
        return _Checked(spec, arguments, argument_error, input_params, approval)

    async def _start(self, calls: Sequence[DeclaredToolCall], checked: Sequence[_Checked]) -> list[Any]:
        """The RUNNING rows of the step's calls that start now (not those asking for approval), in the
        order of the calls and in one transaction (`recorder.record_together`), committed before any of
        them runs: per call, the sequence number of its start (None when not written, or not started
        here) or the refusal raised."""
        rec = self.ctx.recorder
        writes = [
            (rec.tool_started, {"tool_call_id": c.tool_call_id, "tool_name": c.name, "input_params": k.input})
            for c, k in zip(calls, checked, strict=True)
            if not k.approval
        ]
        results = iter(await db(rec.record_together, writes) if writes else ())
        return [None if k.approval else next(results) for k in checked]

    async def _run_one(self, call: DeclaredToolCall, checked: _Checked, started: Any) -> ToolOutcome:
        ctx = self.ctx
        spec, arguments, argument_error = checked.spec, checked.arguments, checked.argument_error
        if checked.approval:
            return await self._request_approval(call, arguments)
        if isinstance(started, (ToolCallNotDeclared, ToolLifecycleConflict)):
            # Fail-closed: the tool never runs (the recorder recorded the refusal where it applies).
            code = TOOL_REFUSED
            logger.warning(
                "tool start refused run=%s tool=%s error=%s", ctx.run_id, call.name, type(started).__name__
            )
            return ToolOutcome(call, "REFUSED", _error_content(code, "the tool call was refused"), code)
        if isinstance(started, ToolCallRepeated):
            # The call was started before (its record stands): it is never executed a second time.
            logger.warning(
                "tool start repeated run=%s tool=%s status=%s", ctx.run_id, call.name, started.status
            )
            message = "the tool call was already started; it is not run again"
            return ToolOutcome(call, "REFUSED", _error_content(TOOL_REPEATED, message), TOOL_REPEATED)
        if isinstance(started, BaseException):
            raise started
        seq = started
        ctx.running_tools[call.tool_call_id] = call.name
        await self._emit(call, ToolStatus.RUNNING, seq)

        if spec is None:
            return await self._fail(call, TOOL_REFUSED, f"unknown tool {clip(call.name, 80)!r}")
        if arguments is None:
            return await self._fail(call, TOOL_BAD_ARGUMENTS, argument_error or "invalid arguments")
        if spec.changes_world and ctx.replay is not None:
            return await self._not_executed(call, arguments)
        if spec.requires_approval:
            # Reached only where no approval may be asked (ctx.approvals_allowed is off: the repair
            # round, the chat): the call is refused, never executed unapproved.
            message = "this tool requires a person's approval, which cannot be asked at this point"
            return await self._fail(call, TOOL_REFUSED, message)
        return await self._execute_started(call, spec, arguments)

    async def _not_executed(self, call: DeclaredToolCall, arguments: dict[str, Any]) -> ToolOutcome:
        """A replay's call of a tool that changes the world, started: never executed. Its terminal is
        FAILED `NOT_EXECUTED_REPLAY`, saying whether the source run's recorded outcome was replayed."""
        replay = self.ctx.replay
        assert replay is not None
        recorded = await db(replay.recorded, call.name, arguments)
        message, content = replay.account(call.name, recorded)
        await self._terminal(call, ToolStatus.FAILED, error_code=NOT_EXECUTED_REPLAY, error_message=message)
        return ToolOutcome(call, ToolStatus.FAILED, clip(content, MODEL_CONTENT_CHARS), NOT_EXECUTED_REPLAY)

    async def _request_approval(self, call: DeclaredToolCall, arguments: dict[str, Any]) -> ToolOutcome:
        """Record the call AWAITING_APPROVAL with APPROVAL_REQUESTED (nothing executes); the run is then
        interrupted by the agent loop. A request whose record did not commit does not exist: the model
        gets an error instead and the run goes on without the call."""
        ctx = self.ctx
        spec = ctx.registry.get(call.name)
        approvers, deadline_rule = await db(approval_request, session_id=ctx.session_id)
        try:
            seq = await db(
                ctx.recorder.tool_awaiting_approval,
                tool_call_id=call.tool_call_id,
                tool_name=call.name,
                input_params=arguments,
                approvers=approvers,
                deadline=deadline_rule,
                action=spec.action(arguments) if spec is not None and spec.action is not None else None,
            )
        except (ToolCallNotDeclared, ToolLifecycleConflict, ToolCallRepeated) as exc:
            logger.warning(
                "approval request refused run=%s tool=%s error=%s", ctx.run_id, call.name, type(exc).__name__
            )
            return ToolOutcome(
                call, "REFUSED", _error_content(TOOL_REFUSED, "the tool call was refused"), TOOL_REFUSED
            )
        if seq is None:
            message = "the approval request could not be recorded; the call was not made"
            return ToolOutcome(
                call, ToolStatus.FAILED, _error_content(APPROVAL_UNRECORDED, message), APPROVAL_UNRECORDED
            )
        await self._emit(call, ToolStatus.AWAITING_APPROVAL, seq - 1)
        await ctx.flush_progress()
        return ToolOutcome(call, ToolStatus.AWAITING_APPROVAL, "")

    async def run_decided(self, call: DeclaredToolCall, decision: dict[str, Any]) -> ToolOutcome:
        """A call that waited for approval, once decided (`decision`: the APPROVAL_DECIDED details).
        Approved: checked again first (`approval_checks.approved_call_problem`: still current, in time,
        the approver still allowed; else FAILED with its code and why, never made); then started under
        its own `tool_call_id` (the recorder checks the declaring step and the approved digest,
        fail-closed) and executed exactly once. Rejected or expired: its recorded refusal (FAILED with
        APPROVAL_REJECTED / APPROVAL_EXPIRED) is the tool's result."""
        ctx = self.ctx
        spec = ctx.registry.get(call.name)
        verdict = str(decision.get("decision") or "")
        if verdict == APPROVED and spec is None:
            # Approved, but this process cannot run it (an MCP server that is down or no longer offers
            # the tool): never made, and never recorded as somebody's rejection.
            message = "the approved tool is not available now (its server is down or no longer offers it)"
            return await self._fail(call, TOOL_UNAVAILABLE, f"{message}; the call was not made")
        if verdict != APPROVED:
            code = APPROVAL_EXPIRED if verdict == EXPIRED else APPROVAL_REJECTED
            who = decision.get("decidedBy")
            message = (
                "the approval request expired before anyone decided; the call was not made"
                if verdict == EXPIRED
                else f"a person ({who or 'unknown'}) rejected the call; it was not made"
            )
            note = str(decision.get("note") or "")
            if note:
                message += f". Note: {note}"
            message = clip(message, ERROR_MESSAGE_CHARS)
            return await self._fail(call, code, message)
        # Checked again now (issues 43, 45): the call still waits with the approved arguments and target,
        # the deadline has not passed, the approver still holds the right; else it is never made.
        problem = await db(
            approved_call_problem,
            run_id=ctx.run_id,
            tool_call_id=call.tool_call_id,
            decision=decision,
            action_now=lambda: spec.action(spec.validate(call.arguments)) if spec.action else None,
        )
        if problem is not None:
            code, why = problem
            return await self._fail(call, code, clip(f"{why}; the call was not made", ERROR_MESSAGE_CHARS))
        try:
            arguments = ctx.redactor.redact_value(spec.validate(call.arguments))
            seq = await db(
                ctx.recorder.approved_tool_started,
                tool_call_id=call.tool_call_id,
                tool_name=call.name,
                input_params=arguments,
                approved_digest=str(decision.get("argumentsDigest") or ""),
            )
        except (ToolArgumentsError, ToolCallNotDeclared, ToolLifecycleConflict, ToolCallRepeated) as exc:
            logger.warning(
                "approved start refused run=%s tool=%s error=%s", ctx.run_id, call.name, type(exc).__name__
            )
            return ToolOutcome(
                call, "REFUSED", _error_content(TOOL_REFUSED, "the tool call was refused"), TOOL_REFUSED
            )
        ctx.running_tools[call.tool_call_id] = call.name
        await self._emit(call, ToolStatus.RUNNING, seq)
        return await self._execute_started(call, spec, arguments)

    async def _execute_started(
        self, call: DeclaredToolCall, spec: ToolSpec, arguments: dict[str, Any]
    ) -> ToolOutcome:
        """Execute a started call and record its terminal (steps 3–6 of the module docstring)."""
        ctx = self.ctx
        ctx.token.raise_if_cancelled()
        timeout = spec.timeout if spec.timeout is not None else float(settings.TOOL_TIMEOUT)
        try:
            raw = await self._execute(spec, arguments, timeout)
            # On the tool pool: a large output takes long to scan, the event loop must not wait.
            result, taken = await run_blocking(self._redacted, _normalise(raw))
            result_json = canonical_json(result.data)
        except RunCancelled:
            raise
        except _Timeout:
            return await self._fail(call, TOOL_TIMEOUT, f"the tool did not finish within {timeout:g} s")
        except Exception as exc:
            logger.warning("tool failed run=%s tool=%s error=%s", ctx.run_id, call.name, type(exc).__name__)
            with ctx.redactor.lock:
                message, taken = ctx.redactor.redact(_exception_message(exc)), ctx.redactor.take()
            await ctx.record_redaction("tool_output", tool_call_id=call.tool_call_id, facts=taken)
            if self.may_interrupt:
                return await self._observe(call, TOOL_ERROR, message)
            return await self._fail(call, TOOL_ERROR, message)
        # This call's facts only (parallel calls share the redactor, so the same secret keeps one
        # placeholder across them).
        await ctx.record_redaction("tool_output", tool_call_id=call.tool_call_id, facts=taken)

        kept, seq = await db(
            _keep_then_succeed,
            ctx,
            call.tool_call_id,
            result_json,
            {record.id: dict(record.payload) for record in result.evidence},
            result.retrieval,
        )
        if kept:
            ctx.gathered_evidence.extend(record.id for record in result.evidence)
        else:
            ctx.canonical_degraded = True
        await self._terminated(call, ToolStatus.SUCCEEDED, seq)
        content = result.model_content if result.model_content is not None else result_json
        return ToolOutcome(call, ToolStatus.SUCCEEDED, clip(content, MODEL_CONTENT_CHARS))

    def _redacted(self, result: ToolResult) -> tuple[ToolResult, dict[str, Any] | None]:
        """The tool's result with every secret replaced (`agent.redaction`) in its data, its evidence
        payloads (never the evidence ids) and what the model sees, before the canonical store, the
        recorder or the model get any of it; and the facts of what it replaced (for REDACTION_APPLIED)."""
        redactor = self.ctx.redactor
        if not redactor.enabled:
            return result, None
        with redactor.lock:  # this call's facts only, even while the step's other calls redact theirs
            return self._redact_result(redactor, result), redactor.take()

    @staticmethod
    def _redact_result(redactor: Redactor, result: ToolResult) -> ToolResult:
        return ToolResult(
            data=redactor.redact_value(result.data),
            evidence=[EvidenceRecord(r.id, redactor.redact_value(dict(r.payload))) for r in result.evidence],
            retrieval=result.retrieval,
            model_content=redactor.redact(result.model_content) if result.model_content is not None else None,
        )

    async def _execute(self, spec: ToolSpec, arguments: dict[str, Any], timeout: float) -> Any:
        """Run the tool under its timeout, raced against the cancel token."""
        if spec.is_async:
            work: asyncio.Future[Any] = asyncio.ensure_future(spec.func(**arguments))
        else:
            work = run_blocking(spec.func, **arguments)
        cancelled = asyncio.ensure_future(self.ctx.token.wait())
        try:
            done, _pending = await asyncio.wait(
                {work, cancelled}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        except asyncio.CancelledError:
            work.cancel()
            raise
        finally:
            cancelled.cancel()
        if work in done:
            return work.result()
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            if spec.is_async:
                await work
        if self.ctx.token.cancelled:
            raise RunCancelled(self.ctx.token.reason)
        raise _Timeout()


def _keep_then_succeed(
    ctx: RunContext, tool_call_id: str, result_json: str, evidence: dict[str, Any], retrieval: Any
) -> tuple[bool, int | Exception | None]:
    """In one job of the database pool: the call's full result into the canonical store, then its
    SUCCEEDED terminal (noting a store that was unavailable). (Whether the store kept it, the terminal's
    sequence or the `ToolLifecycleConflict` that refused it.)"""
    note = ""
    try:
        ctx.canonical.put_result(tool_call_id=tool_call_id, result_json=result_json, evidence=evidence)
        kept = True
    except CanonicalUnavailable:
        kept, note = False, "canonical store unavailable"
    try:
        seq = ctx.recorder.tool_finished(
            tool_call_id=tool_call_id,
            status=ToolStatus.SUCCEEDED,
            output=result_json,
            retrieval=retrieval,
            summary_note=note,
        )
    except ToolLifecycleConflict as exc:
        return kept, exc
    return kept, seq
