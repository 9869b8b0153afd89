"""The recorded workload: one full diagnosis run's decisions, as the runtime makes them.

A run is: RUN_STARTED, the router's attempt (with its token usage) and decision, a model step that
declares three parallel tool calls, the three tools' starts and terminals, two more tool-free steps, the
answer step, both guards, the release and the finish. That is 23 timeline events, 4 model steps with their
4 reasoning rows, 3 tool rows (inserted RUNNING, then updated once to their terminal status) and 7 updates
of the run row — built like `tests/factories.py::record_full_run(tools=3, extra_steps=2)`, with payloads of
the same sizes. The inputs are built once (`RunInputs`); the recorder does everything else per run.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from audit.write import DeclaredToolCall, RetrievalFacts, RunRecorder, Usage
from reasoning.capture import CapturedReasoning, build_capture

TOOLS = 3
EXTRA_STEPS = 2
REASONING = (
    "The lag pattern suggests a long transaction holding the SQL thread; check the relay log position "
    "against the source and look for a large DELETE without an index. "
) * 3
ANSWER = "Replication lags because of a long transaction [kb:mysql-replication-lag#1]."


def usage(prompt: int, completion: int, reasoning: int | None = None, cached: int | None = None) -> Usage:
    return Usage(
        available=True,
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        reasoning_tokens=reasoning,
        cached_tokens=cached,
    )


@dataclass(frozen=True)
class RunInputs:
    """What the decision owners hand the recorder during one run (identical for every run)."""

    calls: list[DeclaredToolCall]
    first_capture: CapturedReasoning
    extra_capture: CapturedReasoning
    answer_capture: CapturedReasoning
    tool_inputs: list[dict[str, Any]]
    tool_output: str
    retrieval: RetrievalFacts
    model_input: list[dict[str, Any]]


def make_inputs() -> RunInputs:
    calls = [
        DeclaredToolCall(
            tool_call_id=f"call_{i}",
            name="lookup_knowledge",
            arguments=json.dumps({"query": f"replication lag cause {i}", "top_k": 5}),
        )
        for i in range(TOOLS)
    ]
    return RunInputs(
        calls=calls,
        first_capture=build_capture(reasoning=REASONING, text="", tool_calls=[c.plan() for c in calls]),
        extra_capture=build_capture(reasoning=None, text="Checking the second runbook before answering."),
        answer_capture=build_capture(reasoning=REASONING, text=ANSWER),
        tool_inputs=[json.loads(c.arguments) for c in calls],
        tool_output=json.dumps(
            {"items": [{"id": f"kb:mysql-replication-lag#{i}", "text": "x" * 300} for i in range(3)]}
        ),
        retrieval=RetrievalFacts(
            layer="L0+L1", l0_match_count=1, l1_match_count=3, details={"l0": ["replication lag"]}
        ),
        model_input=[
            {"role": "system", "chars": 2400},
            {"role": "user", "chars": 120},
        ],
    )


def decisions(rec: RunRecorder, inp: RunInputs) -> list[Callable[[], Any]]:
    """The run's decisions in order, each one recorder call (durable when it returns)."""
    steps: list[Callable[[], Any]] = [
        lambda: rec.run_started(agent_flow="DIAGNOSIS_AGENT", details={"provider": "bench", "tools": 1}),
        rec.mark_first_model_request,
        lambda: rec.routing_attempt(
            attempt=1,
            model="router-m",
            usage=usage(120, 20),
            ok=True,
            intent="DIAGNOSIS",
            confidence=0.92,
            reason="replication symptom",
            duration_ms=310,
            provider_attempts=[{"attempt": 1, "status": 200, "durationMs": 310}],
        ),
        lambda: rec.routing_decision(
            intent="DIAGNOSIS", confidence=0.92, reason="replication symptom", fallback=False
        ),
        lambda: rec.model_step(
            step_index=1,
            agent_name="diagnosis_agent",
            model="agent-m",
            usage=usage(800, 60, reasoning=40, cached=128),
            reasoning=inp.first_capture,
            tool_calls=inp.calls,
            finish_reason="tool_calls",
            duration_ms=900,
            model_input=inp.model_input,
            provider_attempts=[{"attempt": 1, "status": 200, "durationMs": 900}],
        ),
    ]
    for call, params in zip(inp.calls, inp.tool_inputs, strict=True):
        steps.append(
            lambda call=call, params=params: rec.tool_started(
                tool_call_id=call.tool_call_id, tool_name=call.name, input_params=params
            )
        )
    for call in inp.calls:
        steps.append(
            lambda call=call: rec.tool_finished(
                tool_call_id=call.tool_call_id,
                status="SUCCEEDED",
                output=inp.tool_output,
                retrieval=inp.retrieval,
            )
        )
    for extra in range(EXTRA_STEPS):
        steps.append(
            lambda extra=extra: rec.model_step(
                step_index=2 + extra,
                agent_name="diagnosis_agent",
                model="agent-m",
                usage=usage(900, 30),
                reasoning=inp.extra_capture,
                finish_reason="stop",
                duration_ms=700,
                model_input=inp.model_input,
            )
        )
    steps += [
        lambda: rec.model_step(
            step_index=2 + EXTRA_STEPS,
            agent_name="diagnosis_agent",
            model="agent-m",
            usage=usage(1500, 90, reasoning=30),
            reasoning=inp.answer_capture,
            finish_reason="stop",
            duration_ms=1200,
            model_input=inp.model_input,
        ),
        rec.mark_first_output,
        lambda: rec.evidence_guard(retry=False, passed=True, cited=["kb:mysql-replication-lag#1"]),
        lambda: rec.semantic_guard(
            model="guard-m", usage=usage(600, 25), supported=True, reason="all claims cited", duration_ms=400
        ),
        lambda: rec.release(decision="PUBLISHED", reason="guards passed"),
        lambda: rec.finish(status="SUCCESS", content=ANSWER),
    ]
    return steps


def record_run(rec: RunRecorder, inp: RunInputs) -> None:
    """Record one full run synchronously."""
    for decide in decisions(rec, inp):
        decide()


async def record_run_async(
    rec: RunRecorder, inp: RunInputs, db: Callable[[Callable[[], Any]], Awaitable[Any]]
) -> None:
    """Record one full run from a coroutine: each decision awaited through `db` (the runtime's pool)."""
    for decide in decisions(rec, inp):
        await db(decide)


EVENTS_PER_RUN = 23
STEPS_PER_RUN = 1 + EXTRA_STEPS + 1
TOOLS_PER_RUN = TOOLS
