"""Figures of the bench: spreads over repetitions and the result rows of the table, and the harness's
own collector kept out of what it measures (`harness_uncollected`)."""

from __future__ import annotations

import contextlib
import gc
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@contextlib.contextmanager
def harness_uncollected():
    """This harness process (B3's clients, its provider) kept out of the cyclic collector's full passes
    while it measures: its heap (Django, the harness) frozen after a collection. A full pass over it
    took 150-180 ms in the clients' process, in which no client read its socket, so every frame then
    in flight arrived that late and counted as the server's delay (one pass in a 25-chat level put 146
    of 7,500 draft frames over 50 ms and the level's p99 at 116 ms; the server's loop lag stayed under
    10 ms). Whatever the harness builds while it measures is still collected."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@dataclass(frozen=True)
class Spread:
    """Median, min and max of one figure over the repetitions of a scenario."""

    median: float
    low: float
    high: float
    n: int

    def fmt(self, digits: int = 2, unit: str = "") -> str:
        return (
            f"{self.median:.{digits}f}{unit} ({self.low:.{digits}f}–{self.high:.{digits}f}{unit}, n={self.n})"
        )


def spread(values: Sequence[float]) -> Spread:
    vals = list(values)
    if not vals:
        return Spread(float("nan"), float("nan"), float("nan"), 0)
    return Spread(statistics.median(vals), min(vals), max(vals), len(vals))


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by nearest rank."""
    vals = sorted(values)
    if not vals:
        return float("nan")
    rank = max(1, min(len(vals), math.ceil(q / 100 * len(vals))))
    return vals[rank - 1]


def timed(fn: Callable[[], object]) -> float:
    """Seconds `fn()` took (perf_counter)."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


@dataclass
class Row:
    """One line of the results table.

    `ratio` is the figure the target is about (median/min/max over repetitions); `goal` is "max" when
    the ratio must stay at or below `target`, "min" when it must reach at least `target`.
    """

    bench: str
    name: str
    result: str
    ratio: Spread | None
    target: float | None
    goal: str = "max"
    ratio_unit: str = "×"
    note: str = ""
    extra: dict = field(default_factory=dict)
    met_override: bool | None = None

    @property
    def met(self) -> bool | None:
        if self.met_override is not None:
            return self.met_override
        if self.ratio is None or self.target is None:
            return None
        if self.goal == "max":
            return self.ratio.median <= self.target
        return self.ratio.median >= self.target

    @property
    def target_text(self) -> str:
        if self.target is None:
            return "–"
        return f"{'≤' if self.goal == 'max' else '≥'} {self.target:g}{self.ratio_unit}"

    @property
    def ratio_text(self) -> str:
        if self.ratio is None:
            return "–"
        return self.ratio.fmt(2, self.ratio_unit)

    @property
    def met_text(self) -> str:
        return {True: "yes", False: "**no**", None: "–"}[self.met]
