"""Which runs an evaluator scores (`applies`, `sampled`) and the deterministic evaluators' scores.

Every deterministic score is a value in [0, 1] (or None when it cannot be measured) with a label and a
one-line explanation made of counts, bounds and pattern names, never the answer's text: citation
coverage, answer length, forbidden commands, latency bound and cost bound. A run is taken by the
evaluator's filter on its columns and sampled deterministically (the same runs for every version).
Details: docs/evaluations.md, *Evaluators*.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from agent.runtime.guards import CITATION_RE
from diagnosis.models import RunStatus
from evaluations.models import EvaluationScore, Evaluator, EvaluatorKind
from evaluations.recording import Outcome

TERMINAL = (RunStatus.SUCCESS, RunStatus.FAILED, RunStatus.CANCELLED)
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9`\[(])")
_LIST_MARK = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
_NOT_A_CLAIM = re.compile(r"^\s*(?:#|```|confidence\s*[:：]|sources?\s*[:：]|evidence\s*[:：])", re.I)
_WORD = re.compile(r"[A-Za-z]{2,}")


def sampled(*, evaluator: Evaluator, run_id: str) -> bool:
    """Whether `run_id` falls in `evaluator`'s sample: the first 8 bytes of sha256(name, NUL, run id)
    as a fraction of 2^64 below the rate. Reproducible, independent of the version (a new version
    scores the same runs) and of the order runs are seen in."""
    rate = float(evaluator.sample_rate)
    if rate >= 1.0:
        return True
    if rate <= 0.0:
        return False
    digest = hashlib.sha256(f"{evaluator.name}\x00{run_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < rate


def matches(*, evaluator: Evaluator, run: Any) -> bool:
    """The evaluator's filter: the run's flow, intent and release decision each in its list (an empty
    list: any)."""
    for wanted, actual in (
        (evaluator.flow_list(), run.agent_flow),
        (evaluator.intent_list(), run.intent),
        (evaluator.release_list(), run.release_decision),
    ):
        if wanted and (actual or "") not in wanted:
            return False
    return True


def applies(*, evaluator: Evaluator, run: Any) -> bool:
    """Enabled, the run finished, matches the filter and falls in the sample (the diagnosis scorers
    take only benchmark runs: `evaluations.diagnosis.takes`)."""
    from evaluations.diagnosis import takes

    return (
        evaluator.enabled
        and takes(evaluator, run.run_id)
        and run.status in TERMINAL
        and matches(evaluator=evaluator, run=run)
        and sampled(evaluator=evaluator, run_id=run.run_id)
    )


def claims(answer: str) -> list[str]:
    """The answer's claims: sentences of its prose lines and list items with at least two words."""
    found: list[str] = []
    in_code = False
    for line in (answer or "").splitlines():
        if line.strip().startswith("```"):
            in_code = not in_code
            continue
        if in_code or not line.strip() or _NOT_A_CLAIM.match(line):
            continue
        line = _LIST_MARK.sub("", line)
        for sentence in _SENTENCE.split(line.strip()):
            if len(_WORD.findall(CITATION_RE.sub("", sentence))) >= 2:
                found.append(sentence)
            elif found and CITATION_RE.search(sentence):
                found[-1] = f"{found[-1]} {sentence}"  # a citation standing after its sentence
    return found


def citation_coverage(evaluator: Evaluator, run: Any) -> Outcome:
    answer = run.content or ""
    if not answer.strip():
        return Outcome(0.0, "no_answer", "no answer was released")
    all_claims = claims(answer)
    if not all_claims:
        return Outcome(0.0, "no_answer", "the answer states no claim")
    cited = sum(1 for claim in all_claims if CITATION_RE.search(claim))
    share = cited / len(all_claims)
    label = "covered" if share >= evaluator.min_coverage else "uncovered"
    return Outcome(
        share,
        label,
        f"{cited} of {len(all_claims)} claims cite evidence (at least {evaluator.min_coverage:g} required)",
    )


def answer_length(evaluator: Evaluator, run: Any) -> Outcome:
    chars = len(run.content or "")
    if evaluator.min_chars is not None and chars < evaluator.min_chars:
        return Outcome(0.0, "too_short", f"{chars} characters, below the minimum {evaluator.min_chars}")
    if evaluator.max_chars is not None and chars > evaluator.max_chars:
        return Outcome(0.0, "too_long", f"{chars} characters, above the maximum {evaluator.max_chars}")
    return Outcome(
        1.0,
        "within",
        f"{chars} characters, within [{evaluator.min_chars or 0}, {evaluator.max_chars or '∞'}]",
    )


def forbidden_commands(evaluator: Evaluator, run: Any) -> Outcome:
    patterns = [p.strip() for p in (evaluator.forbidden_patterns or "").splitlines() if p.strip()]
    hits = [p for p in patterns if re.search(p, run.content or "", re.I | re.M)]
    if hits:
        return Outcome(0.0, "forbidden", f"{len(hits)} forbidden pattern(s) matched: {', '.join(hits)[:900]}")
    return Outcome(1.0, "clean", f"none of {len(patterns)} forbidden patterns matched")


def latency_bound(evaluator: Evaluator, run: Any) -> Outcome:
    duration = run.total_duration_ms
    if duration is None:
        return Outcome(None, "unmeasured", "the run has no recorded duration")
    bound = evaluator.max_latency_ms
    if duration <= bound:
        return Outcome(1.0, "within", f"{duration} ms within the bound of {bound} ms")
    return Outcome(0.0, "exceeded", f"{duration} ms over the bound of {bound} ms")


def cost_bound(evaluator: Evaluator, run: Any) -> Outcome:
    cost = run.cost
    if cost is None:
        return Outcome(None, "unpriced", f"the run has no price ({run.cost_status or 'not priced'})")
    bound = evaluator.max_cost_usd
    if cost <= bound:
        return Outcome(1.0, "within", f"${cost:f} within the bound of ${bound:f}")
    return Outcome(0.0, "exceeded", f"${cost:f} over the bound of ${bound:f}")


def _diagnosis(evaluator: Evaluator, run: Any) -> Outcome:
    from evaluations.diagnosis import scorer

    return scorer(evaluator, run)


DETERMINISTIC = {
    EvaluatorKind.CITATION_COVERAGE: citation_coverage,
    EvaluatorKind.ANSWER_LENGTH: answer_length,
    EvaluatorKind.FORBIDDEN_COMMANDS: forbidden_commands,
    EvaluatorKind.LATENCY_BOUND: latency_bound,
    EvaluatorKind.COST_BOUND: cost_bound,
    **{kind: _diagnosis for kind in EvaluatorKind.values if kind.startswith("diagnosis_")},
}


def already_scored(run_id: str) -> set[int]:
    return set(EvaluationScore.objects.filter(run_id=run_id).values_list("evaluator_id", flat=True))
