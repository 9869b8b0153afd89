"""The queue worker: execute queued runs (AI Ops analyses) with no client connected.

Queued runs are PENDING runs of a queued flow that nobody has claimed (`services.queued_runs`). A worker
claims the oldest one (`services.claim_next_queued`: `SELECT … FOR UPDATE SKIP LOCKED` on MariaDB, the
claim's conditional update on SQLite; the same lease and fencing epoch as any run) and hands it to the
process's supervisor to execute (`launch`, which is `supervisor.launch`: the run is then in the process's
registry, can be cancelled from any process, and its live events reach anyone who follows it; the
supervisor passes it in, so this module does not import the supervisor that runs it). A worker never holds
more than `concurrency` runs of its own at once; when one ends it claims the next.

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

from diagnosis import services
from diagnosis.runtime.db import db
from diagnosis.runtime.executor import lease_owner

logger = logging.getLogger(__name__)


Launch = Callable[..., asyncio.Task]  # supervisor.launch(run_id, *, claimed=run)


async def claim_and_launch(*, launch: Launch, capacity: int, mine: set[asyncio.Task]) -> int:
    """Claim queued runs until `mine` holds `capacity` live tasks or the queue is empty; returns how many
    were launched. `mine` keeps this worker's tasks (done ones are dropped)."""
    mine.difference_update({t for t in mine if t.done()})
    launched = 0
    while len(mine) < capacity:
        run = await db(services.claim_next_queued, owner=lease_owner())
        if run is None:
            break
        logger.info("queued run claimed run=%s flow=%s", run.run_id, run.agent_flow)
        mine.add(launch(run.run_id, claimed=run))
        launched += 1
    return launched


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
    mine: set[asyncio.Task] = set()
    total = 0
    stop = stop or asyncio.Event()
    while not stop.is_set():
        try:
            total += await claim_and_launch(launch=launch, capacity=max(1, concurrency), mine=mine)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a database hiccup must not end the worker
            logger.warning("queue poll failed error=%s", type(exc).__name__)
        live = {t for t in mine if not t.done()}
        if until_idle and not live:
            # Nothing of ours is running: leave once the queue is empty; otherwise (a claim that failed,
            # a run another worker is about to take) wait a poll interval and claim again.
            if not await db(services.queued_runs().exists):
                break
            await asyncio.sleep(poll_interval)
            continue
        waiters = [asyncio.ensure_future(stop.wait())]
        try:
            await asyncio.wait([*live, *waiters], timeout=poll_interval, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
    if until_idle:
        for task in list(mine):
            await asyncio.shield(task)
    return total
