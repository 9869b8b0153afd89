"""Verification of stored audit records, run by run, in bounded memory (`manage.py verify_audit`).

For each run: the timeline's hash chain and sequence numbers (`audit.integrity.verify_chain`: 1..n
without gap or repeat, `prev_hash` links, each hash recomputed from its own fields), and, for a finished
run, whether the stored events, steps and tools match what the recorder expected to write and whether
any audit write failed. Problems are worded without content (ids, sequence numbers, counts only).

Runs are read in primary-key batches and each batch's events in one query, so memory is bounded by the
batch size whatever the number of runs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

from django.db.models import Count

from audit.integrity import verify_chain
from audit.models import AgentStep, ToolInvocation, TraceEvent
from diagnosis.models import DiagnosisRun

RUN_BATCH = 200


@dataclass(slots=True)
class RunVerification:
    run_id: str
    events: int = 0
    chain_valid: bool = True
    invalid: list[str] = field(default_factory=list)  # tampering, deletion, reordering
    incomplete: list[str] = field(default_factory=list)  # lost writes of a finished run

    @property
    def ok(self) -> bool:
        return not self.invalid and not self.incomplete


def verify_run(run_id: str) -> RunVerification:
    """Verify one run (its events are checked even when the run row is missing)."""
    run = DiagnosisRun.objects.filter(run_id=run_id).first()
    events = list(TraceEvent.objects.filter(run_id=run_id).order_by("sequence_no"))
    if run is None:
        result = _check(run_id, events)
        result.incomplete.append("no run row for these events")
        return result
    counts = _counts([run_id])
    return _check(run_id, events, run=run, steps=counts[0][run_id], tools=counts[1][run_id])


def verify_all_runs(*, batch_size: int = RUN_BATCH) -> Iterator[RunVerification]:
    """Verify every run, oldest first, `batch_size` runs at a time."""
    last = 0
    while True:
        runs = list(DiagnosisRun.objects.filter(pk__gt=last).order_by("pk")[:batch_size])
        if not runs:
            return
        last = runs[-1].pk
        ids = [r.run_id for r in runs]
        by_run: dict[str, list[TraceEvent]] = defaultdict(list)
        for event in TraceEvent.objects.filter(run_id__in=ids).order_by("run_id", "sequence_no"):
            by_run[event.run_id].append(event)
        steps, tools = _counts(ids)
        for run in runs:
            yield _check(
                run.run_id,
                by_run.pop(run.run_id, []),
                run=run,
                steps=steps[run.run_id],
                tools=tools[run.run_id],
            )


def _counts(run_ids: list[str]) -> tuple[dict[str, int], dict[str, int]]:
    steps: dict[str, int] = defaultdict(int)
    tools: dict[str, int] = defaultdict(int)
    for row in AgentStep.objects.filter(run_id__in=run_ids).values("run_id").annotate(n=Count("id")):
        steps[row["run_id"]] = row["n"]
    for row in ToolInvocation.objects.filter(run_id__in=run_ids).values("run_id").annotate(n=Count("id")):
        tools[row["run_id"]] = row["n"]
    return steps, tools


def _check(
    run_id: str,
    events: list[TraceEvent],
    *,
    run: DiagnosisRun | None = None,
    steps: int = 0,
    tools: int = 0,
) -> RunVerification:
    verdict = verify_chain(events)
    result = RunVerification(run_id=run_id, events=verdict.events, chain_valid=verdict.valid)
    result.invalid.extend(verdict.problems)
    if run is not None and run.is_terminal:
        for label, stored, expected in (
            ("timeline event", len(events), run.expected_events),
            ("model step", steps, run.expected_steps),
            ("tool invocation", tools, run.expected_tools),
        ):
            if stored < expected:
                result.incomplete.append(f"{expected - stored} {label}(s) expected but not stored")
            elif stored > expected:
                result.incomplete.append(
                    f"{stored - expected} {label}(s) stored beyond the {expected} expected"
                )
        if run.audit_write_failures:
            result.incomplete.append(f"{run.audit_write_failures} audit write failure(s) recorded")
    return result
