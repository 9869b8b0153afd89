"""Chained events written by governance, outside a run's execution: a reasoning purge or key rotation
changes stored reasoning rows, and records the new digests of those rows in each affected run's chain
(`REASONING_PURGED`, `REASONING_REKEYED`), so that a purged or re-encrypted row verifies as such and any
other change to it is still named.

Unlike the recorder's decisions these writes are **not** fail-open: they run inside the caller's
transaction with the row changes they describe, and an error rolls both back (a purge whose event could
not be written would look like tampering).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from django.db import IntegrityError, transaction

from audit import rowdigest
from audit.integrity import GENESIS_HASH
from audit.models import EventType, Phase, TraceEvent
from audit.recorder.facts import _Event
from audit.recorder.run import RunRecorder

APPEND_ATTEMPTS = 5
_VERBS = {EventType.REASONING_PURGED: "purged", EventType.REASONING_REKEYED: "re-encrypted"}
_STATUS = {EventType.REASONING_PURGED: "PURGED", EventType.REASONING_REKEYED: "REKEYED"}


def record_reasoning_change(*, event_type: str, rows: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Append one `event_type` event per run to the runs of `rows` (stored reasoning rows as
    `audit.rowdigest.stored_reasoning_rows` returns them, read after the change). Must run inside the
    transaction that changed the rows. Returns each run's new event's `sequence_no`."""
    if event_type not in _VERBS:
        raise ValueError(f"not a reasoning governance event: {event_type!r}")
    by_run: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        by_run[(row["run_id"], row["session_id"])].append(row)
    written = {}
    for (run_id, session_id), changed in sorted(by_run.items()):
        bindings = rowdigest.reasoning_bindings(changed)
        steps = sorted({b["stepIndex"] for b in bindings})
        event = _Event(
            Phase.RUN,
            event_type,
            _STATUS[event_type],
            f"{len(bindings)} reasoning row(s) {_VERBS[event_type]}: step(s) {', '.join(map(str, steps))}",
            {"rows": bindings},
        )
        written[run_id] = _append(run_id=run_id, session_id=session_id, event=event)
    return written


def _append(*, run_id: str, session_id: str, event: _Event) -> int:
    """Append `event` at the head of the run's chain; retried when another writer took the number."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("governance events are written inside the transaction of their change")
    writer = RunRecorder(run_id=run_id, session_id=session_id, group_commit=False)
    for attempt in range(1, APPEND_ATTEMPTS + 1):
        # A locking read sees the newest committed head, also under REPEATABLE READ.
        last = (
            TraceEvent.objects.select_for_update()
            .filter(run_id=run_id)
            .order_by("-sequence_no")
            .values_list("sequence_no", "hash")
            .first()
        )
        writer._next_sequence, writer._prev_hash = (last[0] + 1, last[1]) if last else (1, GENESIS_HASH)
        try:
            with transaction.atomic():
                writer._commit([event], (), (), None)
        except IntegrityError:
            if attempt == APPEND_ATTEMPTS:
                raise
            continue
        return writer._next_sequence - 1
    raise AssertionError("unreachable")
