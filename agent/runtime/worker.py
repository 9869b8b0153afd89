"""The queue worker: execute queued runs (AI Ops analyses) with no client connected.

A worker claims the oldest queued run (`services.claim_next_queued`, under the same lease and fencing
epoch as any run) and hands it to the process's supervisor (`launch`, passed in, so this module does not
import the supervisor). It never has more than `concurrency` runs calling models or tools at once, and
claims a finishing run's successor early, launched behind a gate (`execute_run(on_finishing=…,
gate=…)`); a claimed run is always launched. It runs in every server process as a background duty, or
alone in `manage.py run_worker`; a run no worker took is failed by the sweeper (`QUEUE_EXPIRED`).
Details: docs/aiops.md, *The queue and its workers*.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from agent.runtime.db import db
from agent.runtime.executor import lease_owner
from diagnosis import services

logger = logging.getLogger(__name__)


Launch = Callable[..., asyncio.Task]  # supervisor.launch(run_id, *, claimed=run, on_finishing=, gate=)


class _Slots:
    """This worker's runs: the tasks it launched, which of them are finishing, and which finishing ones
    have a successor already."""

    def __init__(self, launch: Launch, capacity: int) -> None:
        self.launch = launch
        self.capacity = max(1, capacity)
        self.tasks: set[asyncio.Task] = set()
        self.finishing: set[asyncio.Task] = set()
        self.handed_over: set[asyncio.Task] = set()  # finishing tasks whose successor is launched
        self.wake = asyncio.Event()
        self.launched = 0

    def live(self) -> set[asyncio.Task]:
        done = {t for t in self.tasks if t.done()}
        if done:
            self.tasks -= done
            self.finishing -= done
            self.handed_over -= done
        return self.tasks

    def _occupied(self) -> int:
        """Slots in use: a finishing task whose successor is launched hands its slot to that one."""
        live = self.live()
        return len(live - self.handed_over)

    def _free_soon(self) -> asyncio.Task | None:
        """A finishing task without a successor (its slot is free as soon as it ends)."""
        return next(iter((self.finishing & self.live()) - self.handed_over), None)

    def wants_claim(self) -> bool:
        return self._occupied() < self.capacity or self._free_soon() is not None

    def start(self, run) -> None:
        """Launch `run`: at once into a free slot, else gated behind a finishing run's end."""
        gate: asyncio.Event | None = None
        predecessor = self._free_soon() if self._occupied() >= self.capacity else None
        if predecessor is not None:
            gate = asyncio.Event()
            self.handed_over.add(predecessor)
            predecessor.add_done_callback(lambda _task, gate=gate: gate.set())
        # (Without a free slot or a predecessor — never, as `wants_claim` was asked just before and
        # slots only free up meanwhile — the run is launched at once: a claim is never left unserved.)
        launched: list[asyncio.Task] = []

        def finishing() -> None:  # called by the run's task, after `launch` returned it
            self.finishing.update(launched)
            self.wake.set()

        launched.append(self.launch(run.run_id, claimed=run, on_finishing=finishing, gate=gate))
        self.tasks.update(launched)
        self.launched += 1


async def fill(slots: _Slots, stop: asyncio.Event | None = None) -> int:
    """Claim queued runs while `slots` has room (a free slot, or a finishing run without a successor)
    and `stop` is not set, and launch each at once; returns how many were launched."""
    before = slots.launched
    while slots.wants_claim() and not (stop is not None and stop.is_set()):
        run = await db(services.claim_next_queued, owner=lease_owner())
        if run is None:
            break
        logger.info("queued run claimed run=%s flow=%s", run.run_id, run.agent_flow)
        slots.start(run)
    return slots.launched - before


async def work(
    *,
    launch: Launch,
    concurrency: int,
    poll_interval: float,
    stop: asyncio.Event | None = None,
    until_idle: bool = False,
) -> int:
    """Claim and execute queued runs until `stop` is set (or, with `until_idle`, until the queue is empty
    and this worker's runs have ended). Returns the number of runs it launched."""
    slots = _Slots(launch, concurrency)
    stop = stop or asyncio.Event()
    while not stop.is_set():
        slots.wake.clear()
        try:
            await fill(slots, stop)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a database hiccup must not end the worker
            logger.warning("queue poll failed error=%s", type(exc).__name__)
        live = set(slots.live())
        if until_idle and not live:
            # Nothing of ours is running: leave once the queue is empty; otherwise (a claim that failed,
            # a run another worker is about to take) wait a poll interval and claim again.
            if not await db(services.queued_runs().exists):
                break
            await asyncio.sleep(poll_interval)
            continue
        waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(slots.wake.wait())]
        try:
            await asyncio.wait([*live, *waiters], timeout=poll_interval, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
    if until_idle:
        for task in list(slots.tasks):
            await asyncio.shield(task)
    return slots.launched
