"""The agent loop: ReAct with function calling, every model call recorded as a step where it happens.

`Agent.run(messages, tools=..., max_steps=...)` calls the agent model up to `max_steps` times (the last
with `tool_choice="none"`). Each call is recorded through `recorder.model_step` before anything acts on
it, which declares its tool calls (under run-unique ids) to the boundary; a step with tool calls loops
with their results, a step without ends with its text as the draft. A failed or cancelled call is still
recorded as a step, then the exception propagates. Reasoning is sent back only within a turn, where
DeepSeek requires it, and never enters later turns.
Details: docs/runtime.md, *Pipeline* (5) and *Tool call ids*; *DeepSeek notes*.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from django.utils import timezone

from agent.runtime.cancel import RunCancelled, StreamCut
from agent.runtime.context import RunContext
from agent.runtime.events import Stage
from agent.runtime.llm import LLMError, ModelResult, StreamProgress
from agent.runtime.resume_state import RunHandedOver, RunInterrupted
from agent.runtime.tools.boundary import ERROR_OBSERVED, ToolBoundary
from audit.models import CHAT_AGENT_NAME, ToolStatus
from audit.write import Usage
from reasoning.capture import build_capture

AGENT_NAME = CHAT_AGENT_NAME
StepCallback = Callable[[ModelResult, int], Awaitable[None]]
# Reasoning keys whose text DeepSeek-style providers expect back as `reasoning_content`.
ROUND_TRIP_KEYS = frozenset({"attribute", "reasoning_content"})


@dataclass(frozen=True, slots=True)
class AgentAnswer:
    text: str
    steps: int
    finish_reason: str


def summarise_input(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None) -> list:
    """What the step sent, as roles and sizes only (never content), for `agent_step.model_input`."""
    summary: list[dict[str, Any]] = []
    for message in messages:
        entry: dict[str, Any] = {"role": message.get("role"), "chars": len(str(message.get("content") or ""))}
        if message.get("tool_calls"):
            entry["toolCalls"] = len(message["tool_calls"])
        if message.get("tool_call_id"):
            entry["toolCallId"] = message["tool_call_id"]
        if message.get("reasoning_content"):
            entry["reasoningChars"] = len(message["reasoning_content"])
        summary.append(entry)
    if tools:
        summary.append({"tools": [t["function"]["name"] for t in tools]})
    return summary


def assistant_message(result: ModelResult) -> dict[str, Any]:
    """The assistant turn to append after a tool-calling step (calls under the provider's ids)."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": result.text or None,
        "tool_calls": [
            {
                "id": call.provider_id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in result.tool_calls
        ],
    }
    if result.reasoning and result.reasoning_key in ROUND_TRIP_KEYS:
        message["reasoning_content"] = result.reasoning
    return message


def _abandoned_as(exc: Exception) -> str:
    """How a model step that did not complete is recorded: a provider error, a cancel, or a stream cut
    for a handover (the run's next owner asks the model again: `agent.runtime.drain`)."""
    if isinstance(exc, LLMError):
        return "error"
    return "handover" if isinstance(exc, StreamCut) else "cancelled"


class Agent:
    """One agent of a run: `agent_name` names its steps (`diagnosis_agent` in the chat flow, `planner`
    and `executor` in AI Ops), which it numbers 1, 2, … on its own counter (`RunContext.step_counts`)."""

    def __init__(
        self, ctx: RunContext, *, agent_name: str = AGENT_NAME, on_step: StepCallback | None = None
    ) -> None:
        self.ctx = ctx
        self.agent_name = agent_name
        # Awaited with each completed step's result and index once the step is recorded (before its
        # tools run): AI Ops records a plan revision the executor wrote there.
        self.on_step = on_step
        self.boundary = ToolBoundary(ctx)

    async def run(
        self, messages: list[dict[str, Any]], *, tools: bool, max_steps: int, handover: bool = False
    ) -> AgentAnswer:
        """Loop until the model answers without tool calls; `messages` is extended in place.
        `handover`: the loop is one a run can be handed over from (the chat agent's, the AI Ops
        executor's): when the process drains, it stops before its next model step, or when its stream
        in progress is cut, with `RunHandedOver` (the caller saves the state; `agent.runtime.drain`)."""
        ctx = self.ctx
        specs = ctx.registry.openai_tools() if tools and len(ctx.registry) else None
        max_steps = max(1, max_steps)
        for step in range(1, max_steps + 1):
            last = step == max_steps
            if handover and ctx.token.handover_requested and not ctx.token.cancelled:
                raise self._handed_over(messages, steps_used=step - 1, max_steps=max_steps)
            try:
                result = await self._step(
                    messages, specs, "none" if specs and last else None, cuttable=handover
                )
            except StreamCut:
                retried = ctx.steps_taken(self.agent_name)
                raise self._handed_over(
                    messages, steps_used=step - 1, max_steps=max_steps, retried_step=retried
                ) from None
            if result.tool_calls and specs and not last:
                messages.append(assistant_message(result))
                outcomes = await self.boundary.run(result.tool_calls)
                pending = [o.call.tool_call_id for o in outcomes if o.status == ToolStatus.AWAITING_APPROVAL]
                if pending:
                    # Calls wait for a person: the attempt ends here (the caller saves the state).
                    raise RunInterrupted(
                        agent_name=self.agent_name,
                        messages=list(messages),
                        calls=list(result.tool_calls),
                        results={
                            o.call.tool_call_id: o.message()
                            for o in outcomes
                            if o.status not in (ToolStatus.AWAITING_APPROVAL, ERROR_OBSERVED)
                        },
                        pending=pending,
                        kept=[o.call.tool_call_id for o in outcomes if o.status == ERROR_OBSERVED],
                        steps_used=step,
                        max_steps=max_steps,
                    )
                messages.extend(outcome.message() for outcome in outcomes)
                ctx.token.raise_if_cancelled()
                continue
            return AgentAnswer(text=result.text, steps=step, finish_reason=result.finish_reason)
        raise AssertionError("unreachable")  # pragma: no cover

    def _handed_over(
        self, messages: list[dict[str, Any]], *, steps_used: int, max_steps: int, retried_step: int = 0
    ) -> RunHandedOver:
        """The loop's state at its last step boundary: every call of the last step ran and its result
        is in `messages` (a step's tools are never cut)."""
        return RunHandedOver(
            agent_name=self.agent_name,
            messages=list(messages),
            calls=[],
            results={},
            pending=[],
            steps_used=steps_used,
            max_steps=max_steps,
            retried_step=retried_step,
        )

    async def _step(
        self,
        messages: Sequence[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        tool_choice: str | None,
        *,
        cuttable: bool = False,
    ) -> ModelResult:
        ctx = self.ctx
        step_index = ctx.steps_taken(self.agent_name) + 1
        await ctx.before_model_request(Stage.MODEL_STEP, step_index=step_index, agent_name=self.agent_name)
        ctx.next_step_index(self.agent_name)
        model = ctx.client.roles.agent
        sent = list(messages)
        progress = StreamProgress()
        try:
            result = await ctx.token.race(
                ctx.client.complete(
                    model=model,
                    messages=sent,
                    tools=tools,
                    tool_choice=tool_choice,
                    on_text=ctx.emit_text if ctx.streams_drafts else None,
                    progress=progress,
                ),
                cuttable=cuttable,
            )
        except (LLMError, RunCancelled, StreamCut) as exc:
            await ctx.hold(
                ctx.recorder.model_step,
                step_index=step_index,
                agent_name=self.agent_name,
                model=model,
                usage=Usage.unavailable(),
                reasoning=build_capture(
                    reasoning=progress.reasoning_value,
                    text=progress.text_value,
                    reasoning_key=progress.reasoning_key,
                ),
                finish_reason=_abandoned_as(exc),
                started_at=progress.started_at,
                finished_at=timezone.now(),
                duration_ms=progress.duration_ms(),
                model_input=summarise_input(sent, tools),
                text_length=len(progress.text_value),
                provider_attempts=progress.attempts,
            )
            raise
        if result.tool_calls:
            # The calls' arguments are redacted (agent.redaction) before anything records, saves,
            # executes or sends them back to the model: everything below sees only placeholders.
            redacted = tuple(
                replace(c, arguments=ctx.redactor.redact(c.arguments)) for c in result.tool_calls
            )
            # The record names every call by an id unique in the run; the provider's own ids (some
            # providers send `call_0` in every response) stay beside them for the messages sent back.
            result = replace(
                result, tool_calls=ctx.recorder.run_unique_calls(redacted, step_index=step_index)
            )
        await ctx.hold(
            ctx.recorder.model_step,
            step_index=step_index,
            agent_name=self.agent_name,
            model=result.model,
            usage=result.usage,
            reasoning=build_capture(
                reasoning=result.reasoning,
                text=result.text,
                tool_calls=[call.plan() for call in result.tool_calls],
                reasoning_key=result.reasoning_key,
            ),
            tool_calls=result.tool_calls,
            finish_reason=result.finish_reason,
            started_at=result.started_at,
            finished_at=result.finished_at,
            duration_ms=result.duration_ms,
            model_input=summarise_input(sent, tools),
            text_length=len(result.text),
            provider_attempts=result.attempts,
        )
        await ctx.record_redaction("tool_input")
        if self.on_step is not None:
            await self.on_step(result, step_index)
        return result
