"""Token reconciliation: what is stored about a run's model calls, compared with the ledger that was kept.

`reconcile` re-reads the stored per-call records (usage events, step rows) and compares them with the
run's kept ledger and, when given, the provider's reports; it names every call whose records differ or
that lacks usage, in counts and call names only, never content. Calls started but never recorded count
as calls without usage, never dropped; unreported reasoning and cached tokens are None, never 0.
`RunRecorder.finish` runs it at the end, the trace again at read time.
Details: docs/api.md, *The token ledger (`run.tokens`)*.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SOURCES = ("ROUTER", "AGENT", "GUARD")
# The one field set of a model call's usage: (its key in a MODEL_TOKEN_USAGE record, the attribute of
# `audit.write.Usage`, of `CallUsage` and the column of the step row), in the order records list them.
USAGE_FIELDS = (
    ("promptTokens", "prompt_tokens"),
    ("completionTokens", "completion_tokens"),
    ("totalTokens", "total_tokens"),
    ("reasoningTokens", "reasoning_tokens"),
    ("cachedTokens", "cached_tokens"),
)
_LABEL = {"ROUTER": "router call", "GUARD": "semantic guard call"}
CHAT_AGENT_NAME = "diagnosis_agent"  # audit.models.CHAT_AGENT_NAME (this module imports no models)
_DEFAULT_AGENT = {"AGENT": CHAT_AGENT_NAME, "ROUTER": "router", "GUARD": "semantic_guard"}


def usage_counts(source: Any) -> dict[str, Any]:
    """The counts of `source` (a `Usage`, a `CallUsage`, a step row) by attribute, as they are."""
    return {attr: getattr(source, attr) for _key, attr in USAGE_FIELDS}


@dataclass(frozen=True, slots=True)
class TokenCounts:
    """Whether a model call reported usage, and its counts (`USAGE_FIELDS`, None when not reported,
    never 0): the fields the provider's report (`audit.write.Usage`) and a stored record's reading
    (`CallUsage`) share, declared once."""

    available: bool
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    reasoning_tokens: int | None = None
    cached_tokens: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CallUsage(TokenCounts):
    """One model call's usage as a usage record states it (camelCase keys of `Usage.as_details`).
    Built by keyword: its counts are `TokenCounts`'."""

    source: str
    step_index: int | None
    # The calling agent (`agentName`); records written before per-agent counters name none.
    agent_name: str | None = None
    # The model the call named (`model`; what `pricing` prices it by); not compared.
    model: str | None = None

    @classmethod
    def from_details(cls, details: Mapping[str, Any]) -> CallUsage:
        agent = details.get("agentName")
        return cls(
            source=str(details.get("source") or ""),
            step_index=_int(details.get("stepIndex")),
            available=bool(details.get("usageAvailable")),
            **{attr: _int(details.get(key)) for key, attr in USAGE_FIELDS},
            agent_name=str(agent) if agent else None,
            model=str(details["model"]) if details.get("model") else None,
        )

    @property
    def agent(self) -> str:
        """The calling agent; a record that names none is its source's only agent (the chat agent for
        AGENT, `router` and `semantic_guard` for the others)."""
        return self.agent_name or _DEFAULT_AGENT.get(self.source, self.source.lower())

    @property
    def step_key(self) -> tuple[str, int | None]:
        return (self.agent, self.step_index)

    @property
    def has_total(self) -> bool:
        return self.available and self.total_tokens is not None

    def counts(self) -> tuple:
        return (self.available, *(getattr(self, attr) for _key, attr in USAGE_FIELDS))


@dataclass(frozen=True, slots=True)
class KeptLedger:
    """The ledger the recorder kept while the run executed (the run's `tokens_*` columns)."""

    by_source: Mapping[str, int]
    total: int
    reasoning: int | None
    cached_input: int | None
    model_calls: int
    unavailable_calls: int


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """The verdict, the sums of the stored records and the named differences."""

    reconciled: bool
    model_calls: int
    stored_calls: int
    by_source: dict[str, int]
    total: int
    reasoning: int | None
    cached_input: int | None
    reasoning_unreported: int
    cached_unreported: int
    unavailable_calls: int
    without_usage: list[str] = field(default_factory=list)
    differences: list[str] = field(default_factory=list)
    lost_calls: int = 0
    # Tokens of the stored records per calling agent (`router`, `diagnosis_agent`, `planner`,
    # `executor`, `semantic_guard`), in the order the agents first called.
    by_agent: dict[str, int] = field(default_factory=dict)

    def notes(self) -> list[str]:
        """Sentences for the trace's gaps: each call without usage, then each difference."""
        named = self.without_usage[: len(self.without_usage) - (1 if self.lost_calls else 0)]
        lost = self.without_usage[len(named) :]
        return [f"{name} reported no token usage" for name in named] + lost + list(self.differences)


def call_names(calls: Sequence[CallUsage]) -> list[str]:
    """A readable name per call: `agent step N` (the chat agent), `planner step N` / `executor step N`
    (AI Ops agents), `router call N`, `semantic guard call N` (N counts the source's calls from 1 in
    order)."""
    seen: dict[str, int] = {}
    names = []
    for call in calls:
        seen[call.source] = seen.get(call.source, 0) + 1
        if call.source == "AGENT" and call.step_index is not None:
            agent = "agent" if call.agent == CHAT_AGENT_NAME else call.agent
            names.append(f"{agent} step {call.step_index}")
        else:
            names.append(f"{_LABEL.get(call.source, call.source.lower() + ' call')} {seen[call.source]}")
    return names


def _sum(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def reconcile(
    *,
    stored: Sequence[CallUsage],
    steps: Sequence[tuple[int, CallUsage]],
    started_calls: int = 0,
    kept: KeptLedger | None = None,
    reported: Sequence[CallUsage] | None = None,
) -> Reconciliation:
    """Compare the stored usage records (`stored`, in timeline order) with the agent step rows (`steps`:
    `(step_index, usage as the row states it, its `agent_name` set)`), the kept ledger and the
    provider's reports. A step row and a usage record belong together when they name the same agent
    and step index.

    `started_calls` is the number of model calls counted when they started; `reported`, when given, is
    the provider's usage of every call in the order the recorder received them.
    """
    names = call_names(stored)
    differences: list[str] = []
    without_usage = [name for name, call in zip(names, stored, strict=True) if not call.has_total]

    _step_differences(names, stored, steps, differences)
    recorded = len(stored)
    if reported is not None:
        _reported_differences(names, stored, reported, differences, without_usage)
        recorded = max(recorded, len(reported))

    model_calls = max(started_calls, recorded, kept.model_calls if kept else 0)
    lost = model_calls - recorded
    if lost:
        without_usage.append(
            f"{lost} model call{'' if lost == 1 else 's'} started but never recorded (no token usage)"
        )

    by_source = {
        s: sum(c.total_tokens or 0 for c in stored if c.source == s and c.has_total) for s in SOURCES
    }
    total = sum(by_source.values())
    by_agent: dict[str, int] = {}
    for c in stored:
        by_agent[c.agent] = by_agent.get(c.agent, 0) + ((c.total_tokens or 0) if c.has_total else 0)
    reasoning = _sum(c.reasoning_tokens for c in stored)
    cached = _sum(c.cached_tokens for c in stored)
    unreported_base = lost + (recorded - len(stored))
    reasoning_unreported = unreported_base + sum(1 for c in stored if c.reasoning_tokens is None)
    cached_unreported = unreported_base + sum(1 for c in stored if c.cached_tokens is None)
    unavailable = unreported_base + sum(1 for c in stored if not c.has_total)

    if kept is not None:
        differences += _ledger_differences(kept, by_source, total, reasoning, cached, unavailable)

    return Reconciliation(
        reconciled=not differences and not without_usage,
        model_calls=model_calls,
        stored_calls=len(stored),
        by_source=by_source,
        total=total,
        reasoning=reasoning,
        cached_input=cached,
        reasoning_unreported=reasoning_unreported,
        cached_unreported=cached_unreported,
        unavailable_calls=unavailable,
        without_usage=without_usage,
        differences=differences,
        lost_calls=lost,
        by_agent=by_agent,
    )


def _step_differences(
    names: list[str],
    stored: Sequence[CallUsage],
    steps: Sequence[tuple[int, CallUsage]],
    differences: list[str],
) -> None:
    """Each agent step row against the usage record of the same agent and step index."""
    by_step = {c.step_key: (n, c) for n, c in zip(names, stored, strict=True) if c.source == "AGENT"}
    for step_index, row in steps:
        entry = by_step.pop((row.agent, step_index), None)
        if entry is None:
            differences.append(f"{call_names([row])[0]}: step row has no usage record")
            continue
        name, call = entry
        for (_key, attr), got, want in zip(USAGE_FIELDS, row.counts()[1:], call.counts()[1:], strict=True):
            if got != want:
                differences.append(f"{name}: step row {attr} {got} differs from its usage record {want}")
        if row.available != call.available:
            differences.append(f"{name}: step row usage_available differs from its usage record")
    for name, _call in by_step.values():
        differences.append(f"{name}: usage record has no step row")


def _reported_differences(
    names: list[str],
    stored: Sequence[CallUsage],
    reported: Sequence[CallUsage],
    differences: list[str],
    without_usage: list[str],
) -> None:
    """The provider's report of each call against its stored usage record (a report never stored is a
    call without usage)."""
    stored_by_name = dict(zip(names, stored, strict=True))
    for name, call in zip(call_names(reported), reported, strict=True):
        kept_call = stored_by_name.get(name)
        if kept_call is None:
            differences.append(f"{name}: usage reported by the provider was not stored")
            without_usage.append(name)
        elif kept_call.counts() != call.counts():
            differences.append(f"{name}: stored usage differs from what the provider reported")


def _ledger_differences(
    kept: KeptLedger,
    by_source: dict[str, int],
    total: int,
    reasoning: int | None,
    cached: int | None,
    unavailable: int,
) -> list[str]:
    """The ledger the recorder kept against the totals of the stored usage records."""
    differences = []
    for source in SOURCES:
        if kept.by_source.get(source, 0) != by_source[source]:
            differences.append(
                f"ledger {source.lower()} tokens {kept.by_source.get(source, 0)} differ from the "
                f"stored usage records ({by_source[source]})"
            )
    if kept.total != total:
        differences.append(f"ledger total {kept.total} differs from the stored usage records ({total})")
    if kept.reasoning != reasoning:
        differences.append(
            f"ledger reasoning tokens {kept.reasoning} differ from the stored usage records ({reasoning})"
        )
    if kept.cached_input != cached:
        differences.append(
            f"ledger cached input tokens {kept.cached_input} differ from the stored usage records ({cached})"
        )
    if kept.unavailable_calls != unavailable:
        differences.append(
            f"ledger counts {kept.unavailable_calls} call(s) without usage, the stored records {unavailable}"
        )
    return differences


def _int(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def stored_usage(run_id: str) -> tuple[list[CallUsage], list[tuple[int, CallUsage]]]:
    """The run's stored usage records (timeline order) and agent step rows' token columns, in one
    query (a UNION ALL of the two tables)."""
    from django.db import connection

    from audit.models import AgentStep, EventType, TraceEvent

    q = connection.ops.quote_name
    step_cols = ("usage_available", *(attr for _key, attr in USAGE_FIELDS))
    # Identifiers come from the models and are quoted; values are parameters.
    sql = (
        f"SELECT 0, {q('sequence_no')}, {q('details')}, NULL, "  # noqa: S608
        f"{', '.join('NULL' for _ in step_cols)} "
        f"FROM {q(TraceEvent._meta.db_table)} WHERE {q('run_id')} = %s AND {q('event_type')} = %s "
        f"UNION ALL SELECT 1, {q('step_index')}, NULL, {q('agent_name')}, "
        f"{', '.join(q(c) for c in step_cols)} "
        f"FROM {q(AgentStep._meta.db_table)} WHERE {q('run_id')} = %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [run_id, str(EventType.MODEL_TOKEN_USAGE), run_id])
        rows = cursor.fetchall()
    events, steps = [], []
    for kind, order, details, agent_name, available, *counts in rows:
        if int(kind) == 0:
            data = json.loads(details) if isinstance(details, (str, bytes)) else details
            events.append((int(order), CallUsage.from_details(data or {})))
        else:
            usage = CallUsage(
                source="AGENT",
                step_index=int(order),
                available=bool(available),
                **{attr: _int(c) for (_key, attr), c in zip(USAGE_FIELDS, counts, strict=True)},
                agent_name=agent_name,
            )
            steps.append((int(order), usage))
    events.sort(key=lambda e: e[0])
    steps.sort(key=lambda s: (s[1].agent, s[0]))
    return [call for _seq, call in events], steps
