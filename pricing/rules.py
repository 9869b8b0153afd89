"""The pricing rule: what one model call cost, and what a run cost. The one home of it.

A call is priced from the run's provider, the call's model and its reported usage, at the run's creation
date: a `CallCost` whose `amount` is a `Decimal` in US dollars, or None with a `status` saying why
(`demo`, `usage_unavailable`, `unknown_model`; never 0 for a price not known). An override
(`pricing.models.PriceOverride`) wins over `genai-prices` (its bundled snapshot, no network). A run's
cost (`RunCost`) is the sum of its calls' when every call started was priced, else None with the count
of unpriced calls. Details: docs/admin.md, *Cost*.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from diagnosis.models import DEMO_PROVIDER

MTOK = Decimal(1_000_000)
CURRENCY = "USD"


class CostStatus:
    """How a call's or a run's cost was decided (the stored `DiagnosisRun.cost_status`; "" = not priced
    yet: recorded before pricing, or its pricing failed)."""

    NOT_PRICED = ""
    PRICED = "priced"
    UNAVAILABLE = "unavailable"  # a run with at least one call that could not be priced
    USAGE_UNAVAILABLE = "usage_unavailable"
    UNKNOWN_MODEL = "unknown_model"
    DEMO = "demo"

    RUN_CHOICES = (
        (NOT_PRICED, "not priced"),
        (PRICED, "priced"),
        (UNAVAILABLE, "unavailable"),
        (DEMO, "demo"),
    )


@dataclass(frozen=True, slots=True)
class Rate:
    """Prices per million tokens (US dollars)."""

    input: Decimal
    cached_input: Decimal
    output: Decimal


@dataclass(frozen=True, slots=True)
class Override:
    """One `PriceOverride` row as the rule reads it."""

    id: int
    model_pattern: str
    provider: str
    rate: Rate
    effective_from: dt.datetime
    effective_to: dt.datetime | None

    def matches(self, *, provider: str, model: str, at: dt.datetime) -> bool:
        if self.provider and self.provider.lower() != (provider or "").lower():
            return False
        if not (self.effective_from <= at and (self.effective_to is None or at < self.effective_to)):
            return False
        return fnmatch.fnmatchcase((model or "").lower(), self.model_pattern.lower())

    @property
    def specificity(self) -> tuple[int, int, int]:
        literal = sum(1 for ch in self.model_pattern if ch not in "*?[]")
        exact = not any(ch in self.model_pattern for ch in "*?[")
        return (1 if self.provider else 0, 1 if exact else 0, literal)


@dataclass(frozen=True, slots=True)
class CallTokens:
    """The counts the rule prices (None where the provider did not report them)."""

    prompt: int | None
    completion: int | None
    total: int | None = None
    reasoning: int | None = None
    cached: int | None = None
    available: bool = True

    @classmethod
    def from_details(cls, details: dict[str, Any]) -> CallTokens:
        """From a MODEL_TOKEN_USAGE event's details (`Usage.as_details`)."""

        def num(key: str) -> int | None:
            value = details.get(key)
            return None if value is None or isinstance(value, bool) else int(value)

        return cls(
            prompt=num("promptTokens"),
            completion=num("completionTokens"),
            total=num("totalTokens"),
            reasoning=num("reasoningTokens"),
            cached=num("cachedTokens"),
            available=bool(details.get("usageAvailable")),
        )

    @classmethod
    def from_usage(cls, usage: Any) -> CallTokens:
        """From a usage record as `audit.verify.reconcile.CallUsage` (or the recorder's `Usage`) holds it."""
        return cls(
            prompt=usage.prompt_tokens,
            completion=usage.completion_tokens,
            total=usage.total_tokens,
            reasoning=usage.reasoning_tokens,
            cached=usage.cached_tokens,
            available=bool(usage.available),
        )

    def priced_counts(self) -> tuple[int, int, int] | None:
        """(uncached input, cached input, output) or None when the call cannot be priced."""
        if not self.available or self.prompt is None:
            return None
        completion = self.completion
        if completion is None and self.total is not None:
            completion = self.total - self.prompt
        if completion is None or completion < 0:
            return None
        cached = min(max(self.cached or 0, 0), self.prompt)
        output = completion
        if self.reasoning is not None and self.reasoning > completion:
            output = completion + self.reasoning  # reported beside the completion, not inside it
        return self.prompt - cached, cached, output


@dataclass(frozen=True, slots=True)
class CallCost:
    amount: Decimal | None
    status: str
    source: str = ""  # "override" | "genai-prices" | ""
    rate: Rate | None = None
    override_id: int | None = None
    matched_model: str = ""  # the genai-prices model id the name matched

    @property
    def label(self) -> str:
        if self.amount is not None:
            return format_usd(self.amount)
        return {
            CostStatus.DEMO: "demo (no price)",
            CostStatus.USAGE_UNAVAILABLE: "unavailable (usage not reported)",
            CostStatus.UNKNOWN_MODEL: "unavailable (model not priced)",
        }.get(self.status, "unavailable")


@dataclass(frozen=True, slots=True)
class RunCost:
    amount: Decimal | None
    status: str
    priced_calls: int
    unpriced_calls: int


def format_usd(amount: Decimal | None) -> str:
    """`$0.000740` style: six decimals below a cent, else four (never rounds a non-zero cost to 0)."""
    if amount is None:
        return "—"
    if amount == 0:
        return "$0"
    places = Decimal("0.000001") if abs(amount) < Decimal("0.01") else Decimal("0.0001")
    shown = amount.quantize(places)
    if shown == 0:
        return f"<${places}"
    return f"${shown.normalize():f}" if shown == shown.to_integral() else f"${shown}"


class PriceBook:
    """The overrides in force (loaded once per book) and `genai-prices`' bundled table."""

    def __init__(self, overrides: Iterable[Override] = ()):
        self.overrides = tuple(overrides)

    def override_for(self, *, provider: str, model: str, at: dt.datetime) -> Override | None:
        matching = [o for o in self.overrides if o.matches(provider=provider, model=model, at=at)]
        if not matching:
            return None
        return max(matching, key=lambda o: (o.specificity, o.effective_from, o.id))

    def price_call(self, *, provider: str, model: str, tokens: CallTokens, at: dt.datetime) -> CallCost:
        if (provider or "").lower() == DEMO_PROVIDER:
            return CallCost(None, CostStatus.DEMO)
        counts = tokens.priced_counts()
        if counts is None:
            return CallCost(None, CostStatus.USAGE_UNAVAILABLE)
        uncached, cached, output = counts
        override = self.override_for(provider=provider, model=model, at=at)
        if override is not None:
            rate = override.rate
            amount = (uncached * rate.input + cached * rate.cached_input + output * rate.output) / MTOK
            return CallCost(amount, CostStatus.PRICED, "override", rate, override.id)
        return _genai_price(model=model, uncached=uncached, cached=cached, output=output, at=at)

    def price_run(
        self, *, provider: str, calls: Sequence[tuple[str, CallTokens]], started_calls: int, at: dt.datetime
    ) -> tuple[RunCost, list[CallCost]]:
        """`calls`: (model, tokens) of each stored usage record; `started_calls` the run's `model_calls`
        (calls counted as they started; those never recorded cannot be priced)."""
        costs = [self.price_call(provider=provider, model=m, tokens=t, at=at) for m, t in calls]
        return run_cost(provider=provider, costs=costs, started_calls=started_calls), costs


def run_cost(*, provider: str, costs: Sequence[CallCost], started_calls: int) -> RunCost:
    priced = [c.amount for c in costs if c.amount is not None]
    unpriced = max(started_calls, len(costs)) - len(priced)
    if (provider or "").lower() == DEMO_PROVIDER:
        return RunCost(None, CostStatus.DEMO, 0, unpriced)
    if unpriced:
        return RunCost(None, CostStatus.UNAVAILABLE, len(priced), unpriced)
    return RunCost(sum(priced, Decimal(0)), CostStatus.PRICED, len(priced), 0)


def _genai_price(*, model: str, uncached: int, cached: int, output: int, at: dt.datetime) -> CallCost:
    from genai_prices import Usage, calc_price

    if _unknown_to_genai_prices(model):
        return CallCost(None, CostStatus.UNKNOWN_MODEL)
    try:
        result = calc_price(
            Usage(input_tokens=uncached + cached, cache_read_tokens=cached, output_tokens=output),
            model,
            genai_request_timestamp=at,
        )
    except LookupError:
        return CallCost(None, CostStatus.UNKNOWN_MODEL)
    prices = result.model_price
    rate = None
    if isinstance(prices.input_mtok, Decimal) and isinstance(prices.output_mtok, Decimal):
        cache = prices.cache_read_mtok if isinstance(prices.cache_read_mtok, Decimal) else prices.input_mtok
        rate = Rate(prices.input_mtok, cache, prices.output_mtok)
    return CallCost(
        Decimal(result.total_price),
        CostStatus.PRICED,
        "genai-prices",
        rate,
        matched_model=f"{result.provider.id}/{result.model.id}",
    )


class _Unknown:
    """Model names `genai-prices` does not know, per data snapshot. Its lookup caches the models it finds
    but searches every provider again for one it does not (a self-hosted model, the bench's): 14-170 µs
    of CPU per priced call, several per run. A snapshot never learns a model, so a name it did not find
    stays unknown until the snapshot is replaced (a custom one installed: the set starts again). Bounded:
    cleared when it holds `LIMIT` names."""

    LIMIT = 1024

    def __init__(self) -> None:
        self.snapshot: object = None
        self.names: set[str] = set()


_unknown = _Unknown()


def _unknown_to_genai_prices(model: str) -> bool:
    from genai_prices.data_snapshot import get_snapshot

    snapshot = get_snapshot()
    if snapshot is not _unknown.snapshot:
        _unknown.snapshot, _unknown.names = snapshot, set()
    if model in _unknown.names:
        return True
    try:
        snapshot.find_provider_model(model, None, None, None)  # what `calc_price` looks up first
    except LookupError:
        if len(_unknown.names) >= _Unknown.LIMIT:
            _unknown.names.clear()
        _unknown.names.add(model)
        return True
    return False


__all__ = [
    "CURRENCY",
    "CallCost",
    "CallTokens",
    "CostStatus",
    "Override",
    "PriceBook",
    "Rate",
    "RunCost",
    "format_usd",
    "run_cost",
]
