"""The queue worker: execute queued runs (AI Ops analyses) with no client connected.

Queued runs are PENDING runs of a queued flow that nobody has claimed (`services.queued_runs`). A worker
claims the oldest one (`services.claim_next_queued`: `SELECT … FOR UPDATE SKIP LOCKED` on MariaDB, the
claim's conditional update on SQLite; the same lease and fencing epoch as any run) and hands it to the
process's supervisor to execute (`launch`, which is `supervisor.launch`: the run is then in the process's
registry, can be cancelled from any process, and its live events reach anyone who follows it; the
supervisor passes it in, so this module does not import the supervisor that runs it). A worker never
holds more than `concurrency` runs of its own at once, besides the successors of runs that are finishing.

**The hand-over overlaps the end of a run.** A run tells the worker when it has no model call or tool
left, only its last records (`execute_run(on_finishing=…)`: after the release, before the
self-evaluation and the terminal row). The worker then claims its next run at once and launches it
behind a gate (`execute_run(gate=…)`) that opens when the finishing run's task has ended: the new run
records its start (RUN_STARTED, the routing decision) while the other writes its end, and makes its
first model call only once the gate is open. So neither the claim's transaction nor the new run's first
records sit between one analysis and the next, and still at most `concurrency` runs of a worker call
models or tools at once (a finishing run has one successor at most). A claim is never left unserved:
the claimed run is launched at once, gated or not.

Where workers run:
* every server process, as a background duty (`supervisor.ensure_background`) when
  `AIOPS_WORKER_CONCURRENCY` > 0, polling every `AIOPS_POLL_INTERVAL_SECONDS`;
* `manage.py run_worker`, the same loop in its own process (for deployments that keep analyses off the
  web servers: set `AIOPS_WORKER_CONCURRENCY=0` on those), or `--until-idle` to drain the queue and exit.

A run that waits longer than `AIOPS_QUEUE_TIMEOUT_SECONDS` for any worker is failed by the sweeper
(`QUEUE_EXPIRED`), so an unserved queue shows up as failed runs rather than silence.
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


async def fill(slots: _Slots) -> int:
    """Claim queued runs while `slots` has room (a free slot, or a finishing run without a successor)
    and launch each at once; returns how many were launched."""
    before = slots.launched
    while slots.wants_claim():
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
            await fill(slots)
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
