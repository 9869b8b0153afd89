"""Group commit of concurrent recorders: many runs' decisions written in one transaction (record layer).

Writers that arrive while a COMMIT is in flight share the next one: `GroupCommitter.submit` leads or
follows a batch on the calling thread; on an event loop the op joins the process's `BatchWriter`.
`submit` returns only after the COMMIT containing its op succeeded, and a failed batch is retried op by
op, so one bad write never fails the others. Ops from inside an atomic block bypass it. Switch:
`settings.AUDIT_GROUP_COMMIT` (off by default).
Details: docs/architecture.md, *Group commit (`group_commit.py`)*.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import greenlet
from django.db import connection, connections

from audit.write.ops import WriteOp, execute

logger = logging.getLogger(__name__)

MAX_BATCH_OPS = 128
# One batch in flight at a time: the next batch forms while this one commits.
MAX_LEADERS = 1


class _Waiter:
    """A queued op and the raw lock its writer sleeps on (held from creation, released to wake it:
    cheaper than an Event, whose Condition costs a Python-level notify per wake-up)."""

    __slots__ = ("done", "lead", "lock", "op")

    def __init__(self, op: WriteOp) -> None:
        self.op = op
        self.lock = threading.Lock()
        self.lock.acquire()
        self.done = False
        self.lead = False

    def wait(self) -> None:
        self.lock.acquire()

    def wake(self) -> None:
        self.lock.release()


class GroupCommitter:
    """Leader/follower group commit of `WriteOp`s; see the module docstring. Thread-safe."""

    def __init__(self, *, max_batch: int = MAX_BATCH_OPS, max_leaders: int = MAX_LEADERS) -> None:
        self.max_batch = max_batch
        self.max_leaders = max_leaders
        self._lock = threading.Lock()
        self._queue: list[_Waiter] = []
        self._leaders = 0
        self._wrappers: list[Callable] = []
        # Counters for benchmarks and tests (updated by the leader of each batch).
        self.batches = 0
        self.ops = 0
        self.largest_batch = 0
        self.retried_batches = 0

    # ------------------------------------------------------------------------------------------------
    def submit(self, op: WriteOp, *, autocommit: bool = False) -> None:
        """Write `op` as part of a group; returns once it committed, or with `op.error` set.

        Called inside a bridged job (`Bridged`: the runtime's `db()`), the op joins the process's
        next batch (`BatchWriter`) instead: the job is suspended, its pool thread is free for other
        runs' jobs, and it resumes once that batch committed. `autocommit`: the caller has just seen
        its connection outside any atomic block (not asked again)."""
        current = greenlet.getcurrent()
        if isinstance(current, Bridged) and (autocommit or not connection.in_atomic_block):
            current.suspend(Commit(op))
            return
        me = _Waiter(op)
        with self._lock:
            lead = self._leaders < self.max_leaders
            if lead:
                self._leaders += 1
            else:
                self._queue.append(me)
        if not lead:
            me.wait()
            if me.done:
                return
            # Promoted (and taken off the queue): this writer leads the next batch.
        self._lead(me)

    def _lead(self, me: _Waiter) -> None:
        """Write one batch: `me` and whatever is queued (up to `max_batch`), then hand leadership to the
        first writer still queued, or retire. Every waiter is woken exactly once: as done when its op
        was in a batch, or as the next leader (taken off the queue, so no other batch can hold it)."""
        with self._lock:
            batch = [me, *self._queue[: self.max_batch - 1]]
            del self._queue[: self.max_batch - 1]
        try:
            self._write_batch(batch)
        finally:
            # Whatever happened, every waiter of the batch is released and leadership passed on.
            for waiter in batch:
                waiter.done = True
                if waiter is not me:
                    waiter.wake()
            with self._lock:
                if self._queue and self._leaders <= self.max_leaders:
                    nxt = self._queue.pop(0)
                    nxt.lead = True
                    nxt.wake()
                else:
                    # Nothing queued, or `hold()` is open (its exit starts the next batch).
                    self._leaders -= 1

    def _write_batch(self, batch: list[_Waiter]) -> None:
        self.write_ops([w.op for w in batch])

    def write_ops(self, ops: list[WriteOp]) -> None:
        """Write `ops` in one transaction on this thread's connection; on any failure retry them one by
        one so that only a failing op gets its `error`. Never raises. (The thread leader's batch, and
        the batches of `BatchWriter`.)"""
        with self._lock:
            self.batches += 1
            self.ops += len(ops)
            self.largest_batch = max(self.largest_batch, len(ops))
        try:
            with self._wrapped():
                try:
                    execute(ops, connection)
                except Exception as exc:
                    # Database or not (an encryption error preparing one op's row, the write path
                    # itself): the batch rolled back; retried op by op, only the bad op fails.
                    _recover()
                    if len(ops) == 1:
                        ops[0].error = exc
                        return
                    self.retried_batches += 1
                    for op in ops:
                        try:
                            execute([op], connection)
                        except Exception as one:
                            _recover()
                            op.error = one
        except Exception as exc:
            # Installing the execute wrappers failed: every op still unresolved fails, none waits forever.
            logger.error("group commit batch failed error=%s", type(exc).__name__)
            for op in ops:
                if op.error is None:
                    op.error = exc

    # ------------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """While open, no batch starts: writers queue up (and wait). On exit the first queued writer
        leads a batch of everything queued. For tests and maintenance; never hold it for long."""
        with self._lock:
            self._leaders += self.max_leaders
        try:
            yield
        finally:
            with self._lock:
                self._leaders -= self.max_leaders
                if self._queue and self._leaders < self.max_leaders:
                    nxt = self._queue.pop(0)
                    nxt.lead = True
                    self._leaders += 1
                    nxt.wake()

    def queued(self) -> int:
        """Writers waiting for a batch (not counting the ones being written)."""
        with self._lock:
            return len(self._queue)

    @contextlib.contextmanager
    def execute_wrapper(self, wrapper: Callable) -> Iterator[None]:
        """Install `wrapper` (Django's execute-wrapper signature) on the connection writing each batch."""
        self._wrappers.append(wrapper)
        try:
            yield
        finally:
            self._wrappers.remove(wrapper)

    @contextlib.contextmanager
    def _wrapped(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for wrapper in list(self._wrappers):
                stack.enter_context(connection.execute_wrapper(wrapper))
            yield


def _recover() -> None:
    """Drop a connection the failure left unusable, so the next batch reconnects."""
    if not connection.in_atomic_block:
        connection.close_if_unusable_or_obsolete()


_committer: GroupCommitter | None = None
_committer_lock = threading.Lock()


def get_committer() -> GroupCommitter:
    """The process's group committer (one per process; batches are written by its callers' threads)."""
    global _committer
    if _committer is None:
        with _committer_lock:
            if _committer is None:
                _committer = GroupCommitter()
    return _committer


# ----------------------------------------------------------------------------------------------------
# The event loop's write path: bridged jobs and per-loop batches
# ----------------------------------------------------------------------------------------------------
@dataclass(slots=True)
class Commit:
    """A bridged job's request: write `op` in the loop's next batch, resume me once it committed."""

    op: WriteOp


@dataclass(slots=True)
class WaitFor:
    """A bridged job's request: resume me once `lock` (held by another job) was released."""

    lock: RecorderLock


class Bridged(greenlet.greenlet):
    """A synchronous job (ORM code, a recorder method) run by the runtime's `db()` on a pool thread that
    can **suspend** itself instead of blocking the thread: `GroupCommitter.submit` suspends with a
    `Commit`, `RecorderLock` with a `WaitFor`. `step()` runs the job until it finishes (returns
    `(True, value)`, or raises the job's exception) or suspends (returns `(False, request)`); the driver
    (`agent.runtime.db`) hands the request on (to the `BatchWriter`, or to the lock's waiters) and
    calls `step()` again **on the same thread** once it is served (a greenlet lives on the thread that
    started it). A job suspends only outside any atomic
    block, so the thread's connection holds no transaction of it while other jobs use that thread."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        super().__init__(self._body)
        self._fn = fn

    def _body(self) -> tuple[bool, Any]:
        return True, self._fn()

    def step(self) -> tuple[bool, Any]:
        return self.switch()

    def suspend(self, request: Commit | WaitFor) -> None:
        self.parent.switch((False, request))


class RecorderLock:
    """The re-entrant lock of one recorder (one run's decisions happen one at a time, in order).

    Owned by a greenlet: a plain thread (its main greenlet) or a `Bridged` job, which may be suspended
    while holding it (its decision waits for a batch). Another bridged job that wants it suspends with a
    `WaitFor` until it is released (never blocking a pool thread that the owner may need to resume on);
    a plain thread blocks as on `threading.RLock`, and so does a job inside an atomic block (it must not
    suspend with a transaction open on its thread's connection)."""

    __slots__ = (
        "_cond",
        "_depth",
        "_mutex",
        "_owner",
        "_sleepers",
        "_waiters",
        "home",
        "home_ended",
        "home_given",
    )

    def __init__(self) -> None:
        # The pool thread of this recorder's last job, and how many of its jobs were given to it and
        # ended there (`agent.runtime.db` sends the next job there while one has not ended, so one run's
        # concurrent decisions start in the order they were asked for). `home_given` is written by the
        # caller's loop, `home_ended` by the home thread only.
        self.home: Any = None
        self.home_given = 0
        self.home_ended = 0
        # The state is guarded by `_mutex` (entered as a C lock); `_cond`, on the same lock, is only
        # waited on and notified when a thread actually sleeps on it (`_sleepers`), which is rare: every
        # decision takes and releases this lock.
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        self._sleepers = 0
        self._owner: greenlet.greenlet | None = None
        self._depth = 0
        self._waiters: list[Callable[[], None]] = []

    def __enter__(self) -> RecorderLock:
        me = greenlet.getcurrent()
        while True:
            with self._mutex:
                if self._owner is None or self._owner is me:
                    self._owner = me
                    self._depth += 1
                    return self
                if not isinstance(me, Bridged) or connection.in_atomic_block:
                    # A thread, or a job inside a transaction (which must not suspend: other jobs
                    # would run in it): wait as on a thread lock, unless the owner can only resume
                    # on this very thread.
                    if self._owner.parent is me.parent and isinstance(self._owner, Bridged):
                        raise RuntimeError("recorder used concurrently inside a transaction")
                    self._sleepers += 1
                    try:
                        self._cond.wait()
                    finally:
                        self._sleepers -= 1
                    continue
            me.suspend(WaitFor(self))

    def __exit__(self, *exc: object) -> None:
        with self._mutex:
            if self._owner is not greenlet.getcurrent():
                raise RuntimeError("cannot release a recorder lock held by another job or thread")
            self._depth -= 1
            if self._depth:
                return
            self._owner = None
            waiters, self._waiters = self._waiters, []
            if self._sleepers:
                self._cond.notify_all()
        for wake in waiters:
            wake()

    def when_free(self, wake: Callable[[], None]) -> None:
        """Call `wake` (from any thread) once the lock is free; at once when it already is."""
        with self._mutex:
            if self._owner is not None:
                self._waiters.append(wake)
                return
        wake()


class BatchWriter:
    """Group commit of suspended jobs, off the event loop: pool threads queue the ops of their suspended
    jobs (`Commit`) with `commit(op, resume)`, and `writers` writer threads write what is queued in
    batches (`GroupCommitter.write_ops`: one transaction, one multi-row INSERT per table, op-by-op retry
    on failure; at most `max_batch` ops each), then call each op's `resume` once its batch committed (or
    with `op.error` set). `resume` queues the job's next step on the pool thread that holds it, so a
    decision costs the event loop one hand-off to the pool and one back, whatever its writes. While a
    batch is written the next one forms. A run has at most one op in flight (its job waits for it), so
    batches in flight never hold two ops of one run, and each run's decisions commit in order.
    Thread-safe; one per process (`agent.runtime.db`); `stop()` writes what is queued and ends the
    threads, each closing its own connection."""

    def __init__(self, committer: GroupCommitter, *, writers: int = 1, name: str = "audit-writer") -> None:
        self.committer = committer
        self.max_batch = committer.max_batch
        self._cond = threading.Condition(threading.Lock())
        self._pending: list[tuple[WriteOp, Callable[[], None]]] = []
        self._held = 0
        self._stopping = False
        self._threads = [
            threading.Thread(target=self._serve, name=f"{name}-{i}", daemon=True)
            for i in range(max(1, writers))
        ]
        for thread in self._threads:
            thread.start()

    def commit(self, op: WriteOp, resume: Callable[[], None]) -> None:
        """Queue `op`; `resume()` is called on a writer thread once it is durable, or with `op.error`
        set. Never raises; after `stop()` the op is written on the caller's thread."""
        with self._cond:
            if not self._stopping:
                self._pending.append((op, resume))
                if len(self._pending) == 1:
                    self._cond.notify()
                return
        self._write([(op, resume)])

    def queued(self) -> int:
        """Ops waiting for a batch (not counting the ones being written)."""
        with self._cond:
            return len(self._pending)

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """While open, no batch starts (ops queue up); on exit everything queued is written. For tests."""
        with self._cond:
            self._held += 1
        try:
            yield
        finally:
            with self._cond:
                self._held -= 1
                self._cond.notify_all()

    def stop(self, *, wait: bool = True) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if wait:
            for thread in self._threads:
                thread.join(timeout=5)

    def _serve(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._pending or (self._held and not self._stopping):
                        if self._stopping and not self._pending:
                            return
                        self._cond.wait()
                    batch = self._pending[: self.max_batch]
                    del self._pending[: self.max_batch]
                self._write(batch)
        finally:
            connections.close_all()

    def _write(self, batch: list[tuple[WriteOp, Callable[[], None]]]) -> None:
        try:
            self.committer.write_ops([op for op, _ in batch])
        finally:
            for _, resume in batch:
                try:
                    resume()
                except Exception as exc:  # a stopped pool: its job is gone with it
                    logger.error("group commit resume failed error=%s", type(exc).__name__)
