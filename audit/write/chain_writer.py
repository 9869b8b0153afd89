"""How a decision reaches the database: sequence numbers, the hash chain, one write per decision,
fail-open accounting, lease fencing. `RunChain` is the recorder's part that does it (`recorder.chain`):
the other parts (`decisions`, `tools`, `approvals`) hand it their decisions' events and rows.

Every write carries the run's lease epoch the recorder was made with (`audit.write.ops.Fence`): it commits
only while the run row still holds that epoch. A refused write (`WriteFenced`: another process claimed the
run since) lands no row, is not an audit write failure, and is counted in the run's `fenced_writes` by
one unconditional counter update; the chain then calls its `on_fenced` hook (the executor trips the
run's cancel, so the stale pipeline stops at its next safe point)."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, IntegrityError, connection
from django.db.models import F
from django.utils import timezone

from audit.models import AgentStep, ToolInvocation, TraceEvent
from audit.payloads import bound_json_text, clip, sha256_hex
from audit.read.list_facts import fact_statements, refresh_run_facts
from audit.verify.authenticity import ChainNotAuthentic, require_authentic_head
from audit.verify.chain_digests import GOVERNANCE_EVENTS
from audit.verify.hash_chain import GENESIS_HASH, event_payload_json
from audit.write.group_commit import RecorderLock, get_committer
from audit.write.ops import Fence, Insert, RawJSON, Update, WriteFenced, WriteOp, execute
from audit.write.rows import ascii_json, first_event_stored, recover_connection, row_digest, seal, tables
from audit.write.runtime_facts import SUMMARY_CHARS, ChainEvent, Committed
from core import writeauth
from core.failover import CERTIFICATION_CONFLICT, LOOK_UP_PAUSES, lost_or_conflicted
from diagnosis.models import TERMINAL_RUN_STATUSES, DiagnosisRun

logger = logging.getLogger("audit.write")


@dataclass(eq=False, slots=True)
class _Spec:
    """One decision as its owner handed it to `RunChain.write` (kept to write it again on its own)."""

    what: str
    events: Sequence[ChainEvent]
    inserts: Sequence[Insert] = ()
    updates: Sequence[Update] = ()
    run_fields: dict[str, Any] | None = None
    # Statements of the same transaction; None: the stored list facts once the run has ended (`_late`).
    after: list[tuple[str, tuple]] | None = None
    # Called once the decision committed (state that needs what the database returned, e.g. row ids).
    on_commit: Callable[[], None] | None = None


@dataclass(eq=False, slots=True)
class _Held:
    """A decision chained but not committed yet: its op, its events as committed, where the chain stood
    before it, and once written, what `_write` would have returned for it (None: not written)."""

    spec: _Spec
    op: WriteOp
    entries: list[Committed]
    start: tuple[int, str]
    last: int
    result: int | None = None


class RunChain:
    """One run's chain as its recorder writes it (`recorder.chain`): the head (next sequence number and
    previous hash), the decisions held for their commit, the lease epoch every write is fenced by, the
    fail-open accounting (`audit_write_failures`, `fenced_writes`, `fenced`), the expected counts every
    run-row update carries (what the recorder attempted: the other parts count their steps, reasoning
    rows and tools here), and the lock every part of the recorder takes (one run's decisions happen one at
    a time, in order).

    **Held decisions.** A decision recorded through `hold` (no effect of the run follows it before the
    run's next record) is chained at once (its sequence numbers, hash, timestamps and counts are those
    of that moment) but committed together with the next decision this recorder writes, in one
    transaction, or by `flush`. The owner must flush before anything leaves the process (a frame; a
    model request or a tool execution is always preceded by a write, which takes the held decisions
    with it); `finish` and every read of the run's own rows flush first. If that transaction fails
    (other than by the fence), nothing of it was written: the chain goes back to the first held
    decision and each decision is written on its own as if none had been held, so exactly the ones
    that fail on their own are counted as audit write failures. A refused (fenced) transaction counts
    one fenced write per decision in it."""

    def __init__(self, *, run_id: str, session_id: str, lease_epoch: int, group_commit: bool) -> None:
        self.run_id = run_id
        self.session_id = session_id
        self.lease_epoch = lease_epoch
        self._fence_made: Fence | None = None  # `_fence` for `lease_epoch`, made once
        self.group_commit = group_commit
        self.lock = RecorderLock()
        self._next_sequence = 1
        self._prev_hash = GENESIS_HASH
        # Decisions chained but not committed yet (`hold`), and whether the current one is held.
        self.held: list[_Held] = []
        self.holding = False
        # Set when a write was refused because another process claimed the run since `lease_epoch`.
        self.fenced = False
        self.fenced_writes = 0
        self.on_fenced: Callable[[], None] | None = None
        # When a deque: every committed event is appended as a `Committed` (its live listeners drain it
        # from another thread; see `agent.runtime.context.RunContext.record`). None: nothing kept.
        self.committed: deque[Committed] | None = None
        self.expected_events = 0
        self.expected_steps = 0
        self.expected_tools = 0
        self.expected_reasoning = 0
        self.audit_write_failures = 0
        # Set once the terminal row is written: every later write also rewrites the stored list facts.
        self.finished = False

    def write(
        self,
        what: str,
        events: Sequence[ChainEvent],
        *,
        inserts: Sequence[Insert] = (),
        updates: Sequence[Update] = (),
        run_fields: dict[str, Any] | None = None,
        on_commit: Callable[[], None] | None = None,
    ) -> int | None:
        """Write the decision's rows (`inserts`, `updates`), its events and the run fields in one
        transaction, durable before returning; fail-open.

        Returns the `sequence_no` of the last event written (transports use it as the resumption id of
        live events), or None when the write failed (or the decision is held: see the class docstring).
        """
        with self.lock:
            self.expected_events += len(events)
            spec = _Spec(what, events, inserts, updates, run_fields, on_commit=on_commit)
            if self.holding:
                self._hold(spec)
                return None
            return self._write_now(spec)

    def hold(self, write: Callable[..., Any], kwargs: dict[str, Any]) -> None:
        """Record the decision `write(**kwargs)` as a held decision (see the class docstring). A model
        step that declares tool calls is written at once: its calls' rows name its row id."""
        with self.lock:
            self.holding = _holdable(write, kwargs)
            try:
                write(**kwargs)
            finally:
                self.holding = False

    def together(self, writes: Sequence[tuple[Callable[..., Any], dict[str, Any]]]) -> list[Any]:
        """Record several decisions (`(method, kwargs)`) in order, in one transaction with whatever is
        held, committed before returning. Each entry's result is what its method returns when called
        alone, known once written: the sequence number of its last event (None when not written), or the
        exception it raised (returned in its place; a refusal it recorded is written with the others)."""
        outcomes: list[tuple[Any, list[_Held]]] = []
        with self.lock:
            for write, kwargs in writes:
                before = len(self.held)
                self.holding = _holdable(write, kwargs)
                try:
                    result: Any = write(**kwargs)
                except Exception as exc:
                    result = exc
                finally:
                    self.holding = False
                outcomes.append((result, self.held[before:]))
            self.flush()
        return [
            result if isinstance(result, Exception) or not held else held[-1].result
            for result, held in outcomes
        ]

    def holds(self) -> bool:
        """Whether decisions wait for their commit (the owner then flushes before a frame leaves)."""
        return bool(self.held)

    def flush(self) -> None:
        """Commit the held decisions (one transaction; see the class docstring). Fail-open."""
        with self.lock:
            if self.held:
                self._write_now(None)

    def _hold(self, spec: _Spec) -> None:
        start = (self._next_sequence, self._prev_hash)
        try:
            op, entries = self._build(spec)
        except Exception as exc:  # serialisation or encryption: this decision is lost, as when written
            self._next_sequence, self._prev_hash = start
            self.failed(spec.what, exc)
            return
        self.held.append(_Held(spec, op, entries, start, self._next_sequence - 1))

    def _write_now(self, spec: _Spec | None) -> int | None:
        """Write `spec` (None: nothing but the held decisions) together with the held decisions."""
        held, self.held = self.held, []
        if not held:
            return self._attempt(spec)
        ops = [h.op for h in held]
        try:
            if spec is not None:
                op, entries = self._build(spec)
                ops.append(op)
            self._submit(_merged(ops))
        except WriteFenced:
            self._next_sequence, self._prev_hash = held[0].start
            for h in held:
                self._fenced(h.spec.what)
            if spec is not None:
                self._fenced(spec.what)
            return None
        except Exception as exc:
            end = (self._next_sequence, self._prev_hash)
            landed = self._landed(held[0])
            if landed is None:
                # Whether it committed cannot be told: writing it again could write it twice.
                self._next_sequence, self._prev_hash = held[0].start
                for h in held:
                    self.failed(h.spec.what, exc)
                if spec is not None:
                    self.failed(spec.what, exc)
                return None
            if not landed:
                # Nothing of the transaction was written: each decision on its own, from the first held.
                self._next_sequence, self._prev_hash = held[0].start
                for h in held:
                    h.result = self._attempt(h.spec)
                return self._attempt(spec) if spec is not None else None
            # It committed, and only its outcome was lost (with the connection): nothing is written twice.
            self._next_sequence, self._prev_hash = end
        for h in held:
            self._committed(h.entries, h.spec)
            h.result = h.last
        if spec is None:
            return None
        self._committed(entries, spec)
        return self._next_sequence - 1

    def _landed(self, held: _Held) -> bool | None:
        """Whether the first event of `held` is stored as chained here: a transaction whose outcome was
        lost with its connection may have committed (then it holds every decision written with it)."""
        return self._first_landed(held.op, held.start[0])

    def _first_landed(self, op: WriteOp, sequence_no: int) -> bool | None:
        """Whether `op`'s first event is stored at `sequence_no` (`rows.first_event_stored`)."""
        return first_event_stored(self.run_id, op, sequence_no)

    def _attempt(self, spec: _Spec) -> int | None:
        """Write one decision on its own (the retry after a taken sequence, the fail-open accounting).

        Retried: once after a taken sequence (another writer of the run: the chain head reloaded), and up
        to `len(LOOK_UP_PAUSES)` times after a lost connection or a Galera certification conflict
        (`lost_or_conflicted`): if its first event is stored the write committed and only its answer was
        lost, if it is not it is written again on this thread's connection (the proxy's surviving node),
        under the same fence; if the database cannot tell, it is an audit write failure (never written
        twice)."""
        reloaded, retries = False, 0
        while True:
            start = (self._next_sequence, self._prev_hash)
            op = None
            try:
                op, entries = self._build(spec)
                # The retry after a lost connection goes on this thread's own connection, checked first
                # (a batch writer's other connections may have died with the same server).
                (self._submit_here if retries else self._submit)(op)
            except WriteFenced:
                self._next_sequence, self._prev_hash = start
                self._fenced(spec.what)
                return None
            except IntegrityError as exc:
                self._next_sequence, self._prev_hash = start
                # Another process wrote this run's timeline (e.g. a sweeper that thought it dead):
                # reload the chain head once and retry; anything else is an audit failure.
                if not reloaded and self._sequence_taken():
                    reloaded = True
                    try:
                        self.reload_head()
                    except ChainNotAuthentic as refused:
                        self._refuse_head(spec.what, refused)
                        return None
                    continue
                self.failed(spec.what, exc)
                return None
            except Exception as exc:
                end = (self._next_sequence, self._prev_hash)
                self._next_sequence, self._prev_hash = start
                if op is not None and retries < len(LOOK_UP_PAUSES) and lost_or_conflicted(exc):
                    retries += 1
                    if exc.args[0] != CERTIFICATION_CONFLICT and not connection.in_atomic_block:
                        connection.close()  # lost: the look-up and the write go on a new connection
                    landed = self._first_landed(op, start[0])
                    if landed:
                        self._next_sequence, self._prev_hash = end
                        logger.warning("audit write answer lost, stored run=%s op=%s", self.run_id, spec.what)
                        self._committed(entries, spec)
                        return self._next_sequence - 1
                    if landed is False:
                        logger.warning(
                            "audit write retried run=%s op=%s code=%s", self.run_id, spec.what, exc.args[0]
                        )
                        continue
                # Any failure of the durable path (database, encryption of a reasoning row, the
                # write path itself, serialisation) costs this decision's record, never the run.
                self.failed(spec.what, exc)
                return None
            self._committed(entries, spec)
            return self._next_sequence - 1

    def append_after(
        self, head: tuple[int, str, str] | None, events: Sequence[ChainEvent], rows: Sequence[Insert] = ()
    ) -> int:
        """Chain `events` after `head` — (sequence_no, hash, tag) of the run's newest event as its
        appender read it under the run row's lock; None for an empty chain — and commit them now with
        the rows they bind; returns the `sequence_no` of the last one. Fail-closed, for
        `audit.write.tail.append_to_finished_run` alone (which holds that lock and retries): a head
        the service did not write is refused (`ChainNotAuthentic`: tagging after it would authenticate
        it), whatever kept the events from committing is raised, nothing is counted, and the chain
        stays at `head`."""
        if head:
            require_authentic_head(writeauth.RUN, head, run_id=self.run_id)
        self._next_sequence, self._prev_hash = (head[0] + 1, head[1]) if head else (1, GENESIS_HASH)
        spec = _Spec("", events, rows, (), None)
        start = (self._next_sequence, self._prev_hash)
        try:
            op, entries = self._build(spec)
            self._submit(op)
        except BaseException:
            self._next_sequence, self._prev_hash = start
            raise
        self._committed(entries, spec)
        return self._next_sequence - 1

    def _committed(self, entries: list[Committed], spec: _Spec) -> None:
        if self.committed is not None:
            self.committed.extend(entries)
        if spec.on_commit is not None:
            spec.on_commit()

    def _build(self, spec: _Spec) -> tuple[WriteOp, list[Committed]]:
        """The decision's op with its events chained from the current head, which it advances."""
        events, run_fields = spec.events, spec.run_fields
        t = tables()
        tagger = writeauth.verifier()  # raises before anything is chained when no write key exists
        seq = self._next_sequence
        prev = self._prev_hash
        after = spec.after if spec.after is not None else self._late()
        op = WriteOp(inserts=list(spec.inserts), updates=list(spec.updates), fence=self._fence(), after=after)
        for row in op.inserts:
            seal(row)
        for upd in op.updates:
            if upd.fallback is not None:
                seal(upd.fallback)
        for event in events:
            created_at = timezone.now()
            details = event.details
            if event.bind:
                details = {**details, **{key: row_digest(row) for key, row in event.bind.items()}}
            _, details_json = bound_json_text(details)
            summary = clip(event.summary, SUMMARY_CHARS)
            phase, event_type, status = str(event.phase), str(event.event_type), str(event.status)
            digest = sha256_hex(
                prev
                + event_payload_json(
                    run_id=self.run_id,
                    session_id=self.session_id,
                    sequence_no=seq,
                    phase=phase,
                    event_type=event_type,
                    status=status,
                    summary=summary,
                    details_json=details_json,
                    created_at=created_at,
                )
            )
            op.inserts.append(
                Insert(
                    t.event,
                    (
                        self.run_id,
                        self.session_id,
                        seq,
                        phase,
                        event_type,
                        status,
                        summary,
                        # Stored as the hashed canonical text (ASCII-escaped when it holds non-ASCII,
                        # so that any string the JSON module accepts can be stored).
                        RawJSON(details_json if details_json.isascii() else ascii_json(details_json)),
                        prev,
                        digest,
                        created_at,
                        tagger.tag(writeauth.RUN, digest),
                    ),
                )
            )
            prev = digest
            seq += 1
        if run_fields:
            fields = {**run_fields, **self._count_fields()}
            op.updates.append(
                Update(t.run, tuple(fields), tuple(fields.values()), ("run_id",), (self.run_id,))
            )
        first = self._next_sequence
        entries = [
            Committed(first + i, str(e.event_type), str(e.status), e.details) for i, e in enumerate(events)
        ]
        self._next_sequence = seq
        self._prev_hash = prev
        return op, entries

    def _submit(self, op: WriteOp) -> None:
        """Write `op` durably (group commit when enabled and the caller is in autocommit mode, else
        directly on this thread's connection); raise whatever kept it from committing."""
        if self.group_commit and not connection.in_atomic_block:
            get_committer().submit(op, autocommit=True)
            if op.error is not None:
                raise op.error
        else:
            self._submit_here(op)

    def _submit_here(self, op: WriteOp) -> None:
        """Write `op` on this thread's connection; raise whatever kept it from committing."""
        try:
            execute([op], connection)
        except Exception as exc:
            op.error = exc
        if op.error is not None:
            raise op.error

    def _late(self) -> list[tuple[str, tuple]]:
        """A write after the run's terminal row also rewrites its stored list facts (same transaction)."""
        return fact_statements(self.run_id) if self.finished else []

    def _fence(self) -> Fence:
        fence = self._fence_made
        if fence is None or fence.epoch != self.lease_epoch:
            fence = Fence(tables().run, "run_id", self.run_id, "lease_epoch", self.lease_epoch)
            self._fence_made = fence
        return fence

    def _count_fields(self) -> dict[str, int]:
        return {
            "expected_events": self.expected_events,
            "expected_steps": self.expected_steps,
            "expected_tools": self.expected_tools,
            "audit_write_failures": self.audit_write_failures,
        }

    def update_run(self, what: str, *, after: Sequence[tuple[str, tuple]] = (), **fields: Any) -> bool:
        """Update the run row (fenced, fail-open), with the held decisions; `after`: statements of the
        same transaction."""
        with self.lock:
            spec = _Spec(what, (), run_fields=fields, after=list(after) or None)
            return self._write_now(spec) is not None

    def _fenced(self, what: str) -> None:
        """A write refused by the fence: count it (a counter, not a decision) and tell the owner."""
        self.fenced = True
        self.fenced_writes += 1
        logger.warning("audit write fenced run=%s op=%s epoch=%s", self.run_id, what, self.lease_epoch)
        try:
            DiagnosisRun.objects.filter(run_id=self.run_id).update(fenced_writes=F("fenced_writes") + 1)
        except DatabaseError:
            recover_connection()
        if self.on_fenced is not None:
            try:
                self.on_fenced()
            except Exception as exc:  # the hook must never turn a refusal into a crash
                logger.error("fenced hook failed run=%s error=%s", self.run_id, type(exc).__name__)

    def failed(self, what: str, exc: BaseException) -> None:
        """Account one lost decision: counted here and on the run row, logged with the run id, the
        operation and the error class only (messages of database, encryption or serialisation errors
        can quote the values they rejected)."""
        self.audit_write_failures += 1
        code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
        logger.error(
            "audit write failed run=%s op=%s error=%s code=%s", self.run_id, what, type(exc).__name__, code
        )
        recover_connection()
        try:
            DiagnosisRun.objects.filter(run_id=self.run_id).update(
                audit_write_failures=F("audit_write_failures") + 1
            )
            # A failure after the run's end (e.g. a late tool terminal) changes its stored list facts.
            refresh_run_facts(
                runs=DiagnosisRun.objects.filter(run_id=self.run_id, status__in=TERMINAL_RUN_STATUSES)
            )
        except Exception:
            recover_connection()

    def _sequence_taken(self) -> bool:
        try:
            return TraceEvent.objects.filter(run_id=self.run_id, sequence_no=self._next_sequence).exists()
        except DatabaseError:
            return False

    def reload_head(self) -> None:
        """Continue from the stored head, which must be one the service wrote (`ChainNotAuthentic`
        otherwise: whatever this recorder tagged after it would authenticate it)."""
        last = (
            TraceEvent.objects.filter(run_id=self.run_id)
            .order_by("-sequence_no")
            .values_list("sequence_no", "hash", "tag")
            .first()
        )
        if last is not None:
            require_authentic_head(writeauth.RUN, last, run_id=self.run_id)
        self._next_sequence, self._prev_hash = (last[0] + 1, last[1]) if last else (1, GENESIS_HASH)

    def _refuse_head(self, what: str, exc: ChainNotAuthentic) -> None:
        """The stored head of this run's chain was not written by the service (another writer chained
        events the recorder cannot authenticate): the decision is lost (counted), and the owner is told
        as for a fenced write, so that the run stops at its next safe point and nothing more is tagged."""
        logger.error("audit chain head not authentic run=%s op=%s", self.run_id, what)
        self.failed(what, exc)
        self.fenced = True
        if self.on_fenced is not None:
            try:
                self.on_fenced()
            except Exception as hook_error:
                logger.error("fenced hook failed run=%s error=%s", self.run_id, type(hook_error).__name__)

    def stored_counts(self) -> dict[str, int]:
        return {
            # Governance events (purge, key rotation, review): appended by others, never expected.
            "events": TraceEvent.objects.filter(run_id=self.run_id)
            .exclude(event_type__in=GOVERNANCE_EVENTS)
            .count(),
            "steps": AgentStep.objects.filter(run_id=self.run_id).count(),
            "tools": ToolInvocation.objects.filter(run_id=self.run_id).count(),
        }


# The decisions `RunRecorder.hold` accepts: their callers need no outcome (fail-open, nothing raised, the
# sequence number unused but for progress frames, which follow the commit).
HOLDABLE = frozenset({"routing_decision", "plan_decision", "model_step", "evidence_guard", "semantic_guard"})


# Decisions `RunRecorder.record_together` also accepts: their callers need the outcome, which it returns
# once the decisions written together committed (the starts of one step's parallel tool calls).
TOGETHER = frozenset({"tool_started"})


def _holdable(write: Callable[..., Any], kwargs: dict[str, Any]) -> bool:
    """Whether the decision is held: all of them but a model step that declares tool calls."""
    return not (getattr(write, "__name__", "") == "model_step" and kwargs.get("tool_calls"))


def _merged(ops: Sequence[WriteOp]) -> WriteOp:
    """Several decisions' ops of one run as one op (one transaction): rows in chain order, consecutive
    updates of the same row folded into one (the later values win), each statement run after once."""
    updates: list[Update] = []
    after: list[tuple[str, tuple]] = []
    for op in ops:
        for upd in op.updates:
            last = updates[-1] if updates else None
            if (
                last is not None
                and last.fallback is None
                and upd.fallback is None
                and last.table is upd.table
                and last.where == upd.where
                and last.where_values == upd.where_values
            ):
                values = dict(zip(last.columns, last.values, strict=True))
                values.update(zip(upd.columns, upd.values, strict=True))
                updates[-1] = Update(
                    last.table, tuple(values), tuple(values.values()), last.where, last.where_values
                )
            else:
                updates.append(upd)
        for statement in op.after:
            if statement not in after:
                after.append(statement)
    return WriteOp(
        inserts=[row for op in ops for row in op.inserts], updates=updates, fence=ops[-1].fence, after=after
    )
