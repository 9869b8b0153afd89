"""The rows a recorder writes: the layouts of its tables (every concrete column but the auto primary key),
how a row is sealed before its digest is taken (reasoning columns encrypted, JSON serialised as stored),
and the digest a chain event binds it by. Shared by the recorder's parts (`audit.write.chain_writer`,
`tools`, `approvals`, `decisions`) and by appenders (`row_insert`)."""

from __future__ import annotations

import functools
import json
import time

from django.db import DatabaseError, connection
from django.db.models import JSONField

from audit.models import AgentStep, ToolInvocation, TraceEvent
from audit.verify import row_digests
from audit.write.ops import Insert, RawJSON
from audit.write.ops import Table as RowTable
from audit.write.table import json_text
from core.failover import LOOK_UP_PAUSES, reconnect_if_lost
from diagnosis.models import DiagnosisRun
from reasoning import crypto
from reasoning.fields import Ciphertext, EncryptedTextField
from reasoning.models import AgentReasoningAudit


def seal(row: Insert) -> None:
    """Encrypt the row's plaintext reasoning columns here, so that the digest covers the ciphertext as
    stored (a `Ciphertext` is written as is), and serialise its JSON columns once, as the column stores
    them (`RawJSON`: the digest reads the value back from that text, the write sends it as it is)."""
    t = tables()
    encrypted = t.encrypted.get(row.table)
    json_columns = t.json.get(row.table)
    if not encrypted and not json_columns:
        return
    values = list(row.values)
    for i in encrypted or ():
        if values[i] is not None and not isinstance(values[i], Ciphertext):
            values[i] = Ciphertext(crypto.keyring().encrypt(str(values[i])))
    for i, dumps in json_columns or ():
        if values[i] is not None and type(values[i]) is not RawJSON:
            values[i] = RawJSON(dumps(values[i]))
    row.values = tuple(values)


def row_digest(row: Insert) -> str:
    return row_digests.form_of(row.table.model).digest(dict(zip(row.table.columns, row.values, strict=True)))


def ascii_json(canonical: str) -> str:
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
        # JSON columns of the rows bound by a digest, with how their column serialises a value.
        self.json = {
            table: [(i, json_text(f.encoder)) for i, f in enumerate(table.fields) if isinstance(f, JSONField)]
            for table in (self.step, self.reasoning, self.tool)
        }


@functools.cache
def _table(model) -> RowTable:
    return RowTable(model, [f.attname for f in model._meta.concrete_fields if not f.primary_key])


def row_insert(instance) -> Insert:
    """The INSERT of a new model row as an appender binds it to its event (`ChainEvent.bind`): every
    concrete column but the auto primary key, with the values `instance` holds."""
    table = _table(type(instance))
    return Insert(table, tuple(getattr(instance, column) for column in table.columns))


@functools.cache
def tables() -> _Tables:
    return _Tables()


def ms(delta) -> int:
    return int(delta.total_seconds() * 1000)


def recover_connection() -> None:
    """After a database error outside any atomic block, drop a broken connection so the next write
    reconnects (a long-running run never passes through Django's request-boundary cleanup)."""
    if not connection.in_atomic_block:
        connection.close_if_unusable_or_obsolete()


def first_event_stored(run_id: str, op, sequence_no: int) -> bool | None:
    """Whether `op`'s first event is stored at `sequence_no` with its hash (a write whose answer was
    lost may have committed), None when the database cannot tell: asked up to `LOOK_UP_PAUSES` more
    times, each on a connection that answers a ping (behind Galera with DATABASE_WSREP_SYNC_WAIT a
    causal read, after every write-set the cluster ordered before it)."""
    t = tables().event
    index = t.columns.index("hash")
    digest = next((row.values[index] for row in op.inserts if row.table is t), None)
    if digest is None:
        return False
    for pause in (0.0, *LOOK_UP_PAUSES):
        time.sleep(pause)
        reconnect_if_lost()
        try:
            return TraceEvent.objects.filter(run_id=run_id, sequence_no=sequence_no, hash=digest).exists()
        except DatabaseError:
            recover_connection()
    return None
