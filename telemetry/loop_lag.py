"""Event-loop lag of this serving process: how late the loop runs what is due (issue 49, item 5).

With `LOOP_LAG_SAMPLE_MS` above 0, `start()` (called on the serving loop by `config.asgi`'s
`LoopLagMonitor`) runs one task that sleeps that long again and again and records each wake-up's
overshoot — the time the loop was busy with other callbacks — in a histogram on /metrics
(`diagnosis_event_loop_lag_seconds`): a callback holding the loop D ms shows as overshoots up to D ms.
Its cost is one timer wake-up per sample (≈ 200 a second at 5 ms, under 1 % of a core); off by default.
B3 reads the histogram around each level of its ramp (docs/performance.md, *B3 live chats*).
"""

from __future__ import annotations

import asyncio
import bisect
import threading
import time
from collections.abc import Iterator

from prometheus_client.core import HistogramMetricFamily

# Upper bounds of the histogram's buckets, seconds.
BUCKETS = (0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0)


class LoopLag:
    """Overshoot samples of one loop: counts per bucket (the last one: above every bound), their sum."""

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)
        self.total = 0.0
        self.loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def add(self, lag: float) -> None:
        with self._lock:
            self.counts[bisect.bisect_left(BUCKETS, lag)] += 1
            self.total += lag

    def snapshot(self) -> tuple[list[int], float]:
        with self._lock:
            return list(self.counts), self.total

    async def sample(self, interval: float) -> None:
        """Sleep `interval` again and again, recording how late each wake-up came (forever)."""
        clock = time.perf_counter
        while True:
            due = clock() + interval
            await asyncio.sleep(interval)
            self.add(max(0.0, clock() - due))

    def collect(self) -> Iterator[HistogramMetricFamily]:
        counts, total = self.snapshot()
        family = HistogramMetricFamily(
            "diagnosis_event_loop_lag_seconds",
            "How late this process's event loop woke a timer that fell due (LOOP_LAG_SAMPLE_MS apart).",
        )
        cumulative, buckets = 0, []
        for bound, n in zip(BUCKETS, counts, strict=False):
            cumulative += n
            buckets.append((str(bound), cumulative))
        buckets.append(("+Inf", cumulative + counts[-1]))
        family.add_metric([], buckets, sum_value=total)
        yield family


monitor = LoopLag()


def start(interval_ms: float) -> bool:
    """Start sampling the running loop every `interval_ms` (once per process; nothing when ≤ 0)."""
    if interval_ms <= 0 or monitor.loop is not None:
        return False
    monitor.loop = loop = asyncio.get_running_loop()
    task = loop.create_task(monitor.sample(interval_ms / 1000), name="loop-lag")
    _tasks.add(task)
    return True


_tasks: set[asyncio.Task] = set()  # a reference, so the task is not collected


def quantile(counts: list[int], q: float) -> float:
    """The upper bound (seconds) of the bucket holding quantile `q` of `counts` (a snapshot's, or the
    difference of two); inf when it falls in the last, open bucket; nan without samples."""
    n = sum(counts)
    if not n:
        return float("nan")
    rank, seen = q * n, 0
    for bound, c in zip((*BUCKETS, float("inf")), counts, strict=True):
        seen += c
        if seen >= rank:
            return bound
    return float("inf")
