"""The review queue's rule: which finished runs need a human, as SQL over the run's own stored columns.

One home for the rule (the admin's queue page, its counts on the admin index, the stored flag):
`REASONS` (each a `Q` over `diagnosis_run` columns only, no join), reasons higher layers add at app start
(`register_reason`), and `needs_review_expression`, the stored, indexed `needs_review` flag rewritten by
whatever changes an input (`refresh_needs_review`). A review takes a run off the queue for good.
Details: docs/admin.md, *The review queue*.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from django.db.models import BooleanField, Case, Q, QuerySet, Value, When

from diagnosis.models import TERMINAL_RUN_STATUSES, AgentFlow, DiagnosisRun, ReleaseDecision
from diagnosis.selectors import PRODUCTION


@dataclass(frozen=True, slots=True)
class Reason:
    key: str
    label: str
    q: Q


# A list, so that a higher layer's reason registered at app start (`register_reason`) is seen by every
# module that imported it.
REASONS: list[Reason] = [
    Reason("blocked", "blocked by the guards", Q(release_decision=ReleaseDecision.BLOCKED)),
    Reason("downvoted", "voted down by a user", Q(downvoted=True)),
    Reason("audit_incomplete", "audit incomplete", Q(audit_complete=False)),
    Reason("unreconciled", "tokens not reconciled", Q(tokens_reconciled=False)),
    Reason("draft_delivered", "unverified draft delivered", Q(draft_chars__gt=0)),
    Reason("aiops_report", "AI Ops report", Q(agent_flow=AgentFlow.AI_OPS)),
]
REASON_KEYS = [r.key for r in REASONS]
# How many of REASONS are this module's own (the rest are registered by higher layers at app start).
OWN_REASONS = len(REASONS)


def register_reason(new: Reason) -> None:
    """Add a reason of a higher layer (an online evaluator's verdict: `evaluations.queue`), at app start,
    before the fact statements are compiled. Its `q` may read another table by the run's id (a
    subquery, never a join), so the flag stays one statement over the run's row."""
    if new.key in REASON_KEYS:
        return
    REASONS.append(new)
    REASON_KEYS.append(new.key)


def reason(key: str) -> Reason | None:
    return next((r for r in REASONS if r.key == key), None)


def any_reason(*, registered: bool = True) -> Q:
    """Any reason holds; `registered=False`: only this module's own (no other table read)."""
    q = Q(pk__in=[])
    for r in REASONS if registered else REASONS[:OWN_REASONS]:
        q |= r.q
    return q


def needs_review_expression(*, purpose: bool = True, registered: bool = True) -> Case:
    """The rule (module docstring) over the run's own columns. `purpose=False, registered=False` only
    for the migration that backfilled the flag before runs had a purpose (every run then was a
    production run) and before any higher layer's reason existed (no evaluation score then: reading
    `evaluations_score` there would make that migration depend on a later app's table)."""
    production = PRODUCTION if purpose else Q()
    return Case(
        When(
            Q(status__in=TERMINAL_RUN_STATUSES)
            & Q(reviewed_at__isnull=True)
            & production
            & any_reason(registered=registered),
            then=Value(True),
        ),
        default=Value(False),
        output_field=BooleanField(),
    )


def refresh_needs_review(*, runs: QuerySet | None = None, run_ids: Iterable[str] = ()) -> int:
    """Rewrite the stored flag of `runs` (or the runs `run_ids`); returns how many rows were updated."""
    if runs is None:
        runs = DiagnosisRun.objects.filter(run_id__in=list(run_ids))
    return runs.update(needs_review=needs_review_expression())


def annotate_reasons(queryset: QuerySet) -> QuerySet:
    """Each reason as a boolean `reason_<key>` computed by the database in the list's own query."""
    return queryset.annotate(
        **{
            f"reason_{r.key}": Case(
                When(r.q, then=Value(True)), default=Value(False), output_field=BooleanField()
            )
            for r in REASONS
        }
    )


def reasons_of(run) -> list[Reason]:
    """The reasons of a run annotated by `annotate_reasons`."""
    return [r for r in REASONS if getattr(run, f"reason_{r.key}", False)]


# --------------------------------------------------------------------------------------------------
# Reads: the queue in index order and its capped counts (`core.admin_lists`: no join, no full count)
# --------------------------------------------------------------------------------------------------
COUNT_CAP = 1000


def queued_runs(*, reason_key: str | None = None) -> QuerySet:
    """The queue, oldest first (`idx_run_needs_review`), each row with its reasons annotated; only
    `diagnosis_run` columns are read (the session is not joined)."""
    runs = DiagnosisRun.objects.filter(needs_review=True)
    chosen = reason(reason_key) if reason_key else None
    if chosen is not None:
        runs = runs.filter(chosen.q)
    return annotate_reasons(runs.order_by("created_at", "id"))


@dataclass(frozen=True, slots=True)
class QueueCount:
    key: str
    label: str
    count: int
    capped: bool

    @property
    def shown(self) -> str:
        return f"{self.count}+" if self.capped else str(self.count)


def queue_counts(*, cap: int = COUNT_CAP) -> tuple[QueueCount, list[QueueCount]]:
    """(all queued runs, per reason): each a capped count over the flag's index, one query each."""

    def count(key: str, label: str, runs: QuerySet) -> QueueCount:
        n = runs.order_by()[: cap + 1].count()
        return QueueCount(key, label, min(n, cap), n > cap)

    queued = DiagnosisRun.objects.filter(needs_review=True)
    total = count("", "need a human", queued)
    return total, [count(r.key, r.label, queued.filter(r.q)) for r in REASONS]
