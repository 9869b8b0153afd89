"""The governance chain verified whole (`verify_audit`): sequence numbers without gap, each link and
hash, each write tag, every anchor of its head in the transparency log (found by the leaves' signed
data), the rights its held events needed, the legal-hold table against the chained holds, and the
reasoning access log against its chained reads. Problems name sequence numbers, leaf indexes and ids.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from django.db.models import Q

from audit.models import (
    GovernanceEvent,
    LogLeaf,
)
from audit.transparency import leafdata
from audit.verify import authority
from audit.verify.access_log import read_problems
from audit.verify.authenticity import (
    tag_verdict,
)
from audit.verify.hash_chain import GENESIS_HASH, timestamp
from audit.verify.holds import hold_problems
from audit.verify.provenance import GovernanceView
from audit.write.governance import governance_hash
from core import writeauth


def verify_governance(
    *,
    batch_size: int = 1000,
    anchors: dict[int, list[tuple[int, dict[str, Any] | None]]] | None = None,
    governance: GovernanceView | None = None,
) -> tuple[int, list[str]]:
    """(events checked, problems) of the whole governance chain: sequence numbers 1..n without gap or
    repeat, each `prev_hash` the previous event's hash, each hash recomputed from the stored fields, and
    every anchor of the chain's head in the transparency log (a governance leaf: the event it names must
    still exist with the hash and time the leaf committed to, so a chain rewritten and re-hashed after a
    checkpoint anchored it is named, as is one cut below an anchor). The anchors come from the leaves'
    signed data (`anchors`, as `audit.transparency.verify.verify_log` derived them, else
    `governance_anchors`), never from their index columns; that the leaves are the signed ones is
    `verify_log`'s check. Then the legal-hold table against the holds the chain placed and lifted
    (`audit.verify.holds.hold_problems`). Problems name sequence numbers, leaf indexes and hold ids only.
    Reads `batch_size` events at a time; `governance`: the chain's replayed rights, holds and adoption
    as this verification read them (read here when not given)."""
    governance = governance or GovernanceView.load()
    problems: list[str] = []
    anchors = {
        seq: list(leaves) for seq, leaves in (governance_anchors() if anchors is None else anchors).items()
    }
    # Untagged events only where a governance leaf of before write authentication vouches for them.
    vouched = max(
        (seq for seq, leaves in anchors.items() for _, f in leaves if f and leafdata.write_key_id(f) is None),
        default=0,
    )
    links: list[_Link] = []
    held_events: list[GovernanceEvent] = []  # events whose actor needed a right (legal holds)
    expected, prev, checked, last_seen, last_at = 1, GENESIS_HASH, 0, 0, None
    while True:
        batch = list(
            GovernanceEvent.objects.filter(sequence_no__gt=last_seen).order_by("sequence_no")[:batch_size]
        )
        if not batch:
            break
        for event in batch:
            checked += 1
            seq = event.sequence_no
            if seq > expected:
                problems.append(f"governance sequence gap: {expected}–{seq - 1} missing")
            if event.prev_hash != prev:
                problems.append(f"governance event {seq}: prev_hash does not match the previous event's hash")
            if governance_hash(event) != event.hash:
                problems.append(f"governance event {seq}: stored hash does not match its content")
            if event.tag and last_at is not None and event.created_at < last_at:
                problems.append(f"governance event {seq}: its time is before the previous event's")
            links.append(_Link(seq, event.hash, event.tag))
            if event.event_type in authority.GOVERNANCE_RIGHTS:
                held_events.append(event)
            for leaf_index, fields in anchors.pop(seq, ()):
                if fields is None:
                    problems.append(f"log leaf {leaf_index}: not a canonical governance leaf")
                elif fields["chainHead"] != event.hash or fields["lastEventAt"] != timestamp(
                    event.created_at
                ):
                    problems.append(
                        f"governance event {seq}: differs from the head anchored in the transparency log "
                        f"(leaf {leaf_index}): the chain was rewritten after it was anchored"
                    )
                elif (key := leafdata.write_key_id(fields)) and writeauth.key_id_of_tag(event.tag) != key:
                    problems.append(
                        f"governance event {seq}: its write tag is not by the key {key} its leaf "
                        f"{leaf_index} names"
                    )
            prev, expected, last_seen, last_at = event.hash, seq + 1, seq, event.created_at
    for seq, leaves in sorted(anchors.items()):
        for leaf_index, _ in leaves:
            problems.append(
                f"governance event {seq}: anchored in the transparency log (leaf {leaf_index}) but missing "
                "from the chain"
            )
    tags = tag_verdict(
        links,
        domain=writeauth.GOVERNANCE,
        vouched_upto=vouched,
        adopted_upto=lambda: governance.adopted.governance_upto,
        what="governance event",
    )
    problems.extend(tags.problems)
    if tags.ok and not problems:  # rights are replayed only from a chain that verifies
        problems.extend(authority.governance_problems(held_events, governance.authority))
    problems.extend(hold_problems(governance.holds))
    problems.extend(read_problems(adopted=governance.adopted)[0])
    return checked, problems


@dataclass(frozen=True, slots=True)
class _Link:
    sequence_no: int
    hash: str
    tag: str


def governance_anchors(*, below: int | None = None) -> dict[int, list[tuple[int, dict[str, Any] | None]]]:
    """The governance leaves of the transparency log, found by their signed data (and, for a leaf whose
    data no longer decodes, by the index column): sequence number → [(leaf index, decoded fields or None
    when the data is not a canonical governance leaf)]. One per checkpoint that found the chain grown.
    `below`: only the leaves of a log verified up to that size, by their index column (which that
    verification held to their data), for an incremental verification."""
    anchors: dict[int, list[tuple[int, dict[str, Any] | None]]] = defaultdict(list)
    found = Q(governance_sequence_no__isnull=False)
    if below is None:
        found |= Q(data__contains='"kind":"governance"')
    else:
        found &= Q(leaf_index__lt=below)
    rows = (
        LogLeaf.objects.filter(found)
        .order_by("leaf_index")
        .values_list("leaf_index", "governance_sequence_no", "data")
    )
    for leaf_index, seq, data in rows:
        try:
            fields = leafdata.decode_governance(data)
        except ValueError:
            fields = None
        if fields is not None:
            anchors[fields["lastSequenceNo"]].append((leaf_index, fields))
        elif seq is not None:
            anchors[seq].append((leaf_index, None))
    return dict(anchors)


def newest_governance_anchor(anchors: dict[int, list] | None = None) -> int:
    """The sequence number of the newest anchored governance event (0: none anchored yet), from the
    leaves' signed data."""
    anchors = governance_anchors() if anchors is None else anchors
    return max(anchors, default=0)
