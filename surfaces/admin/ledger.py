"""The run page's token ledger and cost: every model call's usage record (router, agent and guard) with
its cost, the sums per source against the run's ledger columns, the sums per calling agent, and the
recorder's own verdict with its reasons (`build_ledger`); the run's stored cost as the console words it
(`run_cost_label`, also used by the compare page).

Pure, like `surfaces.admin.run_page` which shows it: input is the trace read model, no query.
"""

from __future__ import annotations

from dataclasses import dataclass

from audit.models import EventType, UsageSource
from audit.read import Trace
from audit.verify.reconcile import CallUsage
from pricing.rules import CallCost, CostStatus, format_usd


@dataclass(slots=True)
class LedgerCall:
    sequence_no: int
    source: str
    agent: str
    model: str
    step_index: int | None
    available: bool
    prompt: int | None
    completion: int | None
    reasoning: int | None
    cached: int | None
    total: int | None
    # The call's cost by the pricing rule (`pricing.rules`): "$0.000740", or why it has none.
    cost: str = ""
    cost_priced: bool = False
    cost_title: str = ""


@dataclass(slots=True)
class LedgerRow:
    label: str
    ledger: int | None
    from_calls: int
    matches: bool


@dataclass(slots=True)
class AgentTokens:
    """One agent's line of the ledger: its calls and the tokens their usage records report."""

    agent: str
    calls: int
    without_usage: int
    tokens: int


@dataclass(slots=True)
class Ledger:
    rows: list[LedgerRow]
    calls: list[LedgerCall]
    by_agent: list[AgentTokens]
    reconciled: bool
    verdict: str
    problems: list[str]
    cost: str = ""  # the run's stored cost, or why it has none
    cost_priced: bool = False
    cost_note: str = ""


def _cost_title(cost: CallCost | None) -> str:
    """Where a call's price came from (the cell's tooltip)."""
    if cost is None or cost.amount is None:
        return ""
    rate = (
        f": ${cost.rate.input}/M in, ${cost.rate.cached_input}/M cached, ${cost.rate.output}/M out"
        if cost.rate
        else ""
    )
    origin = (
        f"override #{cost.override_id}" if cost.source == "override" else cost.matched_model or cost.source
    )
    return f"{cost.source} ({origin}){rate}"


def run_cost_label(run) -> tuple[str, bool, str]:
    """The run's stored cost as the console shows it: (text, priced, note)."""
    if run.cost is not None:
        return format_usd(run.cost), True, ""
    if run.cost_status == CostStatus.DEMO:
        return "demo", False, "the demo model has no price"
    if run.cost_status == CostStatus.UNAVAILABLE:
        n = run.cost_unpriced_calls
        return "unavailable", False, f"{n} call{'' if n == 1 else 's'} could not be priced"
    return "not priced", False, "not priced yet (verify_audit --refresh-facts prices it)"


def build_ledger(trace: Trace) -> Ledger:
    """Per-call usage from every MODEL_TOKEN_USAGE event (router, agent and guard), summed per source and
    compared with the run's ledger, and summed per calling agent (planner, executor, … one line each);
    the recorder's own verdict (`tokens_reconciled`) is shown with the reasons."""
    run = trace.run
    calls = []
    costs = {v.event.sequence_no: v.cost for v in trace.call_costs}
    for event in trace.timeline:
        if event.event_type != EventType.MODEL_TOKEN_USAGE:
            continue
        d = event.details or {}
        cost = costs.get(event.sequence_no)
        calls.append(
            LedgerCall(
                sequence_no=event.sequence_no,
                source=str(d.get("source") or "?"),
                agent=CallUsage.from_details(d).agent,
                model=str(d.get("model") or ""),
                step_index=d.get("stepIndex"),
                available=bool(d.get("usageAvailable")),
                prompt=d.get("promptTokens"),
                completion=d.get("completionTokens"),
                reasoning=d.get("reasoningTokens"),
                cached=d.get("cachedTokens"),
                total=d.get("totalTokens"),
                cost=cost.label if cost else "",
                cost_priced=bool(cost and cost.amount is not None),
                cost_title=_cost_title(cost),
            )
        )
    reported = [c for c in calls if c.available]
    unavailable = [c for c in calls if not c.available]

    def from_source(source: UsageSource) -> int:
        return sum(c.total or 0 for c in reported if c.source == source)

    # (label, the run's ledger column, the sum of the per-call records)
    sums = [
        ("router", run.tokens_router, from_source(UsageSource.ROUTER)),
        ("agent", run.tokens_agent, from_source(UsageSource.AGENT)),
        ("guard", run.tokens_guard, from_source(UsageSource.GUARD)),
        ("total", run.tokens_total, sum(c.total or 0 for c in reported)),
        ("↳ reasoning", run.tokens_reasoning, sum(c.reasoning or 0 for c in reported)),
        ("↳ cached input", run.tokens_cached_input, sum(c.cached or 0 for c in reported)),
    ]
    rows = [
        LedgerRow(label=label, ledger=ledger, from_calls=summed, matches=ledger == summed)
        for label, ledger, summed in sums
    ]
    problems: list[str] = []
    if unavailable:
        problems.append(
            f"{len(unavailable)} call(s) reported no usage: "
            + ", ".join(f"#{c.sequence_no} {c.source} {c.model}" for c in unavailable)
            + " — counted as unknown, never as 0"
        )
    if run.usage_unavailable_calls != len(unavailable):
        problems.append(
            f"the run counts {run.usage_unavailable_calls} call(s) without usage but the timeline holds "
            f"{len(unavailable)} such record(s)"
        )
    mismatched = [r.label for r in rows if not r.matches]
    if mismatched:
        problems.append(
            "per-call records do not add up to the run's ledger for: "
            + ", ".join(mismatched)
            + " (a usage record may be missing — see the audit summary)"
        )
    reconciled = bool(run.tokens_reconciled)
    if reconciled:
        verdict = (
            f"reconciled: {len(calls)} model call(s), each reported usage, and they add up to the totals"
        )
    elif problems:
        verdict = "not reconciled"
    else:
        verdict = "not reconciled (the run has no terminal ledger yet, or a usage write failed)"
    by_agent: dict[str, AgentTokens] = {}
    for c in calls:
        line = by_agent.setdefault(c.agent, AgentTokens(agent=c.agent, calls=0, without_usage=0, tokens=0))
        line.calls += 1
        line.without_usage += not c.available
        line.tokens += (c.total or 0) if c.available else 0
    cost, cost_priced, cost_note = run_cost_label(run)
    return Ledger(
        rows=rows,
        calls=calls,
        cost=cost,
        cost_priced=cost_priced,
        cost_note=cost_note,
        by_agent=list(by_agent.values()),
        reconciled=reconciled,
        verdict=verdict,
        problems=problems,
    )
