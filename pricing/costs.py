"""The rule of `pricing.rules` applied to stored records: the price book from the override table, a run's
cost from its MODEL_TOKEN_USAGE records, and the run's stored cost (`DiagnosisRun.cost`, `cost_status`,
`cost_unpriced_calls`) written and recomputed.

The recorder prices a run in the transaction of its terminal row (`audit.write.run.RunRecorder.finish`,
from the usage records it re-reads there for reconciliation, plus one query for the overrides). The stored
cost is a list fact like `audit_complete`: `verify_audit` recomputes it from the chained usage records
and reports a disagreement (an override edited after the run, a price table upgrade), and
`verify_audit --refresh-facts` (or `audit.read.list_facts.refresh_run_costs`) rewrites it. The usage
records are bound into the hash chain; the cost columns are derived and outside the run's digest.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from core.compiled import CompiledQuery
from diagnosis.models import DiagnosisRun
from pricing.models import PriceOverride
from pricing.rules import CallCost, CallTokens, CostStatus, Override, PriceBook, Rate, RunCost

COST_FIELDS = ("cost", "cost_status", "cost_unpriced_calls")


_OVERRIDE_COLUMNS = (
    "id",
    "model_pattern",
    "provider",
    "input_per_mtok",
    "cached_input_per_mtok",
    "output_per_mtok",
    "effective_from",
    "effective_to",
)
# Read on every trace: compiled once (`core.compiled`), rows as `values_list` gives them.
_OVERRIDES = CompiledQuery(lambda: PriceOverride.objects.values_list(*_OVERRIDE_COLUMNS))


def load_price_book() -> PriceBook:
    """The overrides as they are now (one query) over `genai-prices`' bundled table."""
    return PriceBook(
        Override(
            id=pk,
            model_pattern=pattern,
            provider=provider,
            rate=Rate(inp, cached if cached is not None else inp, out),
            effective_from=start,
            effective_to=end,
        )
        for pk, pattern, provider, inp, cached, out, start, end in _OVERRIDES.rows()
    )


def usage_calls(details_list: Iterable[dict[str, Any]]) -> list[tuple[str, CallTokens]]:
    """(model, tokens) of each MODEL_TOKEN_USAGE record's details, in the order given."""
    return [(str(d.get("model") or ""), CallTokens.from_details(d)) for d in details_list]


def price_of_run(
    run: DiagnosisRun, usage_details: Iterable[dict[str, Any]], *, book: PriceBook
) -> tuple[RunCost, list[CallCost]]:
    """The run's cost and each call's, from its usage records' details (timeline order)."""
    return book.price_run(
        provider=run.provider,
        calls=usage_calls(usage_details),
        started_calls=run.model_calls,
        at=run.created_at,
    )


def cost_fields(cost: RunCost) -> dict[str, Any]:
    """The stored columns of a run's cost."""
    return {"cost": cost.amount, "cost_status": cost.status, "cost_unpriced_calls": cost.unpriced_calls}


def cost_disagreements(run: DiagnosisRun, recomputed: RunCost) -> list[str]:
    """How the run's stored cost differs from `recomputed` (empty when it agrees or the run is not
    terminal). A run never priced (`cost_status` "") is not a disagreement: `verify_audit` notes it."""
    if not run.is_terminal or run.cost_status == CostStatus.NOT_PRICED:
        return []
    stored = (_q(run.cost), run.cost_status, run.cost_unpriced_calls)
    wanted = (_q(recomputed.amount), recomputed.status, recomputed.unpriced_calls)
    if stored == wanted:
        return []
    return [f"stored cost is {stored[0]} ({stored[1]}), recomputed {wanted[0]} ({wanted[1]})"]


def _q(value: Decimal | None) -> Decimal | None:
    # As the column stores it (10 decimal places).
    return None if value is None else Decimal(value).quantize(Decimal("1e-10"))


__all__ = [
    "COST_FIELDS",
    "cost_disagreements",
    "cost_fields",
    "load_price_book",
    "price_of_run",
    "usage_calls",
]
