"""The agent loop: ReAct with function calling, every model call recorded as a step where it happens.

`Agent.run(messages, tools=..., max_steps=...)` calls the agent model up to `max_steps` times. Each call
streams its visible text to the run's sink as it arrives and is recorded through `recorder.model_step`
(step row, reasoning row, AGENT_MODEL_STEP and MODEL_TOKEN_USAGE with source AGENT, in one transaction)
before anything acts on it, which also declares its tool calls so that the boundary may start them. A
step that calls tools appends the assistant message (with DeepSeek's `reasoning_content` when the
provider sent it: DeepSeek requires it back within the turn during tool calls) and the tools' results,
then loops; a step without tool calls ends the loop with its text as the draft answer. The last allowed
step is sent with `tool_choice="none"` so the model must answer. A model call that fails (`LLMError`) or
is cancelled is still recorded as a step, with what had arrived, usage unavailable and finish reason
`error` / `cancelled`, then the exception propagates. A step's tool calls are recorded under ids unique
in the run (`RunRecorder.run_unique_calls`), while every message sent back to the provider names them by
the provider's own ids.

Reasoning never enters later turns: the runtime builds each run's conversation from the previous runs'
published answers only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from django.utils import timezone

from agent.runtime.approvals import RunInterrupted
from agent.runtime.cancel import RunCancelled
from agent.runtime.context import RunContext
from agent.runtime.events import Stage
from agent.runtime.llm import LLMError, ModelResult, StreamProgress
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

    async def run(self, messages: list[dict[str, Any]], *, tools: bool, max_steps: int) -> AgentAnswer:
        """Loop until the model answers without tool calls; `messages` is extended in place."""
        ctx = self.ctx
        specs = ctx.registry.openai_tools() if tools and len(ctx.registry) else None
        max_steps = max(1, max_steps)
        for step in range(1, max_steps + 1):
            last = step == max_steps
            result = await self._step(messages, specs, "none" if specs and last else None)
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

    async def _step(
        self,
        messages: Sequence[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        tool_choice: str | None,
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
                )
            )
        except (LLMError, RunCancelled) as exc:
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
                finish_reason="error" if isinstance(exc, LLMError) else "cancelled",
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
