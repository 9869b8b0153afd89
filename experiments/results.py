"""An experiment's results: baseline (the source runs) against candidate (the replays), per item and in
aggregate (issue 34 item 4). Pure reads; the admin's results page draws `experiment_results`.

Per item, each evaluator's two values and delta, both releases, costs and durations, and whether the
candidate regressed (a lower score, a release lost, a replay that failed or did not run), regressions
first. In aggregate, per evaluator, the mean delta with a seeded 95 % bootstrap interval and the items
worse and better, and per side the releases, priced cost and median duration; per item, the replay's
calls the sandbox did not execute (`agent.runtime.replay`) and the tools that ran live.
Details: docs/experiments.md, *Results*.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from agent.runtime.replay import NOT_EXECUTED_REPLAY
from audit.models import ToolInvocation
from diagnosis.models import DiagnosisRun, ReleaseDecision
from experiments.models import Experiment
from experiments.scoring import scores_of

BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95


@dataclass
class Side:
    run_id: str = ""
    status: str = ""
    release: str = ""
    cost: Decimal | None = None
    duration_ms: int | None = None
    fingerprint: str = ""
    scores: dict[str, float | None] = field(default_factory=dict)


@dataclass(frozen=True)
class NotExecuted:
    """A replay's call of a tool that changes the world, which the sandbox did not execute: its record's
    message says whether the source run's recorded outcome was replayed to the model."""

    tool_name: str
    tool_call_id: str
    message: str


@dataclass
class ItemResult:
    position: int
    question: str
    baseline: Side
    candidate: Side
    error: str = ""
    deltas: dict[str, float | None] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    # The replay's calls: those the sandbox did not execute, and the names of the tools that ran live.
    not_executed: list[NotExecuted] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)

    @property
    def regressed(self) -> bool:
        return bool(self.reasons)

    @property
    def worst(self) -> float:
        known = [d for d in self.deltas.values() if d is not None]
        return min(known, default=0.0)


@dataclass
class EvaluatorSummary:
    name: str
    n: int
    baseline_mean: float | None
    candidate_mean: float | None
    mean_delta: float | None
    ci: tuple[float, float] | None
    worse: int
    better: int


@dataclass
class Results:
    experiment: Experiment
    items: list[ItemResult]
    evaluators: list[EvaluatorSummary]
    totals: dict[str, Any]

    @property
    def regressions(self) -> int:
        return sum(1 for i in self.items if i.regressed)


def bootstrap_ci(deltas: list[float], *, seed: int = 0) -> tuple[float, float] | None:
    """The 95 % percentile-bootstrap interval of the mean of `deltas` (None for fewer than two)."""
    if len(deltas) < 2:
        return None
    rng = random.Random(seed)
    n = len(deltas)
    means = sorted(statistics.fmean(rng.choices(deltas, k=n)) for _ in range(BOOTSTRAP_RESAMPLES))
    lo = means[int((1 - CONFIDENCE) / 2 * BOOTSTRAP_RESAMPLES)]
    hi = means[int((1 + CONFIDENCE) / 2 * BOOTSTRAP_RESAMPLES) - 1]
    return (lo, hi)


def _side(run: DiagnosisRun | None, scores: dict[str, tuple[int, float | None, str]]) -> Side:
    if run is None:
        return Side()
    return Side(
        run_id=run.run_id,
        status=run.status,
        release=run.release_decision or "",
        cost=run.cost,
        duration_ms=run.total_duration_ms,
        fingerprint=run.config_fingerprint,
        scores={name: value for name, (_v, value, _l) in scores.items()},
    )


def _kept_scores(item) -> dict[str, float | None]:
    """The scores the item kept (newest version of each evaluator)."""
    kept: dict[str, tuple[int, float | None]] = {}
    for s in item.scores or []:
        name, version = str(s.get("evaluator") or ""), int(s.get("version") or 0)
        if name and version >= kept.get(name, (-1, None))[0]:
            kept[name] = (version, s.get("value"))
    return {name: value for name, (_v, value) in kept.items()}


def experiment_results(experiment: Experiment, *, against: Experiment | None = None) -> Results:
    """`experiment` against its source runs, or, with `against` (an experiment on the same dataset
    version: two configurations of the incident benchmark), against that experiment's replays."""
    if against is not None and against.dataset_id != experiment.dataset_id:
        raise ValueError("the two experiments replayed different dataset versions")
    replays = list(experiment.replays.select_related("item").order_by("item__position"))
    other = {r.item_id: r.run_id for r in against.replays.all()} if against is not None else {}
    ids = [r.run_id for r in replays if r.run_id] + [r.item.source_run_id for r in replays]
    ids += [run_id for run_id in other.values() if run_id]
    runs = {r.run_id: r for r in DiagnosisRun.objects.filter(run_id__in=ids)}
    scores = scores_of(run_ids=ids)
    calls = _calls_of([r.run_id for r in replays if r.run_id])
    items: list[ItemResult] = []
    for replay in replays:
        item = replay.item
        source_id = other.get(item.pk, "") if against is not None else item.source_run_id
        source = runs.get(source_id)
        baseline = _side(source, scores.get(source_id, {}))
        if source is None and against is None:  # imported, or purged: the item's own snapshot is the baseline
            baseline = Side(
                run_id=item.source_run_id, release=item.release_decision, scores=_kept_scores(item)
            )
        candidate = _side(runs.get(replay.run_id), scores.get(replay.run_id, {}))
        result = ItemResult(item.position, item.question, baseline, candidate, error=replay.error)
        for call in calls.get(replay.run_id, []):
            if call.error_code == NOT_EXECUTED_REPLAY:
                result.not_executed.append(NotExecuted(call.tool_name, call.tool_call_id, call.error_message))
            elif call.tool_name not in result.ran:
                result.ran.append(call.tool_name)
        for name in sorted(set(baseline.scores) | set(candidate.scores)):
            a, b = baseline.scores.get(name), candidate.scores.get(name)
            result.deltas[name] = None if a is None or b is None else b - a
            if result.deltas[name] is not None and result.deltas[name] < 0:
                result.reasons.append(f"{name} {a:g} → {b:g}")
        if replay.error or not replay.run_id:
            result.reasons.append(f"replay failed ({replay.error or 'no run'})")
        elif baseline.release == ReleaseDecision.PUBLISHED and candidate.release != ReleaseDecision.PUBLISHED:
            result.reasons.append(f"release {baseline.release} → {candidate.release or candidate.status}")
        items.append(result)
    items.sort(key=lambda i: (not i.regressed, i.worst, i.position))
    return Results(experiment, items, _summaries(items), _totals(items))


def _calls_of(run_ids: list[str]) -> dict[str, list[ToolInvocation]]:
    """The replays' tool calls by run, in the order they were made."""
    out: dict[str, list[ToolInvocation]] = {}
    rows = ToolInvocation.objects.filter(run_id__in=run_ids).order_by("created_at", "id")
    for row in rows.only("run_id", "tool_name", "tool_call_id", "error_code", "error_message"):
        out.setdefault(row.run_id, []).append(row)
    return out


def _summaries(items: list[ItemResult]) -> list[EvaluatorSummary]:
    names = sorted({name for i in items for name in i.deltas})
    out = []
    for k, name in enumerate(names):
        pairs = [
            (i.baseline.scores[name], i.candidate.scores[name])
            for i in items
            if i.deltas.get(name) is not None
        ]
        deltas = [b - a for a, b in pairs]
        out.append(
            EvaluatorSummary(
                name=name,
                n=len(pairs),
                baseline_mean=statistics.fmean(a for a, _ in pairs) if pairs else None,
                candidate_mean=statistics.fmean(b for _, b in pairs) if pairs else None,
                mean_delta=statistics.fmean(deltas) if deltas else None,
                ci=bootstrap_ci(deltas, seed=k),
                worse=sum(1 for d in deltas if d < 0),
                better=sum(1 for d in deltas if d > 0),
            )
        )
    return out


def _totals(items: list[ItemResult]) -> dict[str, Any]:
    totals: dict[str, Any] = {
        "items": len(items),
        "regressions": sum(1 for i in items if i.regressed),
        "not_executed": sum(len(i.not_executed) for i in items),
    }
    for key in ("baseline", "candidate"):
        sides = [getattr(i, key) for i in items]
        priced = [s.cost for s in sides if s.cost is not None]
        durations = [s.duration_ms for s in sides if s.duration_ms is not None]
        totals[key] = {
            "published": sum(1 for s in sides if s.release == ReleaseDecision.PUBLISHED),
            "blocked": sum(1 for s in sides if s.release == ReleaseDecision.BLOCKED),
            "cost": sum(priced, Decimal(0)) if priced else None,
            "unpriced": len(sides) - len(priced),
            "median_ms": statistics.median(durations) if durations else None,
        }
    return totals
