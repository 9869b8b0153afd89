"""Database and blocking-work thread pools for the async runtime.

`db()` runs synchronous ORM work (recorder, selectors, the lease) on `RUNTIME_DB_THREADS` threads, each
with one connection, so a process holds at most that many connections however many runs are live; every
write is awaited before the run's next decision. Synchronous tools, network-bound duties (`background()`)
and the periodic database passes (`duty()`: no decision waits behind one) have pools of their own. Each job
checks its connection's health first, so a database restart costs a thread at most one failed job; under
group commit a job suspends on its write instead of blocking its thread. `shutdown_pools()` stops them all.
Details: docs/runtime.md, *Database work*; docs/architecture.md, *The recorder* (suspended writes).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import itertools
import queue
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from django.conf import settings
from django.db import DatabaseError, connections

from audit.write.group_commit import BatchWriter, Bridged, Commit, RecorderLock, get_committer

T = TypeVar("T")

IDLE_CLOSE_SECONDS = 300.0
PING_IDLE_SECONDS = 0.1

_lock = threading.Lock()
_pools: dict[str, ThreadPoolExecutor] = {}
_local = threading.local()
_workers: _Workers | None = None


class _Job:
    """One `db()` call on its pool thread: the job as a `Bridged` greenlet, and where its result goes
    (the caller's future, settled on the caller's loop through `_Completions`)."""

    __slots__ = ("done", "fn", "fut", "greenlet", "lock", "worker")

    def __init__(
        self,
        worker: _Worker,
        done: _Completions,
        fut: asyncio.Future,
        fn: Callable[[], Any],
        lock: RecorderLock | None = None,
    ) -> None:
        self.worker = worker
        self.done = done
        self.fut = fut
        self.fn = fn
        self.greenlet: Bridged | None = None
        # The recorder's lock of a recorder's job: its end is counted there (`_Workers.pick`).
        self.lock = lock

    def step(self) -> None:
        """Run the job on this (its) thread until it ends or suspends; hand a suspension's request on."""
        worker = self.worker
        try:
            if self.greenlet is None:
                self.greenlet = Bridged(self.fn)
            else:
                worker.suspended -= 1
            finished, value = _resume(self.greenlet)
        except BaseException as exc:
            self._ended()
            self.done.post(self.fut, False, exc)
            return
        if finished:
            self._ended()
            self.done.post(self.fut, True, value)
            return
        worker.suspended += 1
        if isinstance(value, Commit):
            worker.writer.commit(value.op, self.requeue)
        else:  # WaitFor (`Bridged.suspend` takes no other request)
            value.lock.when_free(self.requeue)

    def _ended(self) -> None:
        if self.lock is not None:
            self.lock.home_ended += 1  # before the result is posted: the loop then sees it ended
        self.worker.finished += 1

    def requeue(self) -> None:
        """Queue the job's next step on its thread (from any thread: the writer, a lock's releaser)."""
        self.worker.jobs.put(self)


class _Worker:
    """One database pool thread with its own job queue (a suspended job is resumed on the thread that
    holds it). Lighter than a one-thread `ThreadPoolExecutor` per call: a job is a queue entry and an
    asyncio future, and results reach the loop through `_Completions` (one wake-up for all the results
    that arrived meanwhile). Stopped, the thread still runs the jobs suspended on it to their ends."""

    def __init__(self, name: str, writer: BatchWriter) -> None:
        # Where this thread's suspended jobs send their writes: the pool's one writer.
        self.writer = writer
        self.jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        # Jobs handed to this thread and jobs that ended on it (a suspended job has not ended); each
        # counter is written by one thread only: `given` by the callers' loop, the others by this thread.
        self.given = 0
        self.finished = 0
        # Jobs suspended on this thread.
        self.suspended = 0
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def idle(self) -> bool:
        return self.given == self.finished

    def call(
        self, loop: asyncio.AbstractEventLoop, fn: Callable[[], T], lock: RecorderLock | None = None
    ) -> asyncio.Future[T]:
        fut = loop.create_future()
        self.given += 1
        if lock is not None:
            lock.home_given += 1
        self.jobs.put(_Job(self, _completions(loop), fut, fn, lock))
        return fut

    def _serve(self) -> None:
        stopping = False
        while True:
            if stopping and not self.suspended:
                connections.close_all()
                return
            job = self.jobs.get()
            if job is None:
                stopping = True
            else:
                job.step()

    def stop(self, *, wait: bool) -> None:
        """Close the thread's connections and end it once the jobs queued before have run and the jobs
        suspended on it have ended."""
        self.jobs.put(None)
        if wait:
            self.join()

    def join(self) -> None:
        self._thread.join(timeout=5)


class _Completions:
    """Results of pool jobs for one event loop, settled on the loop in arrival order; the loop is woken
    once per burst instead of once per result."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weak: this object is the value of a weak mapping keyed by the loop.
        self._loop = weakref.ref(loop)
        self._lock = threading.Lock()
        self._items: list[tuple[asyncio.Future, bool, Any]] = []

    def post(self, fut: asyncio.Future, ok: bool, value: Any) -> None:
        with self._lock:
            self._items.append((fut, ok, value))
            wake = len(self._items) == 1
        loop = self._loop()
        if wake and loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                loop.call_soon_threadsafe(self._settle)

    def _settle(self) -> None:
        with self._lock:
            items, self._items = self._items, []
        for fut, ok, value in items:
            if fut.done():  # the caller was cancelled
                continue
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)


_completion_sets: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Completions] = (
    weakref.WeakKeyDictionary()
)


def _completions(loop: asyncio.AbstractEventLoop) -> _Completions:
    found = _completion_sets.get(loop)
    if found is None:
        found = _completion_sets[loop] = _Completions(loop)
    return found


class _Workers:
    """The database pool: `size` `_Worker` threads and the `BatchWriter` their suspended jobs write
    through (its threads hold a connection only once they wrote a batch). A new job goes to the first
    idle thread (as a thread pool reuses its idle threads: one run at a time keeps using one thread and
    one connection), else round-robin."""

    def __init__(self, size: int, writers: int) -> None:
        self.writer = BatchWriter(get_committer(), writers=writers)
        self.threads = [_Worker(f"runtime-db-{i}", self.writer) for i in range(max(1, size))]
        self._turn = itertools.count()

    def submit(
        self, loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], job: Callable[[], T]
    ) -> asyncio.Future[T]:
        """Queue `job` (the pool's wrapper of `fn`) on the thread `pick(fn)` chooses."""
        lock = recorder_lock(fn)
        return self._pick(lock).call(loop, job, lock)

    def pick(self, fn: Callable[..., Any]) -> _Worker:
        """The thread a job of `fn` would go to (`submit` without queueing it)."""
        return self._pick(recorder_lock(fn))

    def _pick(self, lock: RecorderLock | None) -> _Worker:
        # A recorder's method goes behind its recorder's previous job while that one has not ended on
        # its thread: one run's concurrent decisions (parallel tool calls) then start in the order they
        # were asked for, as they would queue on the recorder's lock. Once every job of the recorder
        # ended, its next one goes where any job would: behind another run's job on a busy thread, a
        # run's decision waited for that job (every run's finish queued on one thread under B3's load).
        home = lock.home if lock is not None else None
        if home is not None and lock.home_given != lock.home_ended and home in self.threads:
            return home  # (not a stopped pool's)
        worker = next((w for w in self.threads if w.idle()), None)
        if worker is None:
            worker = self.threads[next(self._turn) % len(self.threads)]
        if lock is not None:
            lock.home = worker
        return worker


def recorder_lock(fn: Callable[..., Any]) -> RecorderLock | None:
    """The recorder's lock of a recorder's method: its chain's (`RunRecorder`, `Decisions`, `ToolCalls`,
    `Approvals` hold the chain as `.chain`; the chain itself holds it as `.lock`)."""
    owner = getattr(fn, "__self__", None)
    lock = getattr(getattr(owner, "chain", owner), "lock", None)
    return lock if isinstance(lock, RecorderLock) else None


def _db_workers() -> _Workers:
    global _workers
    workers = _workers
    if workers is None:
        with _lock:
            workers = _workers
            if workers is None:
                workers = _workers = _Workers(
                    int(settings.RUNTIME_DB_THREADS),
                    max(1, int(settings.AUDIT_BATCH_WRITERS)),
                )
    return workers


def batch_writer() -> BatchWriter:
    """The pool's group-commit batch writer for suspended jobs (counters and `hold()` for tests)."""
    return _db_workers().writer


def _pool(kind: str) -> ThreadPoolExecutor:
    pool = _pools.get(kind)
    if pool is None:
        with _lock:
            pool = _pools.get(kind)
            if pool is None:
                if kind in ("background", "evaluations", "duties"):
                    size = 1
                else:
                    size = int(
                        getattr(settings, "RUNTIME_DB_THREADS" if kind == "db" else "RUNTIME_TOOL_THREADS")
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
    """Run synchronous ORM code `fn(*args, **kwargs)` on the runtime's database pool and await it (a
    recorder decision: until it is durable; see "Suspended writes" above). Cancelled, the caller stops
    waiting; the job still runs to its end on its thread."""
    return await _db_workers().submit(
        asyncio.get_running_loop(), fn, functools.partial(_job, fn, args, kwargs)
    )


async def read(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """`db` for a function that only reads, so that nothing it did can have landed: after a lost connection
    or a Galera certification conflict (`core.failover`: a failover behind the proxy) it runs again, on a
    connection that answers a ping, up to `LOOK_UP_PAUSES` times (a run starting or resuming at a node
    kill is not failed by the read of its previous turns; docs/reliability.md)."""
    from core.failover import LOOK_UP_PAUSES, lost_or_conflicted

    try:
        return await db(fn, *args, **kwargs)
    except DatabaseError as exc:
        if not lost_or_conflicted(exc):
            raise
    for n, pause in enumerate(LOOK_UP_PAUSES, start=1):
        await asyncio.sleep(pause)
        try:
            return await db(_on_an_answering_connection, fn, *args, **kwargs)
        except DatabaseError as exc:
            if n == len(LOOK_UP_PAUSES) or not lost_or_conflicted(exc):
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def _on_an_answering_connection(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    _close_unanswering()
    return fn(*args, **kwargs)


def _resume(job: Bridged) -> tuple[bool, Any]:
    """Run `job` on this thread until it ends or suspends. A suspension counts as use of the thread's
    connection (it was just used), so the next job does not ping it as if it had been idle."""
    try:
        return job.step()
    finally:
        _local.last_used = time.monotonic()


async def background(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Run synchronous ORM code that also waits on the network (the trace exporter's OTLP requests) on
    a one-thread pool of its own, so that an outage it waits out never holds a thread of `db()`."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_pool("background"), functools.partial(_job, fn, args, kwargs))


async def duty(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Run a periodic duty's synchronous database pass (the checkpointer, the sweeper, the audit purge) on
    a one-thread pool of its own. On `db()` a long pass held every decision the pool queued behind it on
    the same thread for the whole pass (a checkpoint of 150 runs: a p99 of 0.5-1 s per decision at 50
    chats; docs/performance.md)."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_pool("duties"), functools.partial(_job, fn, args, kwargs))


async def evaluations_pass(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Run the online evaluators' pass (ORM work and LLM-judge calls) on a one-thread pool of its own,
    so a slow judge never delays the trace exporter nor holds a thread of `db()`."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_pool("evaluations"), functools.partial(_job, fn, args, kwargs))


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
    global _workers
    with _lock:
        pools = dict(_pools)
        _pools.clear()
        workers, _workers = _workers, None
    if workers is not None:
        # The pool threads first: their suspended jobs still need the writer to end.
        for worker in workers.threads:
            worker.stop(wait=False)
        if wait:
            for worker in workers.threads:
                worker.join()
        workers.writer.stop(wait=wait)
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
