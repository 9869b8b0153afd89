"""Chained events written by governance, outside a run's execution, in two chains:

* a run's own chain: a reasoning purge or key rotation changes stored reasoning rows, and records the new
  digests of those rows in each affected run's chain (`REASONING_PURGED`, `REASONING_REKEYED`), so that a
  purged or re-encrypted row verifies as such and any other change to it is still named; appended
  through `audit.write.tail.append_to_finished_run`, like every write to a finished run;
* the global governance chain (`audit.models.GovernanceEvent`, `record_governance_event`): every change
  to who may do what — membership of groups holding a sensitive permission, grants of sensitive
  permissions, superuser/staff/active flags, API tokens issued and revoked, OTP devices, lockouts and
  their lifting — hashed exactly like a run's timeline (`audit.verify.hash_chain.chain_hash` over canonical
  JSON) and verified by `audit.verify.governance_chain.verify_governance` (`verify_audit`).

Unlike the recorder's decisions these writes are **not** fail-open: they run inside the caller's
transaction with the row changes they describe, and an error rolls both back (a purge whose event could
not be written would look like tampering).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from audit.models import EventType, GovernanceEvent, GovernanceEventType, Phase
from audit.verify import row_digests
from audit.verify.authenticity import require_authentic_head
from audit.verify.hash_chain import GENESIS_HASH, chain_hash, timestamp
from audit.write.runtime_facts import ChainEvent
from audit.write.tail import append_to_finished_run
from core import writeauth

APPEND_ATTEMPTS = 5
_VERBS = {EventType.REASONING_PURGED: "purged", EventType.REASONING_REKEYED: "re-encrypted"}
_STATUS = {EventType.REASONING_PURGED: "PURGED", EventType.REASONING_REKEYED: "REKEYED"}


def record_reasoning_change(
    *, event_type: str, rows: Iterable[Mapping[str, Any]], governance_sequence_no: int
) -> dict[str, int]:
    """Append one `event_type` event per run to the runs of `rows` (stored reasoning rows as
    `audit.verify.row_digests.stored_reasoning_rows` returns them, read after the change), in run-id order,
    each through `append_to_finished_run` (under the run row's lock and its current lease epoch; a run still
    executing is appended to as well), naming the governance event that records the change
    (`governanceSequenceNo`: `REASONING_ROWS_PURGED` or `REASONING_KEYS_ROTATED`, written first in the
    same transaction; `audit.verify.authority.decision_problems` holds each run event to it). Must run inside
    the transaction that changed the rows, which locked them first (lock order: reasoning rows, run rows
    by id, chain heads). Returns each run's new event's `sequence_no`."""
    if event_type not in _VERBS:
        raise ValueError(f"not a reasoning governance event: {event_type!r}")
    by_run: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        by_run[row["run_id"]].append(row)
    written = {}
    for run_id, changed in sorted(by_run.items()):
        bindings = row_digests.reasoning_bindings(changed)
        steps = sorted({b["stepIndex"] for b in bindings})
        event = ChainEvent(
            Phase.RUN,
            event_type,
            _STATUS[event_type],
            f"{len(bindings)} reasoning row(s) {_VERBS[event_type]}: step(s) {', '.join(map(str, steps))}",
            {"rows": bindings, "governanceSequenceNo": governance_sequence_no},
        )
        written[run_id] = append_to_finished_run(run_id=run_id, events=[event], finished_only=False)
    return written


# --------------------------------------------------------------------------------------------------
# The global governance chain
# --------------------------------------------------------------------------------------------------
def governance_payload(
    *,
    sequence_no: int,
    event_type: str,
    actor: str,
    subject_user: str,
    group: str,
    permission: str,
    details: Any,
    created_at: dt.datetime,
) -> dict[str, Any]:
    """What a governance event's hash covers: every stored field but the hashes themselves."""
    return {
        "sequenceNo": sequence_no,
        "eventType": event_type,
        "actor": actor,
        "subjectUser": subject_user,
        "group": group,
        "permission": permission,
        "details": details,
        "createdAt": timestamp(created_at),
    }


def governance_hash(event: GovernanceEvent) -> str:
    """Recompute the hash a stored governance event should carry, from its own stored fields."""
    return chain_hash(
        event.prev_hash,
        governance_payload(
            sequence_no=event.sequence_no,
            event_type=event.event_type,
            actor=event.actor,
            subject_user=event.subject_user,
            group=event.group,
            permission=event.permission,
            details=event.details,
            created_at=event.created_at,
        ),
    )


def record_governance_event(
    *,
    event_type: str,
    actor: str = "",
    subject_user: str = "",
    group: str = "",
    permission: str = "",
    details: Mapping[str, Any] | None = None,
) -> GovernanceEvent:
    """Append one event at the head of the governance chain, tagged with the write key, and return it.

    Fail-closed: it runs inside the caller's transaction (opening one if there is none), so a change
    whose event could not be written is rolled back with it. Concurrent writers are ordered by a
    locking read of the head (on SQLite by the write transaction itself); a writer that loses the race
    for a sequence number retries. A head the service did not write is refused
    (`audit.verify.authenticity.ChainNotAuthentic`): the change is rolled back rather than authenticated after
    a forged event. Its time is never before the head's."""
    if event_type not in GovernanceEventType.values:
        raise ValueError(f"not a governance event type: {event_type!r}")
    for attempt in range(1, APPEND_ATTEMPTS + 1):
        try:
            with transaction.atomic():
                last = (
                    GovernanceEvent.objects.select_for_update()
                    .order_by("-sequence_no")
                    .values_list("sequence_no", "hash", "tag", "created_at")
                    .first()
                )
                if last is not None:
                    require_authentic_head(writeauth.GOVERNANCE, last)
                sequence_no, prev_hash = (last[0] + 1, last[1]) if last else (1, GENESIS_HASH)
                # Governance times never go backwards, whichever process's clock wrote the head.
                now = timezone.now()
                event = GovernanceEvent(
                    sequence_no=sequence_no,
                    event_type=event_type,
                    actor=actor or "",
                    subject_user=subject_user or "",
                    group=group or "",
                    permission=permission or "",
                    details=dict(details or {}),
                    prev_hash=prev_hash,
                    # The database keeps microseconds; hash what it will give back.
                    created_at=max(now, last[3]) if last is not None else now,
                )
                event.hash = governance_hash(event)
                event.tag = writeauth.tag(writeauth.GOVERNANCE, event.hash)
                event.save(force_insert=True)
                return event
        except IntegrityError:
            if attempt == APPEND_ATTEMPTS:
                raise
    raise AssertionError("unreachable")
