"""The router: asks the router model for `{"intent", "confidence", "reason"}` and records its decision.

Each call is a ROUTING_ATTEMPT (with its MODEL_TOKEN_USAGE, source ROUTER, and its reasoning row under
agent_name `router`, seed 000's capture rules), parse failures included.
An unusable answer (no JSON object, unknown intent, confidence not a number in 0..1) gets one retry with
a corrective message; when the second answer is unusable too, the decision falls back to DIAGNOSIS (the
intent that requires evidence, so a confused router can never skip the guards) and the ROUTING_DECISION
is marked `fallback`. A provider failure (`LLMError`) is recorded as an attempt and fails the run. The
ROUTING_DECISION is held (`RunContext.hold`): no effect of the run comes before its next record.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent.runtime import prompts
from agent.runtime.cancel import RunCancelled
from agent.runtime.context import RunContext
from agent.runtime.events import Stage
from agent.runtime.llm import LLMError, StreamProgress, parse_json_object
from audit.write import Usage
from reasoning.capture import build_capture

ROUTER_MAX_ATTEMPTS = 2
FALLBACK_INTENT = "DIAGNOSIS"


@dataclass(frozen=True, slots=True)
class Route:
    intent: str
    confidence: float | None
    reason: str
    fallback: bool


def parse_route(text: str | None) -> tuple[dict[str, Any] | None, str]:
    """The router's answer as `{"intent", "confidence", "reason"}`, or None and why it is unusable."""
    data = parse_json_object(text)
    if data is None:
        return None, "no JSON object in the router's answer"
    intent = str(data.get("intent") or "").strip().upper()
    if intent not in prompts.INTENTS:
        return None, f"unknown intent {intent[:40]!r}"
    confidence = data.get("confidence")
    if confidence is not None:
        try:
            confidence = float(confidence)
        except (TypeError, ValueError):
            return None, "confidence is not a number"
        if isinstance(data.get("confidence"), bool) or not 0.0 <= confidence <= 1.0:
            return None, "confidence is not a number between 0 and 1"
    reason = data.get("reason")
    reason = reason if isinstance(reason, str) else ""
    return {"intent": intent, "confidence": confidence, "reason": reason}, ""


async def route(ctx: RunContext, *, previous_queries: Sequence[str] = ()) -> Route:
    """Decide the run's intent (see the module docstring)."""
    rec = ctx.recorder
    model = ctx.client.roles.router
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": ctx.prompts.router},
        {"role": "user", "content": prompts.router_user(ctx.query, previous_queries)},
    ]
    for attempt in range(1, ROUTER_MAX_ATTEMPTS + 1):
        await ctx.before_model_request(Stage.ROUTING if attempt == 1 else None)
        progress = StreamProgress()
        try:
            result = await ctx.token.race(
                ctx.client.complete(model=model, messages=list(messages), progress=progress)
            )
        except (LLMError, RunCancelled) as exc:
            error = exc.code if isinstance(exc, LLMError) else "cancelled"
            await ctx.record(
                rec.routing_attempt,
                attempt=attempt,
                model=model,
                usage=Usage.unavailable(),
                ok=False,
                error=error,
                duration_ms=progress.duration_ms(),
                provider_attempts=progress.attempts,
                reasoning=build_capture(
                    reasoning=progress.reasoning_value,
                    text=progress.text_value,
                    reasoning_key=progress.reasoning_key,
                ),
            )
            raise
        parsed, error = parse_route(result.text)
        decision = None
        if parsed is not None:
            decision = Route(parsed["intent"], parsed["confidence"], parsed["reason"], fallback=False)
        await ctx.record(
            rec.routing_attempt,
            # ROUTING_DECISION follows a usable answer at once: held in the attempt's job.
            then_hold=None if decision is None else (rec.routing_decision, _decided(decision)),
            attempt=attempt,
            model=result.model,
            usage=result.usage,
            ok=parsed is not None,
            intent=parsed["intent"] if parsed else None,
            confidence=parsed["confidence"] if parsed else None,
            reason=parsed["reason"] if parsed else "",
            error=error,
            # The raw answer (bounded preview + length + sha256) only when it was unusable: a usable one
            # is fully described by its intent, confidence and reason.
            raw_output=None if parsed else result.text,
            duration_ms=result.duration_ms,
            provider_attempts=result.attempts,
            reasoning=build_capture(
                reasoning=result.reasoning, text=result.text, reasoning_key=result.reasoning_key
            ),
        )
        if decision is not None:
            return decision
        messages += [
            {"role": "assistant", "content": result.text},
            {"role": "user", "content": ctx.prompts.router_retry},
        ]
    decision = Route(
        FALLBACK_INTENT,
        None,
        f"router answer unusable after {ROUTER_MAX_ATTEMPTS} attempts; {FALLBACK_INTENT} requires evidence",
        fallback=True,
    )
    await ctx.hold(rec.routing_decision, **_decided(decision))
    return decision


def _decided(decision: Route) -> dict[str, Any]:
    """ROUTING_DECISION's arguments for `decision`."""
    return {
        "intent": decision.intent,
        "confidence": decision.confidence,
        "reason": decision.reason,
        "fallback": decision.fallback,
    }
