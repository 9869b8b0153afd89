"""A serving process's shutdown is bounded (`agent.runtime.shutdown`): a background duty that does not end
when cancelled no longer keeps a drained process alive until its SIGKILL. The stage is left behind after
`SHUTDOWN_SECONDS` (at least `STAGE_FLOOR_SECONDS`), the later stages still run, and the warning names
the stage, the duty and where it is suspended (file:line), never a value."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from agent.runtime import duties, supervisor
from agent.runtime.shutdown import Deadline, awaiting, bounded

pytestmark = pytest.mark.django_db(transaction=True)

STUCK = "tests:stuck-duty"


def _stuck_job(release: asyncio.Event, entered: asyncio.Event):
    async def job() -> None:
        entered.set()
        while not release.is_set():
            try:
                await asyncio.sleep(0.02)  # a cancellation here is swallowed: the duty never ends
            except asyncio.CancelledError:
                if release.is_set():
                    raise

    return job


async def _shutdown_with_a_stuck_duty(monkeypatch, closed: list[str]) -> tuple[float, asyncio.Task]:
    release, entered = asyncio.Event(), asyncio.Event()
    duties.register(
        duties.Duty(name=STUCK, what="stuck", job=_stuck_job(release, entered), interval=lambda: 0.01)
    )
    monkeypatch.setattr(supervisor, "SHUTDOWN_SECONDS", 0.5)

    async def close_clients() -> None:
        closed.append("model clients")

    async def close_hub() -> None:
        closed.append("MCP sessions")

    monkeypatch.setattr(supervisor, "aclose_clients", close_clients)
    monkeypatch.setattr("agent.mcp.hub.aclose_hub", close_hub)
    try:
        supervisor.ensure_background()
        await asyncio.wait_for(entered.wait(), 10)
        (stuck,) = [t for t in supervisor._background.tasks if t.get_name() == STUCK]
        began = time.monotonic()
        assert await supervisor.shutdown() is False
        return time.monotonic() - began, stuck
    finally:
        release.set()
        duties._registered.pop(STUCK, None)


def test_a_duty_that_ignores_its_cancellation_holds_the_shutdown_only_until_the_deadline(monkeypatch, caplog):
    closed: list[str] = []
    caplog.set_level(logging.WARNING, logger="agent.runtime.shutdown")

    async def main() -> tuple[float, bool]:
        took, stuck = await _shutdown_with_a_stuck_duty(monkeypatch, closed)
        stuck.cancel()  # released, it ends at this cancellation
        await asyncio.wait({stuck}, timeout=5)
        return took, stuck.done()

    took, ended = asyncio.run(main())
    assert 0.9 <= took < 3.5, took  # the stuck stage: its floor (1 s, above the patched bound)
    # The stages after the stuck one still run, though it used the whole bound.
    assert closed == ["model clients", "MCP sessions"]
    assert ended
    (warning,) = [r.getMessage() for r in caplog.records if "did not end in time" in r.getMessage()]
    assert warning.startswith("shutdown: stopping the background duties did not end in time; left behind: ")
    assert "left behind: stopping the background duties at agent/runtime/supervisor.py:" in warning
    assert f"; {STUCK} at agent/runtime/supervisor.py:" in warning
    assert "tests/agent/runtime/test_shutdown.py:" in warning  # where the duty is suspended


def test_a_stage_that_ends_in_time_is_not_reported_and_its_failure_is_logged_by_class(caplog):
    caplog.set_level(logging.WARNING, logger="agent.runtime.shutdown")

    async def fails() -> None:
        raise ConnectionResetError("secret-bearing text")

    async def main() -> tuple[bool, bool]:
        deadline = Deadline(5)
        return await bounded("a quick stage", asyncio.sleep(0), deadline), await bounded(
            "a failing stage", fails(), deadline
        )

    assert asyncio.run(main()) == (True, True)
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["shutdown: a failing stage failed error=ConnectionResetError"]


def test_awaiting_follows_the_await_chain_into_awaited_tasks():
    async def inner(gate: asyncio.Event) -> None:
        await gate.wait()

    async def outer(gate: asyncio.Event) -> None:
        await asyncio.ensure_future(inner(gate))

    async def main() -> str:
        gate = asyncio.Event()
        task = asyncio.ensure_future(outer(gate))
        await asyncio.sleep(0.01)
        where = awaiting(task)
        gate.set()
        await task
        return where

    frames = asyncio.run(main()).split(" > ")
    assert frames[0].startswith("tests/agent/runtime/test_shutdown.py:"), frames  # outer
    assert frames[1].startswith("tests/agent/runtime/test_shutdown.py:"), frames  # inner, another task
    assert frames[-1].startswith("asyncio/locks.py:"), frames  # Event.wait, innermost last
