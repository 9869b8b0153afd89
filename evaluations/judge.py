"""The LLM judge: one model call through the configured provider's client (`agent.runtime.providers`:
the real `openai` SDK path, or the offline demo model), priced by `pricing` and returned with its
reasoning capture for the governed store (`evaluations.recording`).

The judge sees the run's question, its released answer and the text of the runbook chunks the answer
cites (`kb:<slug>#<n>`; other kinds of evidence are named, not quoted, and an id that is not well
formed is marked as such: `diagnosis.evidence`), all redacted as stored; it answers one JSON object
`{"score", "label", "explanation"}`. A reply in the semantic guard's shape (`{"supported": bool,
"reason": …}`, what the demo model's guard role answers) is read as `supported` (1) or `unsupported`
(0). A reply that is neither is scored None with the label `judge_error`, as is a call that failed
(`LLMError`): the call is recorded all the same (its attempts, usage and price), so failed judging is
visible and paid for.
"""

from __future__ import annotations

import asyncio
import re
import threading
from typing import Any

from django.utils import timezone

from agent.runtime.guards import extract_citations
from agent.runtime.llm import LLMError, aclose_clients, parse_json_object
from agent.runtime.providers import get_model_client
from audit.write import Usage
from diagnosis.evidence import RUNBOOK_CHUNK, parse
from diagnosis.models import KnowledgeChunk
from evaluations.models import DEFAULT_JUDGE_PROMPT, Evaluator
from evaluations.recording import JudgeCall, Outcome
from pricing.costs import load_price_book
from pricing.rules import CallTokens, CostStatus
from reasoning.capture import build_capture

LABELS = ("supported", "partially_supported", "unsupported")
EVIDENCE_CHARS = 6000
ANSWER_CHARS = 8000
EXPLANATION_CHARS = 2000


def evidence_text(answer: str) -> str:
    """The cited runbook chunks, `[id] heading: text` each, cut at `EVIDENCE_CHARS` in all."""
    parts: list[str] = []
    for evidence_id in extract_citations(answer):
        cited = parse(evidence_id)
        if cited is None:
            parts.append(f"[{evidence_id}] (not an evidence id)")
            continue
        if cited.kind is not RUNBOOK_CHUNK:
            parts.append(f"[{evidence_id}] ({cited.kind.label} evidence, not quoted)")
            continue
        chunk = (
            KnowledgeChunk.objects.filter(document__slug=cited["slug"], ordinal=cited["ordinal"])
            .only("heading", "text")
            .first()
        )
        parts.append(f"[{evidence_id}] " + (f"{chunk.heading}: {chunk.text}" if chunk else "(no such chunk)"))
    return "\n\n".join(parts)[:EVIDENCE_CHARS] or "(the answer cites no evidence)"


def prompt_of(evaluator: Evaluator, run: Any) -> str:
    template = evaluator.judge_prompt or DEFAULT_JUDGE_PROMPT
    values = {
        "question": run.query or "",
        "answer": (run.content or "(no answer was released)")[:ANSWER_CHARS],
        "evidence": evidence_text(run.content or ""),
    }
    # Only the three placeholders are replaced (a template's other braces, e.g. JSON, stay as written).
    return re.sub(r"\{(question|answer|evidence)\}", lambda m: values[m[1]], template)


def read_verdict(text: str) -> Outcome:
    """The judge's reply as a score (see the module docstring)."""
    data = parse_json_object(text)
    if data is None:
        return Outcome(None, "judge_error", "the judge replied without a JSON object")
    if "supported" in data and "label" not in data:
        ok = bool(data.get("supported"))
        reason = str(data.get("reason") or "")[:EXPLANATION_CHARS]
        return Outcome(1.0 if ok else 0.0, "supported" if ok else "unsupported", reason)
    label = str(data.get("label") or "").strip().lower().replace(" ", "_")
    if label not in LABELS:
        return Outcome(None, "judge_error", f"the judge's label is not one of {', '.join(LABELS)}")
    try:
        value = min(1.0, max(0.0, float(data.get("score"))))
    except (TypeError, ValueError):
        value = {"supported": 1.0, "partially_supported": 0.5, "unsupported": 0.0}[label]
    return Outcome(value, label, str(data.get("explanation") or "")[:EXPLANATION_CHARS])


async def _call(model: str, messages: list[dict[str, Any]]):
    client = get_model_client()
    try:
        return client, await client.complete(model=model, messages=messages)
    finally:
        await aclose_clients()


def _run_async(coro):
    """Run `coro` to its end from synchronous code, also when this thread already runs an event loop
    (then in a thread of its own, with its own loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = asyncio.run(coro)
        except BaseException as exc:  # handed back to the caller
            box["error"] = exc

    thread = threading.Thread(target=target, name="evaluation-judge")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


def judge(evaluator: Evaluator, run: Any) -> tuple[Outcome, JudgeCall]:
    """Make the judge's call for `run` and return its score and the call as it happened."""
    client = get_model_client()
    model = evaluator.judge_model or client.roles.guard
    messages = [
        {"role": "system", "content": "You are a strict grader. Answer with one JSON object only."},
        {"role": "user", "content": prompt_of(evaluator, run)},
    ]
    started = timezone.now()
    try:
        used_client, result = _run_async(_call(model, messages))
    except LLMError as exc:
        duration = int((timezone.now() - started).total_seconds() * 1000)
        call = JudgeCall(
            model=model,
            provider=client.provider,
            usage=Usage.unavailable(),
            attempts=exc.attempts,
            duration_ms=duration,
            cost=None,
            cost_status=CostStatus.USAGE_UNAVAILABLE,
            reasoning=None,
            error_code=exc.code,
        )
        return Outcome(None, "judge_error", f"the judge's call failed ({exc.code})"), call
    outcome = read_verdict(result.text)
    cost = load_price_book().price_call(
        provider=used_client.provider,
        model=result.model,
        tokens=CallTokens.from_usage(result.usage),
        at=started,
    )
    capture = build_capture(reasoning=result.reasoning, text=result.text, reasoning_key=result.reasoning_key)
    call = JudgeCall(
        model=result.model,
        provider=used_client.provider,
        usage=result.usage,
        attempts=result.attempts,
        duration_ms=result.duration_ms,
        cost=cost.amount,
        cost_status=cost.status,
        reasoning=capture,
    )
    return outcome, call
