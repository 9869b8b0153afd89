"""The run's token ledger as the recorder keeps it while the run executes."""

from __future__ import annotations

from dataclasses import dataclass, field

from audit.verify.reconcile import SOURCES, CallUsage, KeptLedger, usage_counts
from audit.write.runtime_facts import Usage


@dataclass(slots=True)
class _Ledger:
    """The provider's report of every model call the recorder was given (`calls`, in order) and the
    number of calls counted when they started (`started`). Calls started but never reported (the
    process died during the call) count as calls without usage. Reasoning and cached-input sums are
    None when no call reported them."""

    calls: list[CallUsage] = field(default_factory=list)
    started: int = 0

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
