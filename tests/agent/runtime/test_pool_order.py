"""A recorder's concurrent decisions go to the pool thread of its previous job while that one has not
ended; once it has, the next goes where any job would, never behind another run's job."""

from __future__ import annotations

import asyncio
import threading

from agent.runtime.db import _Workers
from audit.write.group_commit import RecorderLock


class _Chain:
    def __init__(self) -> None:
        self.lock = RecorderLock()

    def flush(self) -> None:
        pass


class _Recorder:
    """Holds its chain as the recorder and its parts do (`RunRecorder.chain`, `Decisions.chain`)."""

    def __init__(self) -> None:
        self.chain = _Chain()

    def decide(self) -> None:
        pass


def _run(scenario, workers: _Workers, release: threading.Event) -> None:
    """Run `scenario` on a loop of its own, then end whatever it left waiting and stop the pool."""
    try:
        asyncio.run(scenario())
    finally:
        release.set()
        for w in workers.threads:
            w.stop(wait=True)


def test_a_recorders_next_job_queues_behind_its_previous_one_on_the_same_thread():
    workers = _Workers(3, 1)
    release = threading.Event()
    recorder = _Recorder()

    async def scenario():
        loop = asyncio.get_running_loop()
        busy = workers.submit(loop, recorder.decide, lambda: release.wait(5))
        home = recorder.chain.lock.home
        assert home in workers.threads
        # The home thread is busy: a plain job goes to an idle thread, the recorder's behind its previous.
        assert workers.pick(lambda: None) is not home
        assert workers.pick(recorder.decide) is home
        assert workers.pick(recorder.chain.flush) is home  # the chain's own methods too
        release.set()
        await busy

    _run(scenario, workers, release)


def test_a_recorders_next_job_does_not_queue_behind_another_runs_job_on_its_last_thread():
    """Its previous job ended: the thread it ran on, busy with another run's job, is not its home any
    more (every run's finish queued on one thread under load while a job of any run kept it busy)."""
    workers = _Workers(3, 1)
    release = threading.Event()
    recorder, other = _Recorder(), _Recorder()

    async def scenario():
        loop = asyncio.get_running_loop()
        await workers.submit(loop, recorder.decide, lambda: None)
        home = recorder.chain.lock.home
        # The other run's long job lands on the same (first idle) thread.
        busy = workers.submit(loop, other.decide, lambda: release.wait(5))
        assert other.chain.lock.home is home
        assert workers.pick(recorder.decide) is not home
        ran = await asyncio.wait_for(workers.submit(loop, recorder.decide, threading.current_thread), 2)
        assert ran.name != home._thread.name
        release.set()
        await busy

    _run(scenario, workers, release)
