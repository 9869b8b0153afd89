"""The run's token ledger as the recorder keeps it while the run executes."""

from __future__ import annotations

from dataclasses import dataclass, field

from audit.models import UsageSource
from audit.recorder.facts import Usage


@dataclass(slots=True)
class _Ledger:
    """The run's token ledger: attempted totals and what the persisted per-call records add up to."""

    by_source: dict[str, int] = field(default_factory=lambda: {s.value: 0 for s in UsageSource})
    reasoning: int = 0
    cached_input: int = 0
    calls: int = 0
    unavailable_calls: int = 0
    persisted_calls: int = 0
    persisted_total: int = 0

    @property
    def total(self) -> int:
        return sum(self.by_source.values())

    def add(self, source: str, usage: Usage) -> None:
        self.calls += 1
        if not usage.available:
            self.unavailable_calls += 1
            return
        self.by_source[source] += usage.total_tokens or 0
        self.reasoning += usage.reasoning_tokens or 0
        self.cached_input += usage.cached_tokens or 0

    @property
    def reconciled(self) -> bool:
        return (
            self.unavailable_calls == 0
            and self.persisted_calls == self.calls
            and self.persisted_total == self.total
        )
