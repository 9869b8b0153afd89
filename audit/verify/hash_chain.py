"""The hash chain of a run's timeline: how an event is hashed and how a stored chain is verified.

`hash = sha256(prev_hash + canonical JSON of the event)`, where the event is the dict returned by
`event_payload` (identity, position, type, status, summary, bounded details and creation time). The first
event of a run chains to `GENESIS_HASH`. Verification needs nothing but the stored rows, so anyone holding
the database can check that no stored event was changed, removed or reordered.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from audit.payloads import canonical_json, sha256_hex

GENESIS_HASH = "0" * 64
# The fields of `event_payload`, i.e. what an event's hash covers (an evidence bundle carries exactly these).
EVENT_FIELDS = (
    "runId",
    "sessionId",
    "sequenceNo",
    "phase",
    "eventType",
    "status",
    "summary",
    "details",
    "createdAt",
)


class ChainLink(Protocol):
    run_id: str
    session_id: str
    sequence_no: int
    phase: str
    event_type: str
    status: str
    summary: str
    details: Any
    prev_hash: str
    hash: str
    created_at: dt.datetime


def timestamp(value: dt.datetime) -> str:
    """The hashed form of a time: UTC, microseconds, as the database stores it."""
    if value.tzinfo is not dt.UTC:  # every stored time read back is UTC already: the same text
        value = value.astimezone(dt.UTC)
    # `isoformat()` writes six digits of a nonzero fraction as `timespec="microseconds"` does, and
    # costs less than the keyword (≈ 0.5 µs a value).
    return value.isoformat() if value.microsecond else value.isoformat(timespec="microseconds")


def event_payload(
    *,
    run_id: str,
    session_id: str,
    sequence_no: int,
    phase: str,
    event_type: str,
    status: str,
    summary: str,
    details: Any,
    created_at: dt.datetime,
) -> dict[str, Any]:
    return {
        "runId": run_id,
        "sessionId": session_id,
        "sequenceNo": sequence_no,
        "phase": phase,
        "eventType": event_type,
        "status": status,
        "summary": summary,
        "details": details,
        "createdAt": timestamp(created_at),
    }


def chain_hash(prev_hash: str, payload: dict[str, Any]) -> str:
    return sha256_hex(prev_hash + canonical_json(payload))


# `json.dumps(value, ensure_ascii=False)` of a string, without the encoder's dispatch (the same C function).
_text = json.encoder.encode_basestring


def event_payload_json(
    *,
    run_id: str,
    session_id: str,
    sequence_no: int,
    phase: str,
    event_type: str,
    status: str,
    summary: str,
    details_json: str,
    created_at: dt.datetime,
    created_text: str | None = None,
) -> str:
    """`canonical_json(event_payload(...))` for details already in canonical JSON (`details_json`),
    without serialising them again: the keys in sorted order, compact separators, UTF-8 kept.
    `created_text`: `timestamp(created_at)` when the caller has it already."""
    created = created_text if created_text is not None else timestamp(created_at)
    return (
        f'{{"createdAt":{_text(created)},"details":{details_json},'
        f'"eventType":{_text(event_type)},"phase":{_text(phase)},"runId":{_text(run_id)},'
        f'"sequenceNo":{int(sequence_no)},"sessionId":{_text(session_id)},"status":{_text(status)},'
        f'"summary":{_text(summary)}}}'
    )


def link_hash(event: ChainLink) -> str:
    """Recompute the hash a stored event should carry, from its own stored fields."""
    return chain_hash(
        event.prev_hash,
        event_payload(
            run_id=event.run_id,
            session_id=event.session_id,
            sequence_no=event.sequence_no,
            phase=event.phase,
            event_type=event.event_type,
            status=event.status,
            summary=event.summary,
            details=event.details,
            created_at=event.created_at,
        ),
    )


@dataclass(slots=True)
class ChainVerdict:
    """Result of verifying one run's stored timeline.

    `valid` is true when sequence numbers run 1..n without a gap or repeat, every event's `prev_hash` is
    the previous event's `hash` (GENESIS for the first), and every stored hash matches its recomputation.
    `problems` names each failure in plain words, with sequence numbers but never content.
    """

    events: int = 0
    valid: bool = True
    missing_sequences: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def fail(self, problem: str) -> None:
        self.valid = False
        self.problems.append(problem)


def _content_matches(event: ChainLink) -> bool:
    """Whether the event's stored hash is its recomputation from its own fields.

    An event read with its details as stored text (`details_text`, see `audit.read.timeline_of`)
    is first checked over that text: the recorder stores the canonical JSON it hashed, so the hash of the
    payload built around the text matches exactly when that text and every other field are what was
    hashed (and then re-serialising the decoded details would give the same text). When it does not
    match — details stored in another spelling (ASCII-escaped, or by an older writer), or a changed
    row — the verdict is `link_hash`'s over the decoded details, so both paths give the same answer."""
    text = getattr(event, "details_text", None)
    if text is not None:
        stamp = getattr(event, "created_text", None)  # a stored event's time as text, made once
        payload = event_payload_json(
            run_id=event.run_id,
            session_id=event.session_id,
            sequence_no=event.sequence_no,
            phase=event.phase,
            event_type=event.event_type,
            status=event.status,
            summary=event.summary,
            details_json=text,
            created_at=event.created_at,
            created_text=stamp() if stamp is not None else None,
        )
        if sha256_hex(event.prev_hash + payload) == event.hash:
            return True
    return link_hash(event) == event.hash


def verify_chain(events: Iterable[ChainLink]) -> ChainVerdict:
    """Verify events given in `sequence_no` order (one run)."""
    verdict = ChainVerdict()
    expected_seq = 1
    prev = GENESIS_HASH
    for event in events:
        verdict.events += 1
        seq = event.sequence_no
        if seq < expected_seq:
            verdict.fail(f"sequence {seq} repeated or out of order")
        elif seq > expected_seq:
            missing = list(range(expected_seq, seq))
            verdict.missing_sequences.extend(missing)
            verdict.fail(f"sequence gap: {_ranges(missing)} missing")
        if event.prev_hash != prev:
            verdict.fail(f"sequence {seq}: prev_hash does not match the previous event's hash")
        if not _content_matches(event):
            verdict.fail(f"sequence {seq}: stored hash does not match its content")
        prev = event.hash
        expected_seq = max(expected_seq, seq + 1)
    return verdict


def _ranges(numbers: list[int]) -> str:
    if len(numbers) == 1:
        return str(numbers[0])
    return f"{numbers[0]}–{numbers[-1]}"
