"""Runs verified in chunks of primary keys, in this process or over worker processes
(`verify_audit --workers N`): each worker reads its chunks itself (on the replica when one is configured
and usable), and the verdicts come back in chunk order, so the output is the same whatever N. Memory
holds the chunk bounds (one pair per `batch_size` runs) and the chunks in flight.
Details: docs/audit-integrity.md, *Incremental and parallel verification*.
"""

from __future__ import annotations

import contextlib
import contextvars
import gc
import multiprocessing
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db import connection, connections

from audit.read.trace import timelines_of
from audit.verify.chunk_reads import runs_in_range, runs_with_pks
from audit.verify.provenance import CheckpointTimes, GovernanceView
from audit.verify.runs import ChunkRows, RunVerification, check_chunk, read_chunk
from core.db_router import primary_reads, replica_configured, replica_reads
from diagnosis.models import DiagnosisRun
from pricing.costs import load_price_book

# A chunk: ("range", first pk, last pk, runs between) or ("ids", pks) of chosen runs.
Chunk = tuple
# The most chunks a worker process takes at a time (`groups`): it reads each next one while it checks one.
GROUP = 4
T = TypeVar("T")


def range_chunks(batch_size: int) -> list[Chunk]:
    """The bounds of every `batch_size` runs in primary-key order (one pass over the index)."""
    chunks, first, count, last = [], None, 0, None
    for pk in DiagnosisRun.objects.order_by("pk").values_list("pk", flat=True).iterator(chunk_size=10_000):
        first = pk if first is None else first
        count, last = count + 1, pk
        if count == batch_size:
            chunks.append(("range", first, last, count))
            first, count = None, 0
    if first is not None:
        chunks.append(("range", first, last, count))
    return chunks


def id_chunks(run_ids: Iterable[str], batch_size: int) -> tuple[list[Chunk], set[str]]:
    """(chunks of the runs among `run_ids` that have a run row, in primary-key order; those runs' ids)."""
    ids = sorted(set(run_ids))
    pks: list[int] = []
    present: set[str] = set()
    for at in range(0, len(ids), 900):  # below SQLite's 999 parameters per query
        found = DiagnosisRun.objects.filter(run_id__in=ids[at : at + 900]).values_list("pk", "run_id")
        for pk, run_id in found:
            pks.append(pk)
            present.add(run_id)
    pks.sort()
    return [("ids", pks[at : at + batch_size]) for at in range(0, len(pks), batch_size)], present


@dataclass
class _Context:
    """What every chunk is verified against, read once per process."""

    governance: GovernanceView
    times: CheckpointTimes
    book: object

    @classmethod
    def load(cls, governance: GovernanceView | None = None) -> _Context:
        return cls(governance or GovernanceView.load(), CheckpointTimes.load(), load_price_book())


_context: _Context | None = None


def _verify(context: _Context, chunk: Chunk, *, complete: bool = False) -> list[RunVerification] | None:
    """The chunk's verdicts; None when fewer runs are read than the chunk holds and `complete` is asked
    (a replica behind the primary that chose the chunk: the caller reads it all again there)."""
    rows = _read(chunk, complete=complete)
    return None if rows is None else _check(context, rows)


def _read(chunk: Chunk, *, complete: bool = False) -> ChunkRows | None:
    """Every row the chunk's runs are checked against (`read_chunk`), or None as `_verify` says."""
    if chunk[0] == "range":
        batch, expected = runs_in_range(chunk[1], chunk[2]), chunk[3]
    else:
        batch, expected = runs_with_pks(chunk[1]), len(chunk[1])
    if complete and len(batch) < expected:
        return None
    return read_chunk(batch, timelines_of([r.run_id for r in batch]))


def _check(context: _Context, rows: ChunkRows) -> list[RunVerification]:
    """The verdicts of a chunk read (`_read`).

    The cyclic garbage collector waits while a chunk is checked: it walked every live object (Django's,
    the chunk's rows) again and again as the verdicts were made (≈ 10 % of a chunk's CPU); what a chunk
    leaves is freed as it goes out of use, and any cycle at the next collection."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        return list(
            check_chunk(
                rows,
                book=context.book,
                adopted=context.governance.adopted,
                governance=context.governance,
                times=context.times,
            )
        )
    finally:
        if collecting:
            gc.enable()


def _read_ahead(
    context: _Context, chunks: Sequence[Chunk], *, complete: bool = False
) -> Iterator[list[RunVerification] | None]:
    """Each chunk's verdicts in turn (`_verify`'s, None included), the next chunk read on a thread of
    its own (its own connection) while this one is checked: the reads' round trips and the server's
    work overlap the checks, which stay in this thread. At most two chunks' rows are held. The reader
    sees what this thread would (`others_can_read`) and reads where this thread's scope says (primary or
    replica). One chunk is read and checked here."""
    if len(chunks) <= 1:
        for chunk in chunks:
            yield _verify(context, chunk, complete=complete)
        return
    reader = ThreadPoolExecutor(1, thread_name_prefix="verify-read")

    def read(chunk: Chunk):
        return reader.submit(contextvars.copy_context().run, _read, chunk, complete=complete)

    pending = read(chunks[0])
    try:
        for at in range(len(chunks)):
            rows = pending.result()
            if at + 1 < len(chunks):
                pending = read(chunks[at + 1])
            yield None if rows is None else _check(context, rows)
    finally:
        pending.cancel()
        reader.submit(connections.close_all)  # the reader thread's connection, on that thread
        reader.shutdown(wait=True)


def _init() -> None:
    global _context
    with _reads():
        _context = _Context.load()


def _reads():
    return replica_reads() if replica_configured() else contextlib.nullcontext()


def _work(group: Sequence[Chunk]) -> list[RunVerification]:
    """The verdicts of a group of chunks in one worker, each next chunk read while one is checked."""
    out: list[RunVerification] = []
    with _reads():
        checked = _read_ahead(_context, group, complete=replica_configured())
        for chunk, verdicts in zip(group, checked, strict=True):
            if verdicts is None:  # never fewer runs than the primary chose: the whole chunk from the primary
                with primary_reads():
                    verdicts = _verify(_context, chunk)
            out.extend(verdicts)
    return out


def verify_chunks(
    chunks: Sequence[Chunk], *, workers: int = 1, governance: GovernanceView | None = None
) -> Iterator[RunVerification]:
    """The verdicts of every run of `chunks`, in chunk order; over `workers` processes when above 1."""
    if workers <= 1 or len(chunks) <= 1 or connection.in_atomic_block:
        # (In a transaction, as in a test, only this connection sees what it wrote: verified here.)
        # (Read ahead where another connection sees what this one does: `_read_ahead` reads a single
        # chunk in place.)
        context = _Context.load(governance)
        if others_can_read():
            checked = _read_ahead(context, chunks)
        else:
            checked = (_verify(context, chunk) for chunk in chunks)
        for verdicts in checked:
            yield from verdicts
        return
    if not (connection.vendor == "sqlite" and connection.is_in_memory_db()):
        # Each worker opens its own connection: none may inherit (and share) this process's sockets.
        connections.close_all()
    with multiprocessing.get_context("fork").Pool(workers, initializer=_init) as pool:
        for results in pool.imap(_work, groups(chunks, workers)):
            yield from results


def groups(chunks: Sequence[Chunk], workers: int) -> list[Sequence[Chunk]]:
    """`chunks` in groups of consecutive chunks, as the workers take them: at most `GROUP` chunks a
    group, and small enough that every worker takes at least two groups (5 chunks over 2 workers: one
    chunk a group, not one worker with four and one with one)."""
    size = max(1, min(GROUP, len(chunks) // (2 * workers)))
    return [chunks[at : at + size] for at in range(0, len(chunks), size)]


def others_can_read() -> bool:
    """Whether another connection (a process's, a thread's) can read what this one reads: not inside a
    transaction (as in a test, where only this connection sees what it wrote) and not an in-memory
    SQLite database."""
    return not connection.in_atomic_block and not (
        connection.vendor == "sqlite" and connection.is_in_memory_db()
    )


def in_background(fn: Callable[[], T], *, enabled: bool) -> Callable[[], T]:
    """`fn()` started now in a forked process when `enabled` and another process can read what this one
    reads (`verify_audit --workers N`: the log verified while the runs are); returns what gives its
    result, waiting for it. Run in this process, at that call, otherwise, and when the forked process
    fails (its error is then met here)."""
    if not enabled or not others_can_read():
        return fn
    connections.close_all()  # the child opens its own: none may inherit (and share) this one's sockets
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_background, args=(fn, send), daemon=True)
    process.start()
    send.close()

    def result() -> T:
        try:
            done, value = receive.recv()
        except (EOFError, OSError):
            done, value = False, None
        finally:
            receive.close()
            process.join()
        return value if done else fn()

    return result


def _background(fn: Callable[[], Any], send: Any) -> None:
    try:
        try:
            send.send((True, fn()))
        except BaseException:  # the parent runs fn itself and meets the error there
            send.send((False, None))
    finally:
        connections.close_all()
        send.close()
