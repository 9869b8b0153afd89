"""The pipeline of one run: router → agent loop → evidence guard (→ one repair round) → semantic guard →
release. Each stage records its own decision through the run's recorder when it makes it.

CHITCHAT and OUT_OF_SCOPE get fixed text (`FIXED_REPLIES`), never model text, since the router's word
alone decides them; DIAGNOSIS and KNOWLEDGE run the agent with tools, and their draft is PUBLISHED only
when the evidence guard (one repair round; CANONICAL_UNAVAILABLE blocks at once) and the semantic guard
pass, else the run releases `BLOCKED_MESSAGE`. Under the default `verified` policy the outcome is the
first answer text a reader gets. Previous turns are released content only, redacted again.
Entry points: `run_pipeline`, `verify_and_release` (shared with AI Ops). Details: docs/runtime.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from django.conf import settings
from django.db.models import QuerySet, Subquery

from agent.runtime import prompts
from agent.runtime.agent import Agent, AgentAnswer
from agent.runtime.cancel import RunCancelled
from agent.runtime.context import Held, RunContext
from agent.runtime.db import db, read
from agent.runtime.events import Stage
from agent.runtime.guards import (
    EvidenceVerdict,
    SemanticVerdict,
    check_evidence,
    guard_evidence,
    parse_semantic_verdict,
)
from agent.runtime.llm import LLMError, StreamProgress
from agent.runtime.resume_state import ResumeStateUnavailable, RunHandedOver, save_state, saved_state
from agent.runtime.router import route
from audit import failed_calls
from audit.write import Usage
from core.compiled import CompiledQuery
from diagnosis.models import DiagnosisRun, ReleaseDecision, RunStatus
from reasoning.capture import build_capture

PREVIOUS_TURNS = 3
REPAIR_MAX_STEPS = 2
BLOCKED_MESSAGE = (
    "This answer could not be verified against the runbooks, so it was withheld. "
    "Please rephrase the question, or consult the runbooks directly."
)


FIXED_REPLIES = {
    "CHITCHAT": (
        "Hello! I am the operations diagnosis assistant. Describe what is failing (symptoms, error "
        "messages, the service or host) and I will look it up in the team's runbooks.",
        "你好！我是运维诊断助手。请描述出现的问题（现象、错误信息、涉及的服务或主机），我会在团队的运维手册中查找。",
    ),
    "OUT_OF_SCOPE": (
        "I am the operations diagnosis assistant and can only help with diagnosing infrastructure and "
        "service problems from the team's runbooks.",
        "我是运维诊断助手，只能根据团队的运维手册帮助诊断基础设施和服务问题。",
    ),
}
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


def language_of(query: str) -> str:
    """`zh` for a question written in Chinese, else `en`: the language of the service's own text."""
    return "zh" if _CJK.search(query or "") else "en"


def fixed_reply(intent: str, query: str) -> str:
    """The fixed answer of an intent that needs no evidence, in Chinese for a question written in it."""
    english, chinese = FIXED_REPLIES.get(intent, FIXED_REPLIES["OUT_OF_SCOPE"])
    return chinese if language_of(query) == "zh" else english


@dataclass(frozen=True, slots=True)
class PipelineResult:
    intent: str
    release_decision: str
    content: str
    # The final draft the guards checked (the content when PUBLISHED).
    draft: str = ""
    # What the run's terminal update records beside the outcome (AI Ops: its self-evaluation).
    self_evaluation: dict[str, Any] | None = None


def _previous_turns_query(run_id: str, session_id: str, limit: int) -> QuerySet:
    """The session's published runs created no later than run `run_id` (but it), newest first."""
    created = DiagnosisRun.objects.filter(run_id=run_id).values("created_at")[:1]
    return (
        DiagnosisRun.objects.filter(
            session_id=session_id,
            status=RunStatus.SUCCESS,
            release_decision=ReleaseDecision.PUBLISHED,
            created_at__lte=Subquery(created),
        )
        .exclude(run_id=run_id)
        .order_by("-created_at", "-id")
        .values_list("query", "content")[:limit]
    )


# Compiled once (`core.compiled`): built per run, the query cost more CPU than the database spent on it.
_PREVIOUS_TURNS = CompiledQuery(
    lambda run_id, session_id: _previous_turns_query(run_id, session_id, PREVIOUS_TURNS),
    run_id=str,
    session_id=str,
)


def previous_turns(*, session_id: str, run_id: str) -> list[tuple[str, str]]:
    """The session's last `PREVIOUS_TURNS` published runs created before run `run_id` (at its creation
    time or earlier, itself excluded), oldest first, as `(query, content)` (one query)."""
    rows = _PREVIOUS_TURNS.rows(run_id=run_id, session_id=session_id)
    return [(query, content) for query, content in reversed(rows)]


async def run_pipeline(ctx: RunContext, *, created_at: Any, resuming: bool = False) -> PipelineResult:
    """The chat run (see the module docstring). `created_at` is accepted for the executor's one call
    shape (the previous turns are those created before the run's stored creation time). `resuming`: a
    process handed the run over at a step of its agent loop (`agent.runtime.drain`); it continues from
    the state saved there."""
    if resuming:
        return await _resume(ctx)
    rec = ctx.recorder
    history = await read(previous_turns, session_id=ctx.session_id, run_id=ctx.run_id)
    # Stored turns were redacted when they were asked; runs stored before redaction (or with it off)
    # were not: they are redacted again on their way to the model.
    history = [(ctx.redactor.redact(query), ctx.redactor.redact(content)) for query, content in history]
    await ctx.record_redaction("previous_turns")
    decision = await route(ctx, previous_queries=[query for query, _content in history])
    ctx.token.raise_if_cancelled()
    intent = decision.intent
    messages: list[dict[str, Any]] = [{"role": "system", "content": ctx.prompts.agent_system(intent)}]
    for query, content in history:
        messages += [{"role": "user", "content": query}, {"role": "assistant", "content": content}]
    messages.append({"role": "user", "content": ctx.query})
    agent = Agent(ctx)

    if intent not in prompts.EVIDENCE_INTENTS:
        answer = AgentAnswer(text=fixed_reply(intent, ctx.query), steps=0, finish_reason="fixed")
        # A fixed reply is not model text: it is never a draft, the outcome carries it.
        return await _release(
            ctx,
            intent,
            ReleaseDecision.PUBLISHED,
            answer,
            f"fixed reply for {intent}: no model text released",
            fixed_reply=True,
            held=(rec.evidence_guard, {"retry": False, "passed": True, "cited": [], "required": False}),
        )

    return await _answer(ctx, intent, agent, messages, max_steps=int(settings.AGENT_MAX_STEPS))


async def _answer(
    ctx: RunContext, intent: str, agent: Agent, messages: list[dict[str, Any]], *, max_steps: int
) -> PipelineResult:
    """The agent loop (a run can be handed over from it: its state is saved for the next owner), then
    the guards and the release."""
    try:
        answer = await agent.run(messages, tools=True, max_steps=max_steps, handover=True)
    except RunHandedOver as handed:
        await save_state(ctx, handed, extra={"intent": intent})
        raise
    ctx.token.raise_if_cancelled()
    return await verify_and_release(ctx, intent=intent, agent=agent, messages=messages, answer=answer)


async def _resume(ctx: RunContext) -> PipelineResult:
    """A handed-over chat run, continued where its agent loop stopped: the saved state read back
    (`saved_state`: fail-closed), the loop given the steps it had left."""
    state, _decisions = await saved_state(ctx)
    intent = str((state.get("extra") or {}).get("intent") or "")
    if intent not in prompts.EVIDENCE_INTENTS or state.get("pending") or state.get("calls"):
        raise ResumeStateUnavailable("the saved state is not a handed-over chat run's")
    left = max(1, int(state.get("maxSteps") or 1) - int(state.get("stepsUsed") or 0))
    messages = list(state.get("messages") or [])
    return await _answer(ctx, intent, Agent(ctx), messages, max_steps=left)


async def verify_and_release(
    ctx: RunContext,
    *,
    intent: str,
    agent: Agent,
    messages: list[dict[str, Any]],
    answer: AgentAnswer,
    repair: Callable[[Sequence[str], Sequence[str]], str] | None = None,
    draft_of: Callable[[str], str] | None = None,
    release_details: dict[str, Any] | None = None,
) -> PipelineResult:
    """The guards and the release of a drafted answer, for every flow that drafts one (the chat agent's
    answer, the AI Ops executor's report): the evidence guard (EVIDENCE_GUARD_INITIAL); on a repairable
    failure the draft and a repair request (`repair(reasons, unknown)`) are appended to `messages` and
    `agent` gets one repair
    round of at most `REPAIR_MAX_STEPS` calls (EVIDENCE_GUARD_RETRY); then the semantic guard and
    RELEASE_DECISION (`release_details` are added to its details). `draft_of` turns the agent's final
    text into the draft the guards check and the release publishes (AI Ops: the report without its
    plan blocks); by default the text itself."""
    if draft_of is not None:
        answer = replace(answer, text=draft_of(answer.text))
    verdict = await _evidence_guard(ctx, answer, retry=False)
    if not verdict.passed and verdict.repairable:
        messages.append({"role": "assistant", "content": answer.text})
        repair = repair or ctx.prompts.repair_message
        messages.append({"role": "user", "content": repair(verdict.reasons, verdict.unknown)})
        answer = await agent.run(messages, tools=True, max_steps=REPAIR_MAX_STEPS)
        ctx.token.raise_if_cancelled()
        if draft_of is not None:
            answer = replace(answer, text=draft_of(answer.text))
        verdict = await _evidence_guard(ctx, answer, retry=True)
    extra = release_details or {}
    # No tool runs after this point: the run's failed calls are read once, for the guard and the release.
    failed = await _failed_calls(ctx)
    if not verdict.passed:
        return await _release(
            ctx,
            intent,
            ReleaseDecision.BLOCKED,
            answer,
            f"evidence guard failed ({', '.join(verdict.reasons)})",
            evidence="FAIL",
            failed=failed,
            extra=extra,
        )
    semantic, held = await _semantic_guard(ctx, answer.text, verdict, failed)
    if semantic.supported is True:
        return await _release(
            ctx,
            intent,
            ReleaseDecision.PUBLISHED,
            answer,
            "evidence and semantic guards passed",
            evidence="PASS",
            semantic="PASS",
            failed=failed,
            extra=extra,
            held=held,
        )
    reason = (
        f"semantic guard found {len(semantic.unsupported_claims)} unsupported claim(s)"
        if semantic.supported is False
        else "semantic guard answer unusable"
    )
    return await _release(
        ctx,
        intent,
        ReleaseDecision.BLOCKED,
        answer,
        reason,
        evidence="PASS",
        semantic="FAIL" if semantic.supported is False else "ERROR",
        failed=failed,
        extra=extra,
        held=held,
    )


async def _evidence_guard(ctx: RunContext, answer: AgentAnswer, *, retry: bool) -> EvidenceVerdict:
    """The evidence guard's verdict on `answer`, held as EVIDENCE_GUARD_* (one job of the pool)."""
    return await db(
        _check_and_hold,
        ctx.recorder,
        text=answer.text,
        store=ctx.canonical,
        store_degraded=ctx.canonical_degraded,
        retry=retry,
    )


def _check_and_hold(
    recorder: Any, *, text: str, store: Any, store_degraded: bool, retry: bool
) -> EvidenceVerdict:
    """`check_evidence` on the pool thread, then its decision held there (`RunRecorder.hold`)."""
    verdict = check_evidence(text=text, store=store, required=True, store_degraded=store_degraded)
    recorder.hold(
        recorder.evidence_guard,
        retry=retry,
        passed=verdict.passed,
        reasons=verdict.reasons,
        cited=verdict.cited,
        unknown=verdict.unknown,
        required=True,
    )
    return verdict


async def _failed_calls(ctx: RunContext) -> list[failed_calls.FailedCall]:
    """The run's failed calls as its chain records them (read only when the recorder saw one fail)."""
    return await db(failed_calls.failed_calls_of, ctx.run_id) if ctx.recorder.any_failed() else []


async def _semantic_guard(
    ctx: RunContext, answer: str, verdict: EvidenceVerdict, failed: Sequence[failed_calls.FailedCall]
) -> tuple[SemanticVerdict, Held]:
    """The semantic guard's verdict and its SEMANTIC_GUARD_DECISION, which the release holds in its own
    job (`RunContext.record(held=…)`); a cancelled call's decision is held at once."""
    model = ctx.client.roles.guard
    evidence = guard_evidence(verdict.evidence, verdict.cited)
    messages = [
        {"role": "system", "content": ctx.prompts.guard},
        {"role": "user", "content": prompts.guard_user(answer, evidence, failed_calls=failed)},
    ]
    await ctx.before_model_request(Stage.SEMANTIC_GUARD)
    progress = StreamProgress()
    try:
        result = await ctx.token.race(ctx.client.complete(model=model, messages=messages, progress=progress))
    except (LLMError, RunCancelled) as exc:
        cancelled = isinstance(exc, RunCancelled)
        semantic = SemanticVerdict(
            supported=None, error="cancelled" if cancelled else f"guard model failed ({exc.code})"
        )
        held: Held = (
            ctx.recorder.semantic_guard,
            {
                "model": model,
                "usage": Usage.unavailable(),
                "supported": None,
                "error": semantic.error,
                "duration_ms": progress.duration_ms(),
                "provider_attempts": progress.attempts,
                "reasoning": build_capture(
                    reasoning=progress.reasoning_value,
                    text=progress.text_value,
                    reasoning_key=progress.reasoning_key,
                ),
            },
        )
        if cancelled:
            await ctx.hold(held[0], **held[1])
            raise
        return semantic, held
    ctx.finishing()  # the run's last model call: only its records remain (see `RunContext.on_finishing`)
    semantic = parse_semantic_verdict(result.text)
    held = (
        ctx.recorder.semantic_guard,
        {
            "model": result.model,
            "usage": result.usage,
            "supported": semantic.supported,
            "unsupported_claims": semantic.unsupported_claims,
            "reason": semantic.reason,
            "error": semantic.error,
            "duration_ms": result.duration_ms,
            "provider_attempts": result.attempts,
            "reasoning": build_capture(
                reasoning=result.reasoning, text=result.text, reasoning_key=result.reasoning_key
            ),
        },
    )
    return semantic, held


async def _release(
    ctx: RunContext,
    intent: str,
    decision: str,
    answer: AgentAnswer,
    reason: str,
    *,
    evidence: str = "NOT_REQUIRED",
    semantic: str | None = None,
    fixed_reply: bool = False,
    failed: Sequence[failed_calls.FailedCall] = (),
    extra: dict[str, Any] | None = None,
    held: Held | None = None,
) -> PipelineResult:
    """RELEASE_DECISION (after `held`, a decision held in the same job of the pool) and the result."""
    ctx.finishing()  # no model call or tool follows a release decision
    content = answer.text if decision == ReleaseDecision.PUBLISHED else BLOCKED_MESSAGE
    # Every release says which calls failed (fixed text from the chain, `audit.failed_calls`); a fixed
    # reply follows no tool call.
    language = language_of(ctx.query)
    if failed:
        content = content.rstrip()
        content += failed_calls.section(failed, language=language, body=content)
    await ctx.record(
        ctx.recorder.release,
        held=held,
        decision=decision,
        reason=reason,
        details={
            "intent": intent,
            "evidenceGuard": evidence,
            "semanticGuard": semantic,
            "draftLength": len(answer.text),
            "contentLength": len(content),
            "agentSteps": ctx.steps_taken(),
            "fixedReply": fixed_reply,
            "failedCalls": {"ids": [c.tool_call_id for c in failed], "language": language},
            **(extra or {}),
        },
    )
    return PipelineResult(intent=intent, release_decision=decision, content=content, draft=answer.text)
