"""How a decision reaches the database: sequence numbers, the hash chain, one write per decision,
fail-open accounting, lease fencing. `RunRecorder` inherits this; nothing else uses it.

Every write carries the run's lease epoch the recorder was made with (`audit.write_ops.Fence`): it commits
only while the run row still holds that epoch. A refused write (`WriteFenced`: another process claimed the
run since) lands no row, is not an audit write failure, and is counted in the run's `fenced_writes` by
one unconditional counter update; the recorder then calls its `on_fenced` hook (the executor trips the
run's cancel, so the stale pipeline stops at its next safe point)."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Sequence
from typing import Any

from django.db import DatabaseError, IntegrityError, connection
from django.db.models import F
from django.utils import timezone

from audit import rowdigest
from audit.bound import GOVERNANCE_EVENTS
from audit.facts import fact_statements, refresh_run_facts
from audit.group_commit import get_committer
from audit.integrity import GENESIS_HASH, event_payload_json
from audit.models import AgentStep, EventType, ToolInvocation, TraceEvent
from audit.payloads import bound_json_text, clip, sha256_hex
from audit.recorder.facts import SUMMARY_CHARS, Committed, Usage, _Event
from audit.write_ops import Fence, Insert, RawJSON, Update, WriteFenced, WriteOp, execute
from audit.write_ops import Table as RowTable
from diagnosis.models import TERMINAL_RUN_STATUSES, DiagnosisRun
from reasoning import crypto
from reasoning.fields import Ciphertext, EncryptedTextField
from reasoning.models import AgentReasoningAudit

logger = logging.getLogger("audit.recorder")


class ChainWriter:
    """The write half of `RunRecorder`: state it relies on is set by `RunRecorder.__init__`."""

    def _write(
        self,
        what: str,
        events: Sequence[_Event],
        *,
        inserts: Sequence[Insert] = (),
        updates: Sequence[Update] = (),
        run_fields: dict[str, Any] | None = None,
        usage: Usage | None = None,
    ) -> int | None:
        """Write the decision's rows (`inserts`, `updates`), its events and the run fields in one
        transaction, durable before returning; fail-open.

        Returns the `sequence_no` of the last event written (transports use it as the resumption id of
        live events), or None when the write failed.

        The usage, when given, enters the ledger whether or not the write commits (the call happened);
        `finish` reconciles the ledger with the usage records that did commit.
        """
        with self._lock:
            self.expected_events += len(events)
            usage_event = next((e for e in events if e.event_type == EventType.MODEL_TOKEN_USAGE), None)
            if usage is not None and usage_event is not None:
                d = usage_event.details
                self._ledger.add(d["source"], usage, d.get("stepIndex"), d.get("agentName"))
            for attempt in (1, 2):
                try:
                    self._commit(events, inserts, updates, run_fields)
                except WriteFenced:
                    self._fenced(what)
                    return None
                except IntegrityError as exc:
                    # Another process wrote this run's timeline (e.g. a sweeper that thought it dead):
                    # reload the chain head once and retry; anything else is an audit failure.
                    if attempt == 1 and self._sequence_taken():
                        self._reload_head()
                        continue
                    self._failed(what, exc)
                    return None
                except Exception as exc:
                    # Any failure of the durable path (database, encryption of a reasoning row, the
                    # write path itself, serialisation) costs this decision's record, never the run.
                    self._failed(what, exc)
                    return None
                return self._next_sequence - 1
            return None

    def _commit(
        self,
        events: Sequence[_Event],
        inserts: Sequence[Insert],
        updates: Sequence[Update],
        run_fields: dict[str, Any] | None,
    ) -> None:
        t = _tables()
        seq = self._next_sequence
        prev = self._prev_hash
        op = WriteOp(inserts=list(inserts), updates=list(updates), fence=self._fence(), after=self._late())
        for row in op.inserts:
            _seal(row)
        for upd in op.updates:
            if upd.fallback is not None:
                _seal(upd.fallback)
        for event in events:
            created_at = timezone.now()
            details = event.details
            if event.bind:
                details = {**details, **{key: _row_digest(row) for key, row in event.bind.items()}}
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
                        RawJSON(details_json if details_json.isascii() else _ascii_json(details_json)),
                        prev,
                        digest,
                        created_at,
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
        self._submit(op)
        if self.committed is not None:
            first = self._next_sequence
            self.committed.extend(
                Committed(first + i, str(e.event_type), str(e.status), e.details)
                for i, e in enumerate(events)
            )
        self._next_sequence = seq
        self._prev_hash = prev

    def _submit(self, op: WriteOp) -> None:
        """Write `op` durably (group commit when enabled and the caller is in autocommit mode, else
        directly on this thread's connection); raise whatever kept it from committing."""
        if self._group_commit and not connection.in_atomic_block:
            get_committer().submit(op)
        else:
            try:
                execute([op], connection)
            except Exception as exc:
                op.error = exc
        if op.error is not None:
            raise op.error

    def _late(self) -> list[tuple[str, tuple]]:
        """A write after the run's terminal row also rewrites its stored list facts (same transaction)."""
        return fact_statements(self.run_id) if getattr(self, "finished", False) else []

    def _fence(self) -> Fence:
        return Fence(_tables().run, "run_id", self.run_id, "lease_epoch", self.lease_epoch)

    def _count_fields(self) -> dict[str, int]:
        return {
            "expected_events": self.expected_events,
            "expected_steps": self.expected_steps,
            "expected_tools": self.expected_tools,
            "audit_write_failures": self.audit_write_failures,
        }

    def _update_run(self, what: str, *, after: Sequence[tuple[str, tuple]] = (), **fields: Any) -> bool:
        """Update the run row (fenced, fail-open); `after`: statements of the same transaction."""
        with self._lock:
            fields.update(self._count_fields())
            update = Update(_tables().run, tuple(fields), tuple(fields.values()), ("run_id",), (self.run_id,))
            try:
                self._submit(
                    WriteOp(updates=[update], fence=self._fence(), after=list(after) or self._late())
                )
                return True
            except WriteFenced:
                self._fenced(what)
                return False
            except Exception as exc:
                self._failed(what, exc)
                return False

    def _fenced(self, what: str) -> None:
        """A write refused by the fence: count it (a counter, not a decision) and tell the owner."""
        self.fenced = True
        self.fenced_writes += 1
        logger.warning("audit write fenced run=%s op=%s epoch=%s", self.run_id, what, self.lease_epoch)
        try:
            DiagnosisRun.objects.filter(run_id=self.run_id).update(fenced_writes=F("fenced_writes") + 1)
        except DatabaseError:
            _recover_connection()
        if self.on_fenced is not None:
            try:
                self.on_fenced()
            except Exception as exc:  # the hook must never turn a refusal into a crash
                logger.error("fenced hook failed run=%s error=%s", self.run_id, type(exc).__name__)

    def _failed(self, what: str, exc: BaseException) -> None:
        """Account one lost decision: counted here and on the run row, logged with the run id, the
        operation and the error class only (messages of database, encryption or serialisation errors
        can quote the values they rejected)."""
        self.audit_write_failures += 1
        code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
        logger.error(
            "audit write failed run=%s op=%s error=%s code=%s", self.run_id, what, type(exc).__name__, code
        )
        _recover_connection()
        try:
            DiagnosisRun.objects.filter(run_id=self.run_id).update(
                audit_write_failures=F("audit_write_failures") + 1
            )
            # A failure after the run's end (e.g. a late tool terminal) changes its stored list facts.
            refresh_run_facts(
                runs=DiagnosisRun.objects.filter(run_id=self.run_id, status__in=TERMINAL_RUN_STATUSES)
            )
        except Exception:
            _recover_connection()

    def _sequence_taken(self) -> bool:
        try:
            return TraceEvent.objects.filter(run_id=self.run_id, sequence_no=self._next_sequence).exists()
        except DatabaseError:
            return False

    def _reload_head(self) -> None:
        last = (
            TraceEvent.objects.filter(run_id=self.run_id)
            .order_by("-sequence_no")
            .values_list("sequence_no", "hash")
            .first()
        )
        self._next_sequence, self._prev_hash = (last[0] + 1, last[1]) if last else (1, GENESIS_HASH)

    def _persisted_counts(self) -> dict[str, int]:
        return {
            # Governance events (purge, key rotation, review): appended by others, never expected.
            "events": TraceEvent.objects.filter(run_id=self.run_id)
            .exclude(event_type__in=GOVERNANCE_EVENTS)
            .count(),
            "steps": AgentStep.objects.filter(run_id=self.run_id).count(),
            "tools": ToolInvocation.objects.filter(run_id=self.run_id).count(),
        }


def _seal(row: Insert) -> None:
    """Encrypt the row's plaintext reasoning columns here, so that the digest covers the ciphertext as
    stored (a `Ciphertext` is written as is)."""
    encrypted = _tables().encrypted.get(row.table)
    if not encrypted:
        return
    values = list(row.values)
    for i in encrypted:
        if values[i] is not None and not isinstance(values[i], Ciphertext):
            values[i] = Ciphertext(crypto.keyring().encrypt(str(values[i])))
    row.values = tuple(values)


def _row_digest(row: Insert) -> str:
    return rowdigest.form_of(row.table.model).digest(dict(zip(row.table.columns, row.values, strict=True)))


def _ascii_json(canonical: str) -> str:
    return json.dumps(json.loads(canonical), sort_keys=True, separators=(",", ":"))


class _Tables:
    """Row layouts of the recorder's tables (every concrete column but the auto primary key)."""

    def __init__(self) -> None:
        self.event = _table(TraceEvent)
        self.step = _table(AgentStep)
        self.reasoning = _table(AgentReasoningAudit)
        self.tool = _table(ToolInvocation)
        self.run = _table(DiagnosisRun)
        self.encrypted = {
            table: [i for i, f in enumerate(table.fields) if isinstance(f, EncryptedTextField)]
            for table in (self.step, self.reasoning, self.tool)
        }


def _table(model) -> RowTable:
    return RowTable(model, [f.attname for f in model._meta.concrete_fields if not f.primary_key])


@functools.cache
def _tables() -> _Tables:
    return _Tables()


def _ms(delta) -> int:
    return int(delta.total_seconds() * 1000)


def _recover_connection() -> None:
    """After a database error outside any atomic block, drop a broken connection so the next write
    reconnects (a long-running run never passes through Django's request-boundary cleanup)."""
    if not connection.in_atomic_block:
        connection.close_if_unusable_or_obsolete()
