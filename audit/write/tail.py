"""The one way anything but the run's own recorder writes to a run's chain: `append_to_finished_run`,
and the tail notes that get what it appended anchored (`note_appended`).

Reasoning purges and key rotations (`audit.write.governance`, also on a run still executing), reviews
and feedback append events, and rows they bind, after a run's `RUN_FINISHED`. Each append is fenced by
the lease epoch read from the run row under its lock (never assumed), and writes a tail note
(`audit.models.TailPending`) in its transaction, so the next checkpoint anchors the run's new head in a
run-tail leaf and `verify_audit` holds the run to every head anchored for it.
Details: docs/audit-integrity.md, *How runs get into the log* (a finished run's record can grow).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.utils import timezone

from audit.models import TailPending, TraceEvent
from audit.write.chain_writer import RunChain
from audit.write.ops import Insert
from audit.write.runtime_facts import ChainEvent
from diagnosis.models import DiagnosisRun

APPEND_ATTEMPTS = 5


class RunNotFinished(Exception):
    """Only a terminal run (SUCCESS, FAILED, CANCELLED) is appended to by others than its recorder."""


@dataclass(frozen=True, slots=True)
class Tail:
    """The locked run as an append finds it: its session, its current lease epoch and the sequence
    number its first appended event takes."""

    run_id: str
    session_id: str
    lease_epoch: int
    next_sequence: int


Compose = Callable[[Tail], tuple[Sequence[ChainEvent], Sequence[Insert]]]


def append_to_finished_run(
    *,
    run_id: str,
    events: Sequence[ChainEvent] = (),
    rows: Sequence[Insert] = (),
    compose: Compose | None = None,
    finished_only: bool = True,
) -> int:
    """Append `events` (and the rows `rows` they bind, written with them in one fenced op) at the head
    of the finished run `run_id`'s chain; returns the `sequence_no` of the last event appended.

    Contract:

    * runs inside the caller's transaction (RuntimeError when there is none), so the change the events
      describe and the events commit or roll back together; fail-closed, nothing is counted as an audit
      write failure and every error is raised;
    * locks the run row first (`SELECT … FOR UPDATE`: lock order run row, then the chain head), reads
      its session and its current `lease_epoch` there, and raises `RunNotFinished` unless the run is
      terminal; with `finished_only=False` (a reasoning purge or key rotation) also on a run still
      executing or waiting: the events then sit between its recorder's, which reloads the head it lost
      at its next write (`RunChain._attempt`), and a claim waits for the row lock;
    * then reads the chain head with a locking read (the newest committed head, also under REPEATABLE
      READ) and writes through a `RunChain` fenced by the epoch read under the lock: the epoch of the
      run's last claim (1 or more on any run the runtime executed), which no claim can move while the
      lock is held, so the write is never refused (`WriteFenced`) for a stale epoch (SQLite has no row
      locks: there the database serialises the writing transactions);
    * `compose`, instead of `events` and `rows`, builds them from the locked `Tail` when they depend on
      it (a review row stores its event's sequence number); it is called again on each attempt;
    * a sequence number taken meanwhile by a writer that did not take the row lock (IntegrityError)
      rolls the attempt back to its savepoint and retries from a fresh head, `APPEND_ATTEMPTS` times;
    * writes the run's tail note with the events (`note_appended`), so the next checkpoint anchors them.

    Every writer to a run's chain other than its recorder goes through here."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError(
            "events appended to a finished run are written inside the transaction of their change"
        )
    if (compose is None) == (not events):
        raise ValueError("give the events to append, or compose, not both")
    for attempt in range(1, APPEND_ATTEMPTS + 1):
        try:
            with transaction.atomic():
                run = (
                    DiagnosisRun.objects.select_for_update()
                    .only("run_id", "session_id", "status", "lease_epoch")
                    .get(run_id=run_id)
                )
                if finished_only and not run.is_terminal:
                    raise RunNotFinished(f"run {run_id} is still {run.status}")
                head = locked_head(run_id)
                tail = Tail(run_id, run.session_id, run.lease_epoch, head[0] + 1 if head else 1)
                appended, bound = compose(tail) if compose is not None else (events, rows)
                if not appended:
                    raise ValueError("nothing to append")
                writer = RunChain(
                    run_id=run_id, session_id=run.session_id, lease_epoch=run.lease_epoch, group_commit=False
                )
                last = writer.append_after(head, appended, bound)
                note_appended(run_id=run_id, sequence_no=last)
                return last
        except IntegrityError:
            if attempt == APPEND_ATTEMPTS:
                raise
    raise AssertionError("unreachable")


def locked_head(run_id: str) -> tuple[int, str, str] | None:
    """(sequence_no, hash, tag) of the run's newest event by a locking read — the newest committed head,
    also under REPEATABLE READ — or None for an empty chain. Callers hold the run row's lock first."""
    return (
        TraceEvent.objects.select_for_update()
        .filter(run_id=run_id)
        .order_by("-sequence_no")
        .values_list("sequence_no", "hash", "tag")
        .first()
    )


def note_appended(*, run_id: str, sequence_no: int) -> None:
    """Record that the run's chain now reaches `sequence_no` (inside the append's transaction, while its
    writer holds the run row's lock, so appenders to one run never race here)."""
    updated = TailPending.objects.filter(run_id=run_id, last_sequence_no__lt=sequence_no).update(
        last_sequence_no=sequence_no, noted_at=timezone.now()
    )
    if not updated and not TailPending.objects.filter(run_id=run_id).exists():
        TailPending.objects.create(run_id=run_id, last_sequence_no=sequence_no, noted_at=timezone.now())
