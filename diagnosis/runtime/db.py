"""Database and blocking-work thread pools for the async runtime.

Recorder methods, selectors and the lease are synchronous Django ORM code. The runtime awaits them
through `db()`, which runs them on a small dedicated pool (`RUNTIME_DB_THREADS`, default 8): each pool
thread keeps one database connection, so however many runs are in flight (hundreds of coroutines in one
process) this process holds at most that many connections for audit writes. Every write is awaited
before the run takes its next decision. Synchronous tools run on a second bounded pool
(`RUNTIME_TOOL_THREADS`), so a slow tool can never starve the audit writes; `background()` runs duties
that wait on the network (the trace exporter) on a third, one-thread pool.

Pool threads live outside Django's request cycle, so nothing checks their connections between jobs the
way Django does around each request. `_job` does it instead, so that a restarted or unreachable database
costs at most one failed job per thread, never a thread that fails forever:

* a connection idle for longer than `IDLE_CLOSE_SECONDS` is closed before the next job and reopened
  lazily (the server may have dropped it meanwhile);
* a connection idle for longer than `PING_IDLE_SECONDS` is pinged before the next job and closed if the
  server does not answer (e.g. MariaDB was restarted between two runs), so the job reconnects; busy
  threads pay nothing;
* after a job during which a database error occurred, a connection that no longer answers is closed
  (Django's `close_if_unusable_or_obsolete`, as at the end of a request), so the next job reconnects.

`shutdown_pools()` closes every pool thread's connection and stops the pools; they are recreated on next
use (tests call it between cases).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from django.conf import settings
from django.db import connections

T = TypeVar("T")

IDLE_CLOSE_SECONDS = 300.0
PING_IDLE_SECONDS = 0.1

_lock = threading.Lock()
_pools: dict[str, ThreadPoolExecutor] = {}
_local = threading.local()


def _pool(kind: str) -> ThreadPoolExecutor:
    pool = _pools.get(kind)
    if pool is None:
        with _lock:
            pool = _pools.get(kind)
            if pool is None:
                if kind == "background":
                    size = 1
                else:
                    size = int(
                        getattr(settings, "RUNTIME_DB_THREADS" if kind == "db" else "RUNTIME_TOOL_THREADS", 8)
                    )
                pool = ThreadPoolExecutor(max_workers=max(1, size), thread_name_prefix=f"runtime-{kind}")
                _pools[kind] = pool
    return pool


def _job(fn: Callable[..., T], args: tuple, kwargs: dict) -> T:
    now = time.monotonic()
    last = getattr(_local, "last_used", None)
    if last is not None and now - last > IDLE_CLOSE_SECONDS:
        connections.close_all()
    elif last is not None and now - last > PING_IDLE_SECONDS:
        _close_unanswering()
    try:
        return fn(*args, **kwargs)
    finally:
        _after_errors()
        _local.last_used = time.monotonic()


def _close_unanswering() -> None:
    """Close this thread's open connections that do not answer a ping (they reconnect on next use)."""
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and not conn.in_atomic_block and not conn.is_usable():
            conn.close()


def _after_errors() -> None:
    """After a job that hit a database error: close a connection that is no longer usable."""
    for conn in connections.all(initialized_only=True):
        if conn.errors_occurred and not conn.in_atomic_block:
            conn.close_if_unusable_or_obsolete()


async def db(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Run synchronous ORM code `fn(*args, **kwargs)` on the runtime's database pool and await it."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_pool("db"), functools.partial(_job, fn, args, kwargs))


async def background(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Run synchronous ORM code that also waits on the network (the trace exporter's OTLP requests) on
    a one-thread pool of its own, so that an outage it waits out never holds a thread of `db()`."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_pool("background"), functools.partial(_job, fn, args, kwargs))


def run_blocking(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> asyncio.Future[T]:
    """Start blocking work `fn` (a synchronous tool) on the tool pool; returns the future to await.

    A Python thread cannot be killed: when the caller stops waiting (timeout, cancel), the call finishes
    in the background and its result is discarded.
    """
    loop = asyncio.get_running_loop()
    ctx = contextvars.copy_context()
    return loop.run_in_executor(_pool("tool"), functools.partial(ctx.run, _job, fn, args, kwargs))


def shutdown_pools(*, wait: bool = True) -> None:
    """Close every pool thread's database connections, then stop the pools (recreated on next use)."""
    with _lock:
        pools = dict(_pools)
        _pools.clear()
    for pool in pools.values():
        workers = len(getattr(pool, "_threads", ())) or 1
        barrier = threading.Barrier(workers)

        def close(barrier: threading.Barrier = barrier) -> None:
            # One job per thread: each waits for the others so that every thread closes its own.
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait(timeout=2)
            connections.close_all()

        for _ in range(workers):
            pool.submit(close)
        pool.shutdown(wait=wait)
