"""The decisions a run records beside its lifecycle: routing, the agent's model steps, the guards and
the release, each with the rows it writes (step, reasoning) and its token usage. Mixed into
`RunRecorder`; the state it uses is set by `RunRecorder.__init__`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.utils import timezone

from audit.models import CHAT_AGENT_NAME, EventType, Phase, UsageSource
from audit.payloads import bound_json, bound_text, clip
from audit.write.chain_writer import _tables
from audit.write.ops import Insert
from audit.write.runtime_facts import (
    SUMMARY_CHARS,
    ChainEvent,
    DeclaredToolCall,
    Usage,
    guard_reasoning_step,
    router_reasoning_step,
)
from audit.write.table import Table
from diagnosis.models import ReleaseDecision
from reasoning.capture import CapturedReasoning

# Distinct originals a REDACTION_APPLIED event names one by one (the rest are counted).
REDACTION_ITEMS = 40


class DecisionRecords:
    """The decision half of `RunRecorder` (see the package docstring for the rules)."""

    # ----------------------------------------------------------------------------------------------
    # Redaction
    # ----------------------------------------------------------------------------------------------
    def redaction_applied(
        self, *, source: str, facts: dict[str, Any], tool_call_id: str | None = None
    ) -> int | None:
        """REDACTION_APPLIED: what the redaction replaced in the text of `source` (`question`,
        `previous_turns`, `alert`, `tool_input`, `tool_output`; a tool's with its `tool_call_id`) before it
        was sent or stored. `facts` (`agent.redaction.Redactor.take`): counts per kind, the new distinct
        originals as kind, placeholder and HMAC, the algorithm and key id; never an original."""
        counts = {clip(str(k), 40): int(v) for k, v in list((facts.get("counts") or {}).items())[:20]}
        items = [
            {
                "kind": clip(str(i.get("kind", "")), 40),
                "placeholder": clip(str(i.get("placeholder", "")), 64),
                "hmac": clip(str(i.get("hmac", "")), 64),
            }
            for i in list(facts.get("items") or [])[:REDACTION_ITEMS]
        ]
        details: dict[str, Any] = {
            "source": source,
            "counts": counts,
            "items": items,
            "itemsOmitted": max(0, len(facts.get("items") or []) - REDACTION_ITEMS),
            "algorithm": clip(str(facts.get("algorithm", "")), 32),
            "keyId": clip(str(facts.get("keyId", "")), 32),
        }
        if tool_call_id is not None:
            details["toolCallId"] = tool_call_id
        total = sum(counts.values())
        summary = f"{source}: {total} redacted (" + ", ".join(f"{k} {v}" for k, v in counts.items()) + ")"
        phase = Phase.TOOL if source.startswith("tool") else Phase.RUN
        return self._write(
            "redaction_applied",
            [ChainEvent(phase, EventType.REDACTION_APPLIED, "APPLIED", clip(summary, 300), details)],
        )

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
        reasoning: CapturedReasoning | None = None,
    ) -> int | None:
        """ROUTING_ATTEMPT (parse failures included) and its MODEL_TOKEN_USAGE (source ROUTER); with
        `reasoning`, the call's reasoning row (agent_name `router`, step_index
        `router_reasoning_step(attempt)`) in the same transaction."""
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
        inserts = []
        bind: dict[str, Insert] = {}
        if reasoning is not None:
            step_index = router_reasoning_step(attempt)
            details.update(_reasoning_details(reasoning, step_index, ROUTER_AGENT_NAME))
            reasoning_row = self._reasoning_insert(step_index, ROUTER_AGENT_NAME, reasoning)
            inserts.append(reasoning_row)
            bind["reasoningDigest"] = reasoning_row
            with self._lock:
                self.expected_reasoning += 1
        summary = (
            f"attempt {attempt}: {intent} ({confidence})"
            if ok
            else f"attempt {attempt}: unusable ({clip(error, 120)})"
        )
        return self._write(
            "routing_attempt",
            [
                ChainEvent(
                    Phase.ROUTING,
                    EventType.ROUTING_ATTEMPT,
                    "OK" if ok else "INVALID",
                    summary,
                    details,
                    bind=bind,
                ),
                self._usage_event(
                    UsageSource.ROUTER, model, usage, phase=Phase.ROUTING, agent_name=ROUTER_AGENT_NAME
                ),
            ],
            inserts=inserts,
            usage=usage,
        )

    def routing_decision(
        self,
        *,
        intent: str,
        confidence: float | None,
        reason: str,
        fallback: bool,
        not_applicable: bool = False,
    ) -> int | None:
        """ROUTING_DECISION; the run's `intent` is set in the same transaction. `not_applicable`: no
        router ran, the flow fixes the intent (an AI Ops analysis is a DIAGNOSIS): status
        NOT_APPLICABLE, `notApplicable: true`."""
        summary = f"{intent}" + (" (fallback: router answer unusable)" if fallback else f" ({confidence})")
        status = "FALLBACK" if fallback else "DECIDED"
        details: dict[str, Any] = {
            "intent": intent,
            "confidence": confidence,
            "reason": clip(reason, 300),
            "fallback": fallback,
        }
        if not_applicable:
            status, summary = "NOT_APPLICABLE", f"{intent} (routing not applicable: {clip(reason, 120)})"
            details["notApplicable"] = True

        def committed() -> None:
            # What the terminal update writes again (and `run/4` binds): the intent as stored, so only
            # once this decision committed (held or not); a lost decision leaves it as it was.
            self.intent = intent

        return self._write(
            "routing_decision",
            [
                ChainEvent(
                    Phase.ROUTING, EventType.ROUTING_DECISION, status, clip(summary, SUMMARY_CHARS), details
                )
            ],
            run_fields={"intent": intent},
            on_commit=committed,
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
        in one transaction. Declares the step's tool calls so that their starts are accepted: their
        `tool_call_id`s must be unique in the run (`run_unique_calls`); the provider's ids are kept beside.

        `model_input` is a bounded summary of the messages sent (roles and sizes, never content);
        no reasoning or assistant text reaches the step row or the timeline, only their byte counts.
        """
        now = timezone.now()
        with self._lock:
            for call in tool_calls:
                self._declared[call.tool_call_id] = (agent_name, step_index)
                self._provider_ids[call.tool_call_id] = call.provider_id
            self.expected_steps += 1
            self.expected_reasoning += 1
            names = [c.name for c in tool_calls]
            named = "" if agent_name == CHAT_AGENT_NAME else f"{agent_name} "
            summary = f"{named}step {step_index}: {model}, finish {finish_reason or 'unknown'}"
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
                                {
                                    "id": c.tool_call_id,
                                    "providerToolCallId": c.provider_id,
                                    "name": c.name,
                                    "argumentsLength": len(c.arguments),
                                }
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
            reasoning_row = self._reasoning_insert(step_index, agent_name, reasoning, now=now)
            events = [
                ChainEvent(
                    Phase.AGENT,
                    EventType.AGENT_MODEL_STEP,
                    "TOOL_CALLS" if tool_calls else "ANSWER",
                    clip(summary, SUMMARY_CHARS),
                    {
                        "stepIndex": step_index,
                        "agentName": agent_name,
                        "model": model,
                        "finishReason": finish_reason,
                        "toolCalls": [
                            {"id": c.tool_call_id, "providerToolCallId": c.provider_id, "name": c.name}
                            for c in tool_calls
                        ],
                        "durationMs": duration_ms,
                        "reasoningAvailable": reasoning.reasoning_available,
                        "reasoningBytes": reasoning.reasoning_bytes,
                        "assistantBytes": reasoning.assistant_bytes,
                        "contentSource": reasoning.content_source,
                        "providerAttempts": len(provider_attempts),
                    },
                    bind={"stepDigest": step, "reasoningDigest": reasoning_row},
                ),
                self._usage_event(
                    UsageSource.AGENT,
                    model,
                    usage,
                    phase=Phase.AGENT,
                    step_index=step_index,
                    agent_name=agent_name,
                ),
            ]

            if finished_at is not None:
                # The latest agent step's end is the answer's last token once the guards take over.
                self._last_token_at = finished_at

            def step_id() -> None:  # the row id, once the step committed (its tool calls' rows name it)
                if step.id is not None:
                    self._step_ids[(agent_name, step_index)] = step.id

            return self._write(
                "model_step", events, inserts=[step, reasoning_row], usage=usage, on_commit=step_id
            )

    # ----------------------------------------------------------------------------------------------
    # Plan (AI Ops)
    # ----------------------------------------------------------------------------------------------
    def plan_decision(
        self,
        *,
        agent_name: str,
        status: str,
        steps: Sequence[dict[str, Any]],
        revision: int = 0,
        step_index: int | None = None,
        source: str = "model",
        problems: Iterable[str] = (),
        reason: str = "",
    ) -> int | None:
        """PLAN_DECISION (phase AGENT): the plan an agent wrote or revised, or why it could not be used.

        `status`: ACCEPTED (the planner's plan, revision 0), UNUSABLE (the answer held no usable plan;
        `problems` say why, `steps` is empty), FALLBACK (the default plan used instead, `source`
        `default`) or REVISED (the executor's revision `revision` ≥ 1). `step_index` is the writing
        agent's step whose text held the plan (`planStepIndex`). `steps` are already bounded by the
        caller (`agent.runtime.plan`); the event bounds them again like every detail."""
        steps = [dict(step) for step in steps]
        problems = [clip(p, 200) for p in problems]
        summary = f"{status}: {len(steps)} step(s) from {agent_name}" + (
            f", revision {revision}" if revision else ""
        )
        if problems:
            summary += f" ({clip(problems[0], 120)})"
        return self._write(
            "plan_decision",
            [
                ChainEvent(
                    Phase.AGENT,
                    EventType.PLAN_DECISION,
                    status,
                    clip(summary, SUMMARY_CHARS),
                    {
                        "agentName": agent_name,
                        "planStepIndex": step_index,
                        "revision": revision,
                        "source": source,
                        "stepCount": len(steps),
                        "steps": bound_json(steps),
                        "problems": problems,
                        "reason": clip(reason, 300),
                    },
                )
            ],
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
                ChainEvent(
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
        reasoning: CapturedReasoning | None = None,
    ) -> int | None:
        """SEMANTIC_GUARD_DECISION and its MODEL_TOKEN_USAGE (source GUARD). `supported=None` means the
        guard model's answer was unusable (`error` says why), which the release treats as not supported.
        With `reasoning`, the call's reasoning row (agent_name `semantic_guard`, step_index
        `guard_reasoning_step(n)` for the run's n-th guard call) in the same transaction."""
        claims = [clip(c, 300) for c in unsupported_claims]
        verdict = "PASS" if supported else ("ERROR" if supported is None else "FAIL")
        summary = (
            f"{verdict}"
            + (f": {len(claims)} unsupported claim(s)" if claims else "")
            + (f" ({clip(error, 120)})" if error else "")
        )
        details: dict[str, Any] = {
            "model": model,
            "supported": supported,
            "unsupportedClaims": claims,
            "reason": clip(reason, 300),
            "error": clip(error, 300) or None,
            "durationMs": duration_ms,
            "providerAttempts": list(provider_attempts),
        }
        with self._lock:
            self._guard_calls += 1
            inserts = []
            bind: dict[str, Insert] = {}
            if reasoning is not None:
                step_index = guard_reasoning_step(self._guard_calls)
                details.update(_reasoning_details(reasoning, step_index, GUARD_AGENT_NAME))
                reasoning_row = self._reasoning_insert(step_index, GUARD_AGENT_NAME, reasoning)
                inserts.append(reasoning_row)
                bind["reasoningDigest"] = reasoning_row
                self.expected_reasoning += 1
            return self._write(
                "semantic_guard",
                [
                    ChainEvent(
                        Phase.GUARD,
                        EventType.SEMANTIC_GUARD_DECISION,
                        verdict,
                        clip(summary, SUMMARY_CHARS),
                        details,
                        bind=bind,
                    ),
                    self._usage_event(
                        UsageSource.GUARD, model, usage, phase=Phase.GUARD, agent_name=GUARD_AGENT_NAME
                    ),
                ],
                inserts=inserts,
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
                ChainEvent(
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
    def _reasoning_insert(
        self, step_index: int, agent_name: str, reasoning: CapturedReasoning, *, now: Any = None
    ) -> Insert:
        """The `agent_reasoning_audit` row of one model call (seed 000 columns, content as captured)."""
        table: Table = _tables().reasoning
        return Insert(
            table,
            table.row(
                session_id=self.session_id,
                run_id=self.run_id,
                step_index=step_index,
                agent_name=agent_name,
                reasoning_available=reasoning.reasoning_available,
                reasoning_content=reasoning.reasoning_content,
                assistant_text=reasoning.assistant_text,
                content_source=reasoning.content_source,
                content_bytes=reasoning.content_bytes,
                created_at=now or timezone.now(),
            ),
        )

    def _usage_event(
        self,
        source: str,
        model: str,
        usage: Usage,
        *,
        phase: str,
        step_index: int | None = None,
        agent_name: str,
    ) -> ChainEvent:
        if usage.available:
            summary = (
                f"{source}: {usage.total_tokens} tokens "
                f"({usage.prompt_tokens} in, {usage.completion_tokens} out)"
            )
        else:
            summary = f"{source}: usage not reported by the provider"
        details = {
            "source": str(source),
            "agentName": agent_name,
            "model": model,
            "stepIndex": step_index,
            **usage.as_details(),
        }
        return ChainEvent(
            phase,
            EventType.MODEL_TOKEN_USAGE,
            "REPORTED" if usage.available else "UNAVAILABLE",
            summary,
            details,
        )


ROUTER_AGENT_NAME = "router"
GUARD_AGENT_NAME = "semantic_guard"


def _reasoning_details(reasoning: CapturedReasoning, step_index: int, agent_name: str) -> dict[str, Any]:
    """What a decision event says about its call's reasoning row: metadata only, never the text."""
    return {
        "reasoningStepIndex": step_index,
        "agentName": agent_name,
        "reasoningAvailable": reasoning.reasoning_available,
        "reasoningBytes": reasoning.reasoning_bytes,
        "assistantBytes": reasoning.assistant_bytes,
        "contentSource": reasoning.content_source,
    }
