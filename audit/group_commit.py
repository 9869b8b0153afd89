"""Group commit of concurrent recorders: many runs' decisions written in one transaction (record layer).

When many runs record at once (hundreds of coroutines of one process awaiting their writes on the
runtime's database pool), each decision as its own transaction pays one durable COMMIT (a redo-log
flush) per decision. The `GroupCommitter` lets writers that arrive while a COMMIT is in flight share the
next one, the way database servers group-commit their own log:

* **leader / followers.** A writer hands its `WriteOp` to `submit` and blocks. If no batch is being
  written, it becomes the *leader*: it takes every pending op (its own included), writes them with
  `audit.write_ops.execute` on **its own thread's connection** in one transaction (one multi-row INSERT
  per table, the UPDATEs one by one), commits once, then resolves every op of the batch. Writers that
  arrived meanwhile queue up; when the leader is done it promotes the first of them, which leads the next
  batch. With one writer at a time this is exactly the direct path (no hand-off, no extra thread);
  under load the batch grows by itself. There is no background thread to start, stop or leak.
* **Durable before return.** `submit` returns only after the COMMIT that contains its op succeeded, so
  the recorder's rule "durable before the next decision" holds for every run.
* **One bad write never fails the others.** When a batch fails (a database error, or any other
  exception, e.g. a reasoning row whose encryption fails while its parameters are prepared) it is rolled
  back and retried op by op, each op in its own transaction, so only the op that really fails gets the
  error (and the recorder counts exactly that one as an audit write failure); the others commit.

Ops are taken only from callers whose connection is in autocommit mode: an op submitted from inside an
atomic block belongs to that caller's transaction and is written directly by the recorder (this is
also why group commit is invisible to pytest-django's transaction-wrapped tests).

`execute_wrapper(fn)` installs a Django execute wrapper on whichever connection writes batches while the
context is open (tests inject database faults through it). Switch: `settings.AUDIT_GROUP_COMMIT`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator

from django.db import connection

from audit.write_ops import WriteOp, execute

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
    def submit(self, op: WriteOp) -> None:
        """Write `op` as part of a group; returns once it committed, or with `op.error` set."""
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
        ops = [w.op for w in batch]
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
