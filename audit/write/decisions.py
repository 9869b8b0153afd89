"""The decisions a run records beside its lifecycle: routing, the agent's model steps, the guards and
the release, each with the rows it writes (step, reasoning) and its token usage. `Decisions` is the
recorder's part that records them (`recorder.decisions`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.utils import timezone

from audit.models import EventType, Phase, UsageSource
from audit.payloads import bound_json, bound_text, clip
from audit.write.chain_writer import RunChain
from audit.write.decision_rows import (
    GUARD_AGENT_NAME,
    ROUTER_AGENT_NAME,
    reasoning_details,
    reasoning_insert,
    step_event,
    step_insert,
    usage_event,
)
from audit.write.ledger import TokenLedger
from audit.write.ops import Insert
from audit.write.runtime_facts import (
    SUMMARY_CHARS,
    ChainEvent,
    DeclaredToolCall,
    Usage,
    guard_reasoning_step,
    router_reasoning_step,
)
from audit.write.tools import ToolCalls
from diagnosis.models import ReleaseDecision
from reasoning.capture import CapturedReasoning

# Distinct originals a REDACTION_APPLIED event names one by one (the rest are counted).
REDACTION_ITEMS = 40


class Decisions:
    """The recorder's decision part (`recorder.decisions`; see `audit.write.run` for the rules). What it
    keeps is what the run decided that its terminal row writes again: the router's `intent`, the
    `release_decision`, and the end of the latest agent step (`last_token_at`, the answer's last
    token once the guards take over); and the count of guard calls (their reasoning rows' step index).
    A model call's usage enters the token `ledger` whether or not its record commits (the call happened;
    `finish` reconciles the ledger with the usage records that did)."""

    def __init__(self, chain: RunChain, tools: ToolCalls, ledger: TokenLedger) -> None:
        self.chain = chain
        self.tools = tools
        self.ledger = ledger
        self.run_id = chain.run_id
        self.session_id = chain.session_id
        self.intent: str | None = None
        self.release_decision: str | None = None
        self.last_token_at: Any = None
        self.guard_calls = 0

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
        return self.chain.write(
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
            details.update(reasoning_details(reasoning, step_index, ROUTER_AGENT_NAME))
            reasoning_row = reasoning_insert(
                self.run_id, self.session_id, step_index, ROUTER_AGENT_NAME, reasoning
            )
            inserts.append(reasoning_row)
            bind["reasoningDigest"] = reasoning_row
            with self.chain.lock:
                self.chain.expected_reasoning += 1
        summary = (
            f"attempt {attempt}: {intent} ({confidence})"
            if ok
            else f"attempt {attempt}: unusable ({clip(error, 120)})"
        )
        with self.chain.lock:  # the ledger's entry and the write, as one decision
            return self._write_call(
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
                    usage_event(
                        UsageSource.ROUTER, model, usage, phase=Phase.ROUTING, agent_name=ROUTER_AGENT_NAME
                    ),
                ],
                usage,
                inserts=inserts,
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

        return self.chain.write(
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
        with self.chain.lock:
            self.tools.declare(tool_calls, agent_name=agent_name, step_index=step_index)
            self.chain.expected_steps += 1
            self.chain.expected_reasoning += 1
            step = step_insert(
                self.run_id, self.session_id,
                step_index=step_index, agent_name=agent_name, model=model, usage=usage, reasoning=reasoning,
                tool_calls=tool_calls, finish_reason=finish_reason, started_at=started_at,
                finished_at=finished_at, duration_ms=duration_ms, model_input=model_input,
                text_length=text_length, provider_attempts=provider_attempts, now=now,
            )  # fmt: skip
            reasoning_row = reasoning_insert(
                self.run_id, self.session_id, step_index, agent_name, reasoning, now=now
            )
            events = [
                step_event(
                    step_index,
                    agent_name,
                    model,
                    reasoning,
                    tool_calls,
                    finish_reason,
                    duration_ms,
                    len(provider_attempts),
                    bind={"stepDigest": step, "reasoningDigest": reasoning_row},
                ),
                usage_event(
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
                self.last_token_at = finished_at

            def step_id() -> None:  # the row id, once the step committed (its tool calls' rows name it)
                if step.id is not None:
                    self.tools.step_ids[(agent_name, step_index)] = step.id

            return self._write_call(
                "model_step", events, usage, inserts=[step, reasoning_row], on_commit=step_id
            )

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
        return self.chain.write(
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
        return self.chain.write(
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
        with self.chain.lock:
            self.guard_calls += 1
            inserts = []
            bind: dict[str, Insert] = {}
            if reasoning is not None:
                step_index = guard_reasoning_step(self.guard_calls)
                details.update(reasoning_details(reasoning, step_index, GUARD_AGENT_NAME))
                reasoning_row = reasoning_insert(
                    self.run_id, self.session_id, step_index, GUARD_AGENT_NAME, reasoning
                )
                inserts.append(reasoning_row)
                bind["reasoningDigest"] = reasoning_row
                self.chain.expected_reasoning += 1
            return self._write_call(
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
                    usage_event(
                        UsageSource.GUARD, model, usage, phase=Phase.GUARD, agent_name=GUARD_AGENT_NAME
                    ),
                ],
                usage,
                inserts=inserts,
            )

    def release(self, *, decision: str, reason: str, details: dict[str, Any] | None = None) -> int | None:
        """RELEASE_DECISION: PUBLISHED or BLOCKED, and why."""
        if decision not in ReleaseDecision.values:
            raise ValueError(f"unknown release decision {decision!r}")
        self.release_decision = decision
        return self.chain.write(
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
    def _write_call(self, what: str, events: Sequence[ChainEvent], usage: Usage, **write: Any) -> int | None:
        """Write a model call's decision, whose last event is its MODEL_TOKEN_USAGE: the usage enters
        the ledger first, whether or not the write commits (the call happened). The caller holds the
        chain's lock."""
        d = events[-1].details
        self.ledger.add(d["source"], usage, d.get("stepIndex"), d.get("agentName"))
        return self.chain.write(what, events, **write)
