"""The AI Ops analysis of one run (`agent_flow == "AI_OPS"`): planner → executor → the chat pipeline's
guards and release → self-evaluation. `execute_run` calls `run_aiops` instead of `run_pipeline`.

No router (ROUTING_DECISION is recorded NOT_APPLICABLE with intent DIAGNOSIS). The planner (no tools)
writes a bounded plan, recorded as PLAN_DECISION (ACCEPTED, or UNUSABLE then the default plan); the
executor runs the agent loop with the AI Ops tools, may revise the plan, and writes the cited report.
A call that needs approval interrupts the run; a worker resumes it here (`resuming=True`). The guards and
release are the chat pipeline's own (`pipeline.verify_and_release`), then `agent.runtime.selfeval`.
Details: docs/aiops.md, *How an analysis runs*.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from django.conf import settings

from agent.runtime import prompts
from agent.runtime.agent import Agent
from agent.runtime.context import RunContext
from agent.runtime.db import db
from agent.runtime.llm import ModelResult
from agent.runtime.pipeline import PipelineResult, verify_and_release
from agent.runtime.plan import Plan, default_plan, parse_plan, strip_plan_blocks
from agent.runtime.resume_state import ResumeStateUnavailable, RunInterrupted, save_state, saved_state
from agent.runtime.selfeval import self_evaluation
from audit.write import DeclaredToolCall
from diagnosis.models import AgentFlow

AGENT_FLOW = AgentFlow.AI_OPS
PLANNER = "planner"
EXECUTOR = "executor"
INTENT = "DIAGNOSIS"

ACCEPTED = "ACCEPTED"
UNUSABLE = "UNUSABLE"
FALLBACK = "FALLBACK"
REVISED = "REVISED"


def is_aiops(agent_flow: str) -> bool:
    return agent_flow == AGENT_FLOW


@dataclass(eq=False)
class _PlanInForce:
    """The plan the executor follows, and its revisions as the executor writes them."""

    ctx: RunContext
    tool_names: list[str]
    steps: list[dict[str, Any]]
    fallback: bool
    revisions: int = 0
    problems: list[str] = field(default_factory=list)

    async def on_step(self, result: ModelResult, step_index: int) -> None:
        """After each recorded executor step: a ```plan block in its text revises the plan."""
        text = result.text or ""
        if f"```{prompts.PLAN_FENCE}" not in text:
            return
        revised = parse_plan(text, tool_names=self.tool_names, fenced_only=True)
        rec = self.ctx.recorder
        if not revised.usable:
            await self.ctx.hold(
                rec.plan_decision,
                agent_name=EXECUTOR,
                status=UNUSABLE,
                steps=[],
                revision=self.revisions,
                step_index=step_index,
                source="revision",
                problems=revised.problems,
                reason="the executor's revised plan was unusable; the plan in force stays",
            )
            return
        self.revisions += 1
        self.steps = revised.as_list()
        await self.ctx.hold(
            rec.plan_decision,
            agent_name=EXECUTOR,
            status=REVISED,
            steps=self.steps,
            revision=self.revisions,
            step_index=step_index,
            source="revision",
            problems=revised.problems,
            reason="the executor revised the plan",
        )


async def _plan(ctx: RunContext, tool_names: list[str]) -> tuple[Plan, bool]:
    """The planner's call and its PLAN_DECISION(s); returns the plan in force and whether it is the
    default one."""
    rec = ctx.recorder
    planner = Agent(ctx, agent_name=PLANNER)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": ctx.prompts.planner_system(tool_names)},
        {"role": "user", "content": ctx.query},
    ]
    answer = await planner.run(messages, tools=False, max_steps=1)
    ctx.token.raise_if_cancelled()
    plan = parse_plan(answer.text, tool_names=tool_names)
    step_index = ctx.steps_taken(PLANNER)
    if plan.usable:
        await ctx.hold(
            rec.plan_decision,
            agent_name=PLANNER,
            status=ACCEPTED,
            steps=plan.as_list(),
            step_index=step_index,
            problems=plan.problems,
            reason="the planner's plan",
        )
        return plan, False
    await ctx.hold(
        rec.plan_decision,
        agent_name=PLANNER,
        status=UNUSABLE,
        steps=[],
        step_index=step_index,
        problems=plan.problems,
        reason="the planner's answer held no usable plan",
    )
    fallback = default_plan(tool_names)
    await ctx.hold(
        rec.plan_decision,
        agent_name=EXECUTOR,
        status=FALLBACK,
        steps=fallback.as_list(),
        source="default",
        reason="the default plan replaces the planner's unusable one",
    )
    return fallback, True


async def run_aiops(ctx: RunContext, *, created_at: Any = None, resuming: bool = False) -> PipelineResult:
    """The AI Ops analysis (see the module docstring). `created_at` is accepted for the executor's one
    call shape; an analysis does not read earlier turns. `resuming`: the run was interrupted for an
    approval and decided; it continues from its saved state (`_resume`)."""
    tool_names = ctx.registry.names()
    if resuming:
        messages, in_force, executor = await _resume(ctx, tool_names)
    else:
        await ctx.hold(
            ctx.recorder.routing_decision,
            intent=INTENT,
            confidence=None,
            reason="AI Ops analysis: an alert to diagnose, no router call",
            fallback=False,
            not_applicable=True,
        )
        plan, fallback = await _plan(ctx, tool_names)
        in_force = _PlanInForce(ctx=ctx, tool_names=tool_names, steps=plan.as_list(), fallback=fallback)
        executor = Agent(ctx, agent_name=EXECUTOR, on_step=in_force.on_step)
        messages = [
            {"role": "system", "content": ctx.prompts.executor},
            {"role": "user", "content": prompts.executor_user(ctx.query, in_force.steps)},
        ]
    answer = await _investigate(ctx, executor, messages, in_force)
    ctx.token.raise_if_cancelled()
    fallback = in_force.fallback
    result = await verify_and_release(
        ctx,
        intent=INTENT,
        agent=executor,
        messages=messages,
        answer=answer,
        repair=ctx.prompts.report_repair_message,
        draft_of=strip_plan_blocks,
        release_details={
            "agentFlow": str(AGENT_FLOW),
            "stepsByAgent": dict(ctx.step_counts),
            "planSteps": len(in_force.steps),
            "planRevisions": in_force.revisions,
            "planFallback": fallback,
        },
    )
    ctx.finishing()  # said already by the release; the self-evaluation and the terminal row remain
    evaluation = await db(
        self_evaluation,
        run_id=ctx.run_id,
        report=result.draft,
        gathered=list(ctx.gathered_evidence),
        plan_steps=in_force.steps,
        revisions=in_force.revisions,
        fallback=fallback,
        executor=EXECUTOR,
    )
    return replace(result, self_evaluation=evaluation)


async def _investigate(
    ctx: RunContext, executor: Agent, messages: list[dict[str, Any]], in_force: _PlanInForce
):
    """The executor's loop with the steps it has left. A call that requires approval interrupts it: the
    state is saved to the run's canonical store (`save_checkpoint`: encrypted with the reasoning keys,
    read back; the sha256 of the stored value goes into RUN_INTERRUPTED) and
    `RunInterrupted` reaches the executor, which ends the attempt. Only here may a call ask for approval
    (not in the repair round)."""
    remaining = max(1, int(settings.AGENT_MAX_STEPS) - ctx.steps_taken(EXECUTOR))
    ctx.approvals_allowed = True
    try:
        return await executor.run(messages, tools=True, max_steps=remaining, handover=True)
    except RunInterrupted as interrupted:  # waiting for approval, or handed over (`RunHandedOver`)
        # Encrypted with the reasoning keys; the digest RUN_INTERRUPTED chains is over the stored value.
        plan = {"steps": in_force.steps, "fallback": in_force.fallback, "revisions": in_force.revisions}
        await save_state(ctx, interrupted, extra={"plan": plan})
        raise
    finally:
        ctx.approvals_allowed = False


async def _resume(ctx: RunContext, tool_names: list[str]) -> tuple[list[dict[str, Any]], _PlanInForce, Agent]:
    """The executor as it was interrupted: its saved state, read back, checked against the digest
    RUN_INTERRUPTED names and decrypted (fail-closed: `ResumeStateUnavailable`), then dropped from the
    store; then each decided call through the
    boundary (approved: executed once under its own id; rejected or expired: the recorded refusal), the
    tool messages in the order of the step's calls."""
    state, decisions = await saved_state(ctx)
    plan = (state.get("extra") or {}).get("plan") or {}
    in_force = _PlanInForce(
        ctx=ctx,
        tool_names=tool_names,
        steps=list(plan.get("steps") or []),
        fallback=bool(plan.get("fallback")),
        revisions=int(plan.get("revisions") or 0),
    )
    executor = Agent(ctx, agent_name=EXECUTOR, on_step=in_force.on_step)
    messages = list(state.get("messages") or [])
    results = state.get("results") or {}
    pending = set(state.get("pending") or [])
    kept = set(state.get("kept") or [])
    for raw in state.get("calls") or []:
        call = DeclaredToolCall(
            tool_call_id=str(raw["toolCallId"]),
            name=str(raw["name"]),
            arguments=str(raw["arguments"]),
            provider_tool_call_id=str(raw.get("providerToolCallId") or raw["toolCallId"]),
        )
        if call.tool_call_id in results:
            messages.append(results[call.tool_call_id])
        elif call.tool_call_id in pending:
            decision = decisions.get(call.tool_call_id)
            if decision is None:
                raise ResumeStateUnavailable(f"no decision recorded for {call.tool_call_id}")
            outcome = await executor.boundary.run_decided(call, decision)
            messages.append(outcome.message())
            ctx.token.raise_if_cancelled()
        elif call.tool_call_id in kept:
            outcome = await executor.boundary.rerun_pending(call)
            messages.append(outcome.message())
            ctx.token.raise_if_cancelled()
    return messages, in_force, executor
