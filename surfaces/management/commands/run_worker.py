"""`manage.py run_worker [--concurrency N] [--until-idle]`: execute queued runs (AI Ops analyses).

The same queue worker every server process runs (`agent.runtime.worker`), in its own process: it
claims the oldest queued run under the run lease (`SELECT … FOR UPDATE SKIP LOCKED` on MariaDB), executes
up to `--concurrency` at once, and keeps polling until stopped (SIGINT/SIGTERM finish the runs in hand
first). `--until-idle` drains the queue and exits. The process also sweeps expired leases and, like a
server, appends finished runs to the transparency log, on the same intervals.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import connections

from agent.runtime import supervisor
from agent.runtime.llm import aclose_clients
from agent.runtime.worker import work


class Command(BaseCommand):
    help = "Execute queued AI Ops analyses (claims PENDING runs under the run lease)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--concurrency",
            type=int,
            default=max(1, int(settings.AIOPS_WORKER_CONCURRENCY)),
            help="runs executed at once (default AIOPS_WORKER_CONCURRENCY, at least 1)",
        )
        parser.add_argument(
            "--poll",
            type=float,
            default=float(settings.AIOPS_POLL_INTERVAL_SECONDS),
            help="seconds between looks at an empty queue",
        )
        parser.add_argument("--until-idle", action="store_true", help="drain the queue, then exit")

    def handle(self, *args, concurrency: int, poll: float, until_idle: bool, **options):
        async def main() -> int:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
                    loop.add_signal_handler(sig, stop.set)
            # The process's other duties, without its own queue duty: the loop below is the worker.
            supervisor.ensure_background(serve_queue=False)
            try:
                return await work(
                    launch=supervisor.launch,
                    concurrency=max(1, concurrency),
                    poll_interval=poll,
                    stop=stop,
                    until_idle=until_idle,
                )
            finally:
                await supervisor.stop_background()
                await aclose_clients()

        # As a server before it listens: the knowledge index built, this thread's connection closed (its
        # event loop runs here), what the process keeps out of the collector's passes.
        supervisor.warm_up()
        connections.close_all()
        supervisor.settle()
        launched = asyncio.run(main())
        self.stdout.write(f"worker stopped after {launched} run(s)")
