"""The serving loop's lag (`telemetry.loop_lag`): a callback that holds a real event loop shows as a
sample over 10 ms in the histogram /metrics serves, and a free loop's samples stay small; the bench
reads the bucket holding the p99 (`quantile`)."""

from __future__ import annotations

import asyncio
import time

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from telemetry import loop_lag
from telemetry.loop_lag import BUCKETS, LoopLag, quantile


def _held_loop_samples() -> LoopLag:
    lag = LoopLag()

    async def main():
        sampler = asyncio.create_task(lag.sample(0.005))
        await asyncio.sleep(0.1)  # a free loop
        time.sleep(0.04)  # a callback that holds the loop 40 ms
        await asyncio.sleep(0.05)
        sampler.cancel()

    asyncio.run(main())
    return lag


def _over(counts: list[int], seconds: float) -> int:
    return sum(c for bound, c in zip((*BUCKETS, float("inf")), counts, strict=True) if bound > seconds)


def test_a_callback_holding_the_loop_is_a_sample_over_ten_ms():
    counts, total = _held_loop_samples().snapshot()
    # The 40 ms hold is one sample of at least 30 ms (a loaded machine may add more late wake-ups).
    assert _over(counts, 0.03) >= 1 and total >= 0.03
    assert sum(counts) >= 10  # the free loop woke every 5 ms
    assert quantile(counts, 1.0) >= 0.04 > quantile(counts, 0.01)
    assert quantile([0] * len(counts), 0.99) != quantile([0] * len(counts), 0.99)  # nan without samples


@pytest.mark.django_db
def test_the_histogram_is_served_on_metrics(settings, monkeypatch):
    settings.METRICS_TOKEN = ""
    settings.METRICS_ALLOW_ANONYMOUS = True
    held = _held_loop_samples()
    monkeypatch.setattr(loop_lag.monitor, "counts", held.counts)
    text = Client().get("/metrics").content.decode()
    buckets = {
        s.labels["le"]: s.value
        for family in text_string_to_metric_families(text)
        if family.name == "diagnosis_event_loop_lag_seconds"
        for s in family.samples
        if s.name.endswith("_bucket")
    }
    assert buckets["+Inf"] == sum(held.counts)
    assert buckets["+Inf"] - buckets["0.01"] == _over(held.counts, 0.01) >= 1
