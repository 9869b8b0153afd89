"""A recorder's concurrent decisions go to the pool thread of its previous job while that one runs."""

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


def test_a_recorders_next_job_queues_behind_its_previous_one_on_the_same_thread():
    workers = _Workers(3, 1)
    release = threading.Event()
    recorder = _Recorder()

    async def scenario():
        loop = asyncio.get_running_loop()
        home = workers.pick(recorder.decide)
        assert recorder.chain.lock.home is home
        busy = home.call(loop, lambda: release.wait(5))
        # The home thread is busy: a plain job goes to an idle thread, the recorder's behind its previous.
        assert workers.pick(lambda: None) is not home
        assert workers.pick(recorder.decide) is home
        assert workers.pick(recorder.chain.flush) is home  # the chain's own methods too
        release.set()
        await busy

    try:
        asyncio.run(scenario())
    finally:
        release.set()
        for w in workers.threads:
            w.stop(wait=True)
