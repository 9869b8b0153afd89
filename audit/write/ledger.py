"""The run's token ledger as the recorder keeps it while the run executes (`recorder.ledger`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

from django.db import connection

from audit.models import EventType, TraceEvent
from audit.verify.reconcile import (
    SOURCES,
    CallUsage,
    KeptLedger,
    Reconciliation,
    reconcile,
    stored_usage,
    usage_counts,
)
from audit.write.rows import recover_connection
from audit.write.runtime_facts import Usage
from core.failover import lost_or_conflicted
from pricing.costs import cost_fields, load_price_book
from pricing.rules import CallTokens

logger = logging.getLogger("audit.write")


@dataclass(slots=True)
class TokenLedger:
    """The provider's report of every model call the recorder was given (`calls`, in order) and the
    number of calls counted when they started (`started`). Calls started but never reported (the
    process died during the call) count as calls without usage. Reasoning and cached-input sums are
    None when no call reported them."""

    calls: list[CallUsage] = field(default_factory=list)
    started: int = 0

    def restore(self, run_id: str, *, started: int) -> None:
        """The ledger of a run taken over: the usage events stored (one query), and the calls its row
        counted when they started (`started`: a call lost with its process stays in the count)."""
        for details in (
            TraceEvent.objects.filter(run_id=run_id, event_type=EventType.MODEL_TOKEN_USAGE)
            .order_by("sequence_no")
            .values_list("details", flat=True)
        ):
            self.calls.append(CallUsage.from_details(details))
        self.started = started

    def add(
        self, source: str, usage: Usage, step_index: int | None = None, agent_name: str | None = None
    ) -> None:
        self.calls.append(call_usage(source, usage, step_index, agent_name))

    @property
    def model_calls(self) -> int:
        return max(self.started, len(self.calls))

    @property
    def by_source(self) -> dict[str, int]:
        return {
            s: sum(c.total_tokens or 0 for c in self.calls if c.source == s and c.has_total) for s in SOURCES
        }

    @property
    def total(self) -> int:
        return sum(self.by_source.values())

    @property
    def reasoning(self) -> int | None:
        known = [c.reasoning_tokens for c in self.calls if c.reasoning_tokens is not None]
        return sum(known) if known else None

    @property
    def cached_input(self) -> int | None:
        known = [c.cached_tokens for c in self.calls if c.cached_tokens is not None]
        return sum(known) if known else None

    @property
    def unavailable_calls(self) -> int:
        return (self.model_calls - len(self.calls)) + sum(1 for c in self.calls if not c.has_total)

    def reconcile(self, run_id: str) -> tuple[Reconciliation, list[CallUsage] | None]:
        """This ledger compared with what is stored of run `run_id` (see `audit.verify.reconcile`), and
        the stored usage records (None when they cannot be read; then not reconciled)."""
        try:
            stored, steps = stored_usage(run_id)
        except Exception as exc:  # a read for the verdict: its failure only costs the verdict
            stored, steps = None, ()
            if lost_or_conflicted(exc):  # a read: once more on a new connection (a failover)
                if not connection.in_atomic_block:
                    connection.close()
                try:
                    stored, steps = stored_usage(run_id)
                except Exception as again:
                    exc = again
            if stored is None:
                logger.warning(
                    "ledger reconciliation read failed run=%s error=%s", run_id, type(exc).__name__
                )
                recover_connection()
                stored, steps = None, ()
        verdict = reconcile(
            stored=stored if stored is not None else [],
            steps=steps,
            started_calls=self.started,
            kept=self.kept(),
            reported=self.calls,
        )
        if stored is None:
            return replace(verdict, reconciled=False), None
        return verdict, stored

    def kept(self) -> KeptLedger:
        return KeptLedger(
            by_source=self.by_source,
            total=self.total,
            reasoning=self.reasoning,
            cached_input=self.cached_input,
            model_calls=self.model_calls,
            unavailable_calls=self.unavailable_calls,
        )


def call_usage(
    source: str, usage: Usage, step_index: int | None = None, agent_name: str | None = None
) -> CallUsage:
    return CallUsage(
        source=str(source),
        step_index=step_index,
        available=usage.available,
        **usage_counts(usage),
        agent_name=agent_name,
    )


def priced(
    run_id: str, provider: str, stored: list[CallUsage], *, started_calls: int, at: Any
) -> dict[str, Any]:
    """The run's cost columns (`pricing.costs`) from the usage records re-read for reconciliation,
    priced at the run's creation (`at`); fail-open: when the overrides cannot be read, the run stays not
    priced (`cost_status` "") for `verify_audit --refresh-facts` to price."""
    try:
        book = load_price_book()
        cost, _calls = book.price_run(
            provider=provider,
            calls=[(c.model or "", CallTokens.from_usage(c)) for c in stored],
            started_calls=started_calls,
            at=at,
        )
    except Exception as exc:  # a derived fact: its failure costs only the stored cost
        logger.warning("run pricing failed run=%s error=%s", run_id, type(exc).__name__)
        recover_connection()
        return {}
    return cost_fields(cost)
