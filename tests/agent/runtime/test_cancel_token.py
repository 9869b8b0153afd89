"""`CancelToken.race` (agent/runtime/cancel.py) on a token already cancelled: RunCancelled, and the
coroutine it was given is closed without running (a model call created just as the run was cancelled
used to be left un-awaited: "coroutine … was never awaited")."""

import asyncio
import inspect

import pytest

from agent.runtime.cancel import CancelToken, RunCancelled


def test_race_on_a_cancelled_token_closes_the_coroutine_unstarted():
    started = []

    async def call():
        started.append(1)
        return "answer"

    async def main():
        token = CancelToken()
        token.cancel("user pressed stop")
        coro = call()
        with pytest.raises(RunCancelled, match="user pressed stop"):
            await token.race(coro)
        return coro

    coro = asyncio.run(main())
    assert inspect.getcoroutinestate(coro) == inspect.CORO_CLOSED and started == []


def test_race_on_a_live_token_returns_the_result():
    async def main():
        async def call():
            return "answer"

        return await CancelToken().race(call())

    assert asyncio.run(main()) == "answer"
