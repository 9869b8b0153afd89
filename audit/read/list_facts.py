"""Stored per-run list facts: the one home of the list's "audit complete" rule, written and recomputed.

Lists read `DiagnosisRun.persisted_events/steps/tools` and `audit_complete` as columns instead of
recomputing them per row; this module is the rule as SQL over the stored audit rows (`fact_expressions`)
and everything that applies it: `fact_update_sql` / `fact_statements` (the recorder, with the run's
terminal row), `refresh_run_facts` (later changes), `annotate_recomputed` (what `verify_audit` compares).
The checks that need every row's content are the trace summary's (`audit.read.summarize`).
Details: docs/admin.md, *The run list* (audit complete).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from django.db import connections
from django.db.models import (
    BooleanField,
    Case,
    Count,
    Exists,
    IntegerField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.db.models.functions import Coalesce

from audit.models import AgentStep, EventType, ToolInvocation, ToolStatus, TraceEvent
from audit.verify.chain_digests import GOVERNANCE_EVENTS
from diagnosis.models import TERMINAL_RUN_STATUSES, DiagnosisRun, RunStatus
from diagnosis.review_queue import needs_review_expression, refresh_needs_review
from pricing.costs import cost_fields, load_price_book, price_of_run
from pricing.rules import CostStatus

COUNT_FIELDS = ("persisted_events", "persisted_steps", "persisted_tools")
FACT_FIELDS = (*COUNT_FIELDS, "audit_complete")
REFRESH_BATCH = 2000
COST_REFRESH_BATCH = 500


def _count(rows: QuerySet) -> Coalesce:
    counted = (
        rows.filter(run_id=OuterRef("run_id"))
        .order_by()
        .values("run_id")
        .annotate(n=Count("pk"))
        .values("n")[:1]
    )
    return Coalesce(Subquery(counted, output_field=IntegerField()), Value(0))


def fact_expressions(
    *,
    prefix: str = "",
    events=TraceEvent,
    steps=AgentStep,
    tools=ToolInvocation,
) -> dict[str, Any]:
    """The rule (see the module docstring) as expressions over a `DiagnosisRun` queryset, keyed by
    `prefix` + the stored field's name. The model arguments let the backfill migration pass its
    historical models."""
    n_events = _count(events.objects.exclude(event_type__in=GOVERNANCE_EVENTS))
    n_steps = _count(steps.objects.all())
    n_tools = _count(tools.objects.all())
    running_tool = tools.objects.filter(run_id=OuterRef("run_id"), status=ToolStatus.RUNNING)
    complete = Case(
        When(
            Q(status__in=TERMINAL_RUN_STATUSES)
            & Q(audit_write_failures=0)
            & ~Exists(running_tool)
            & ~(
                Q(status__in=(RunStatus.FAILED, RunStatus.CANCELLED))
                & (Q(release_decision__isnull=False) | ~Q(content=""))
            )
            & Q(expected_events=n_events)
            & Q(expected_steps=n_steps)
            & Q(expected_tools=n_tools),
            then=Value(True),
        ),
        default=Value(False),
        output_field=BooleanField(),
    )
    return {
        f"{prefix}persisted_events": n_events,
        f"{prefix}persisted_steps": n_steps,
        f"{prefix}persisted_tools": n_tools,
        f"{prefix}audit_complete": complete,
    }


def refresh_run_facts(*, runs: QuerySet[DiagnosisRun] | None = None, run_ids: Iterable[str] = ()) -> int:
    """Write the rule's facts on `runs` (or the runs `run_ids`), in primary-key batches of
    `REFRESH_BATCH`; returns how many rows were updated."""
    if runs is None:
        runs = DiagnosisRun.objects.filter(run_id__in=list(run_ids))
    updated = refresh_facts_of(runs)
    # The review queue's flag reads `audit_complete`: its own statement, after the facts.
    refresh_needs_review(runs=runs)
    return updated


def refresh_facts_of(runs: QuerySet, **models: Any) -> int:
    """`refresh_run_facts` for a queryset of any `DiagnosisRun` model (the migration's historical one);
    `models` as for `fact_expressions`."""
    updated = 0
    last = 0
    while True:
        ids = list(runs.filter(pk__gt=last).order_by("pk").values_list("pk", flat=True)[:REFRESH_BATCH])
        if not ids:
            return updated
        last = ids[-1]
        updated += runs.model.objects.filter(pk__in=ids).update(**fact_expressions(**models))


# A run id no real run has (ids are `[A-Za-z0-9_]`): where it lands in the compiled parameters is where
# a run's own id goes.
_RUN_ID_SLOT = "\x00run_id\x00"
_update_templates: dict[tuple[str, str, str], tuple[str, tuple, tuple[int, ...]]] = {}


def _run_update(
    name: str, values: Callable[[], dict[str, Any]], run_id: str, using: str
) -> tuple[str, tuple]:
    """`UPDATE diagnosis_run SET values() WHERE run_id = run_id`, compiled by the ORM once per database
    and statement `name` (compiling the subqueries and CASE expressions costs milliseconds, and every
    terminal and late write carries these statements); each call puts the run's id into the compiled
    parameters."""
    connection = connections[using]
    key = (name, using, connection.vendor)
    template = _update_templates.get(key)
    if template is None:
        from django.db.models.sql import UpdateQuery

        query = UpdateQuery(DiagnosisRun)
        query.add_q(Q(run_id=_RUN_ID_SLOT))
        query.add_update_values(values())
        sql, params = query.get_compiler(connection=connection).as_sql()
        slots = tuple(i for i, value in enumerate(params) if value == _RUN_ID_SLOT)
        template = _update_templates[key] = (sql, tuple(params), slots)
    sql, params, slots = template
    if not slots:
        raise AssertionError("the compiled run update names no run")
    values_out = list(params)
    for i in slots:
        values_out[i] = run_id
    return sql, tuple(values_out)


def fact_update_sql(run_id: str, *, using: str = "default") -> tuple[str, tuple]:
    """The rule as one `UPDATE` statement of the run `run_id` (SQL and parameters), for a caller that
    runs it inside its own transaction (every run's terminal write); compiled once (`_run_update`)."""
    return _run_update("facts", fact_expressions, run_id, using)


def fact_statements(run_id: str, *, using: str = "default") -> list[tuple[str, tuple]]:
    """The statements that rewrite the run's stored list facts in the caller's transaction: the rule of
    this module, then the review queue's flag (which reads the fact just written), each compiled once."""
    return [
        fact_update_sql(run_id, using=using),
        _run_update("needs_review", lambda: {"needs_review": needs_review_expression()}, run_id, using),
    ]


def annotate_recomputed(queryset: QuerySet[DiagnosisRun]) -> QuerySet[DiagnosisRun]:
    """The rule recomputed at read time, as `recomputed_persisted_events/steps/tools` and
    `recomputed_audit_complete` (subqueries of one SELECT)."""
    return queryset.annotate(
        **fact_expressions(prefix="recomputed_"), recomputed_needs_review=needs_review_expression()
    )


def disagreements(run: DiagnosisRun) -> list[str]:
    """How the run's stored facts differ from the recomputed ones (`annotate_recomputed` must have
    annotated `run`); empty when they agree. Worded without content. For a run not yet ended only
    `audit_complete` (False) is compared."""
    problems = []
    # Before the run ends its counts are not written yet (0): only the flags are compared. The review
    # queue's flag is recomputed from the run's stored columns (its rule: `diagnosis.review_queue`).
    for name in (*FACT_FIELDS, "needs_review") if run.is_terminal else ("audit_complete", "needs_review"):
        stored, recomputed = getattr(run, name), getattr(run, f"recomputed_{name}")
        if name in ("audit_complete", "needs_review"):
            stored, recomputed = bool(stored), bool(recomputed)
        if stored != recomputed:
            problems.append(f"stored {name} is {stored}, recomputed {recomputed}")
    return problems


def _usage_details_of(run_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    """The usage records' details of `run_ids`, per run in timeline order (one query)."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run_id, details in (
        TraceEvent.objects.filter(run_id__in=run_ids, event_type=EventType.MODEL_TOKEN_USAGE)
        .order_by("run_id", "sequence_no")
        .values_list("run_id", "details")
    ):
        out[run_id].append(details or {})
    return out


# The stored cost (`pricing.costs`): a list fact too, recomputed from the chained usage records.
def refresh_run_costs(*, run_ids: Iterable[str] | None = None, only_unpriced: bool = False) -> int:
    """Write the stored cost of the terminal runs `run_ids` (every terminal run when None; with
    `only_unpriced`, only those not priced yet), `COST_REFRESH_BATCH` runs per read; returns how many."""
    runs = DiagnosisRun.objects.filter(status__in=TERMINAL_RUN_STATUSES)
    if run_ids is not None:
        runs = runs.filter(run_id__in=list(run_ids))
    if only_unpriced:
        runs = runs.filter(cost_status=CostStatus.NOT_PRICED)
    book = load_price_book()
    written, last = 0, 0
    while True:
        batch = list(
            runs.filter(pk__gt=last)
            .order_by("pk")
            .only("pk", "run_id", "provider", "model_calls", "created_at", "status")[:COST_REFRESH_BATCH]
        )
        if not batch:
            return written
        last = batch[-1].pk
        details = _usage_details_of([r.run_id for r in batch])
        for run in batch:
            cost, _calls = price_of_run(run, details.get(run.run_id, []), book=book)
            written += DiagnosisRun.objects.filter(pk=run.pk).update(**cost_fields(cost))


__all__ = [
    "FACT_FIELDS",
    "annotate_recomputed",
    "disagreements",
    "fact_expressions",
    "fact_statements",
    "fact_update_sql",
    "refresh_run_costs",
    "refresh_run_facts",
]
