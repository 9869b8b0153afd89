"""What a run's leaf in the transparency log commits to; no Django (the offline verifier uses it).

A leaf's data is the canonical JSON of a run's (or a run tail's, or the governance chain's) anchored head,
read from the chain itself, never from mutable run columns, so anyone holding the events can recompute it;
its hash is RFC 9162's `SHA-256(0x00 || data)`. A run is held to every head anchored for it, so what was
appended can no more change than what was anchored first.
Details: docs/audit-integrity.md, *Leaf data (`audit/transparency/leafdata.py`)*.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import Any, Protocol

from audit.transparency.note import canonical
from audit.verify.hash_chain import GENESIS_HASH, timestamp

KIND_RUN = "run"
KIND_RUN_TAIL = "runTail"
KIND_GOVERNANCE = "governance"
RUN_FINISHED = "RUN_FINISHED"
FIELDS = ("kind", "runId", "sessionId", "chainHead", "lastSequenceNo", "runDigest", "finishedAt")
TAIL_FIELDS = ("kind", "runId", "sessionId", "chainHead", "lastSequenceNo")
GOVERNANCE_FIELDS = ("kind", "chainHead", "lastSequenceNo", "lastEventAt")
_KINDS = {KIND_RUN: FIELDS, KIND_RUN_TAIL: TAIL_FIELDS, KIND_GOVERNANCE: GOVERNANCE_FIELDS}
WRITE_KEY_ID = "writeKeyId"  # the field of an authenticated leaf (see the module docstring)


class Event(Protocol):
    sequence_no: int
    event_type: str
    details: Any
    hash: str
    created_at: dt.datetime | str


def _time(value: dt.datetime | str) -> str:
    return value if isinstance(value, str) else timestamp(value)


def run_leaf(*, run_id: str, session_id: str, events: Sequence[Event]) -> dict[str, Any]:
    """The leaf fields of a run whose stored timeline is `events` (in sequence order, possibly empty)."""
    finished = None
    for event in events:
        if event.event_type == RUN_FINISHED:
            finished = event
    last = events[-1] if events else None
    return leaf_fields(
        run_id=run_id,
        session_id=session_id,
        head_hash=last.hash if last is not None else None,
        head_sequence_no=last.sequence_no if last is not None else None,
        finished_details=finished.details if finished is not None else None,
        finished_at=finished.created_at if finished is not None else None,
    )


def leaf_fields(
    *,
    run_id: str,
    session_id: str,
    head_hash: str | None,
    head_sequence_no: int | None,
    finished_details: Any,
    finished_at: dt.datetime | str | None,
    write_key_id: str | None = None,
) -> dict[str, Any]:
    """The leaf fields from the chain's head and its last RUN_FINISHED (None: the run has no such event);
    `write_key_id`: the key whose tag on the head was verified (None: a leaf of before write
    authentication)."""
    details = finished_details if isinstance(finished_details, dict) else {}
    return _authenticated(
        {
            "kind": KIND_RUN,
            "runId": run_id,
            "sessionId": session_id,
            "chainHead": head_hash if head_hash is not None else GENESIS_HASH,
            "lastSequenceNo": int(head_sequence_no or 0),
            "runDigest": details.get("runDigest"),
            "finishedAt": _time(finished_at) if finished_at is not None else None,
        },
        write_key_id,
    )


def governance_fields(
    *, head_hash: str, head_sequence_no: int, created_at: dt.datetime | str, write_key_id: str | None = None
) -> dict[str, Any]:
    """The leaf fields anchoring the governance chain's head (its last event's hash, number and time)."""
    return _authenticated(
        {
            "kind": KIND_GOVERNANCE,
            "chainHead": head_hash,
            "lastSequenceNo": int(head_sequence_no),
            "lastEventAt": _time(created_at),
        },
        write_key_id,
    )


def tail_fields(
    *, run_id: str, session_id: str, head_hash: str, head_sequence_no: int, write_key_id: str | None = None
) -> dict[str, Any]:
    """The fields of a run-tail leaf: the run's chain head when a checkpoint found it grown."""
    return _authenticated(
        {
            "kind": KIND_RUN_TAIL,
            "runId": run_id,
            "sessionId": session_id,
            "chainHead": head_hash,
            "lastSequenceNo": int(head_sequence_no),
        },
        write_key_id,
    )


def _authenticated(fields: dict[str, Any], write_key_id: str | None) -> dict[str, Any]:
    if write_key_id is not None:
        fields[WRITE_KEY_ID] = write_key_id
    return fields


def _has_fields(fields: dict[str, Any], wanted: tuple[str, ...]) -> bool:
    """Exactly the kind's fields, with or without `writeKeyId` (a non-empty string when present)."""
    names = tuple(sorted(fields))
    if names == tuple(sorted(wanted)):
        return True
    key_id = fields.get(WRITE_KEY_ID)
    return names == tuple(sorted((*wanted, WRITE_KEY_ID))) and isinstance(key_id, str) and bool(key_id)


def write_key_id(fields: dict[str, Any]) -> str | None:
    """The write key id an authenticated leaf names; None for a leaf of before write authentication."""
    return fields.get(WRITE_KEY_ID)


def encode(fields: dict[str, Any]) -> bytes:
    return canonical(fields).encode("utf-8")


def decode(data: str | bytes) -> dict[str, Any]:
    """The fields of stored leaf data; ValueError unless it is exactly a canonical run leaf."""
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    fields = json.loads(text)
    if not isinstance(fields, dict) or not _has_fields(fields, FIELDS):
        raise ValueError("leaf data does not have exactly the leaf fields")
    if fields["kind"] != KIND_RUN:
        raise ValueError(f"unknown leaf kind {fields['kind']!r}")
    if canonical(fields) != text:
        raise ValueError("leaf data is not in canonical form")
    return fields


def decode_any(data: str | bytes) -> dict[str, Any]:
    """The fields of stored leaf data of any kind (run, run tail, governance); ValueError unless it is
    exactly the canonical form of one of them."""
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    try:
        fields = json.loads(text)
    except ValueError as exc:
        raise ValueError("leaf data is not JSON") from exc
    if not isinstance(fields, dict):
        raise ValueError("leaf data is not an object")
    wanted = _KINDS.get(fields.get("kind"))
    if wanted is None:
        raise ValueError(f"unknown leaf kind {fields.get('kind')!r}")
    if not _has_fields(fields, wanted):
        raise ValueError(f"leaf data does not have exactly the {fields['kind']} leaf fields")
    if not isinstance(fields["lastSequenceNo"], int) or isinstance(fields["lastSequenceNo"], bool):
        raise ValueError("leaf data's lastSequenceNo is not an integer")
    if canonical(fields) != text:
        raise ValueError("leaf data is not in canonical form")
    return fields


def decode_governance(data: str | bytes) -> dict[str, Any]:
    """The fields of a stored governance leaf; ValueError unless it is exactly a canonical one."""
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    fields = json.loads(text)
    if not isinstance(fields, dict) or not _has_fields(fields, GOVERNANCE_FIELDS):
        raise ValueError("leaf data does not have exactly the governance leaf fields")
    if fields["kind"] != KIND_GOVERNANCE:
        raise ValueError(f"not a governance leaf: kind {fields['kind']!r}")
    if canonical(fields) != text:
        raise ValueError("leaf data is not in canonical form")
    return fields


def anchored_prefix(events: Sequence[Event], last_sequence_no: int) -> list[Event]:
    """The events up to and including `last_sequence_no` (the part of the chain a leaf anchored)."""
    return [e for e in events if e.sequence_no <= last_sequence_no]
