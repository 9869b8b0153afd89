"""B3k (`python -m bench --only b3k`, not in the default set): a checkpointer pass beside live runs in one
process. Concurrent recorders make decisions through `db()` while a pass anchors waiting runs: on `db()`
unpaced (how the server ran it until 2026-12-07), on the duties' pool unpaced, on the duties' pool paced
(`periodic_checkpoint`'s `PACE_SECONDS`: the server's now), and with no pass; in turns, on one machine.
"""

from __future__ import annotations

import asyncio
import functools
import statistics
import time

from bench import b1_recording, workload
from bench.stats import percentile

VARIANTS = ("db pool, unpaced", "duties pool, unpaced", "duties pool, paced", "no pass")
START_S = 0.3  # the pass starts this long after the decisions
GAP_S = 0.02  # each recorder's pause between decisions (a chat's pace between its writes)


async def _load(recorders, inputs, variant: str) -> dict:
    from agent.runtime.db import db, duty
    from audit.transparency.log import PACE_SECONDS, checkpoint

    decisions: list[float] = []
    lags: list[float] = []
    stop = asyncio.Event()

    async def chat(rec) -> None:
        for decide in workload.decisions(rec, inputs):
            await asyncio.sleep(GAP_S)
            began = time.perf_counter()
            await db(decide)
            decisions.append(time.perf_counter() - began)

    async def lag() -> None:
        while not stop.is_set():
            began = time.perf_counter()
            await asyncio.sleep(0.002)
            lags.append(time.perf_counter() - began - 0.002)

    async def one_pass() -> float:
        await asyncio.sleep(START_S)
        began = time.perf_counter()
        if variant == "db pool, unpaced":
            await db(checkpoint, full_scan=True)
        elif variant == "duties pool, unpaced":
            await duty(checkpoint, full_scan=True)
        elif variant == "duties pool, paced":
            await duty(checkpoint, full_scan=True, pace=functools.partial(time.sleep, PACE_SECONDS))
        return time.perf_counter() - began

    await asyncio.gather(*(db(b1_recording._connect) for _ in range(16)))
    lagging = asyncio.create_task(lag())
    wall, *_ = await asyncio.gather(one_pass(), *(chat(r) for r in recorders))
    stop.set()
    await lagging
    return {
        "pass_ms": wall * 1e3,
        "p50_ms": percentile(decisions, 50) * 1e3,
        "p99_ms": percentile(decisions, 99) * 1e3,
        "max_ms": max(decisions) * 1e3,
        "lag_p99_ms": percentile(lags, 99) * 1e3,
        "lag_max_ms": max(lags) * 1e3,
    }


def measure(*, waiting: int = 150, chats: int = 50, reps: int = 3, log=print) -> dict[str, list[dict]]:
    """`reps` rounds of every variant in turns: `waiting` finished runs for the pass to anchor (recorded
    first, untimed), then `chats` recorders each making a run's decisions `GAP_S` apart."""
    from django.db import connections

    from agent.runtime.db import shutdown_pools
    from audit.write import RunRecorder
    from diagnosis import services

    session = services.create_session(owner=b1_recording.bench_user(), title="bench B3k")
    inputs = workload.make_inputs()
    results: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for rep in range(reps):
        for variant in VARIANTS:
            b1_recording.run_recorder(
                b1_recording.new_runs(session, waiting, f"b3k waiting {rep}"), inputs, group_commit=False
            )
            live = b1_recording.new_runs(session, chats, f"b3k live {rep}")
            connections.close_all()
            recorders = [RunRecorder.for_run(r, group_commit=True) for r in live]
            try:
                found = asyncio.run(_load(recorders, inputs, variant))
            finally:
                shutdown_pools()
            if variant == "no pass":  # anchor the waiting runs outside the measurement
                from audit.transparency.log import checkpoint

                checkpoint(full_scan=True)
            results[variant].append(found)
            log(f"  B3k {variant}: " + ", ".join(f"{k} {v:.1f}" for k, v in found.items()))
    return results


def markdown(results: dict[str, list[dict]]) -> str:
    lines = [
        "| variant | pass | decision p50 | decision p99 | decision max | loop lag p99 | loop lag max |",
        "|---|---|---|---|---|---|---|",
    ]
    for variant, found in results.items():

        def med(key: str, found: list[dict] = found) -> str:
            values = [f[key] for f in found]
            return f"{statistics.median(values):.0f} ms ({min(values):.0f}–{max(values):.0f})"

        lines.append(
            f"| {variant} | {med('pass_ms') if variant != 'no pass' else '–'} | {med('p50_ms')} | "
            f"{med('p99_ms')} | {med('max_ms')} | {med('lag_p99_ms')} | {med('lag_max_ms')} |"
        )
    return "\n".join(lines)
