"""What authenticates each stored link of a chain, and which heads the service may build on.

Two rules, each written once here: reading a chain (`tag_verdict`: every link carries a write tag that
verifies, or is a link of before write authentication that a signed leaf or the upgrade's tagged
`WRITE_AUTH_STARTED` vouches for) and writing after a head (`require_authentic_head`: the stored head
must authenticate, otherwise `ChainNotAuthentic` and nothing is written, since tagging a link after a
forged head would authenticate the forgery). Only the service holds the write key, so only it checks
tags; third parties rely on the signed checkpoints and witnesses.
Details: docs/audit-integrity.md, *Write authentication*.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from django.db.models import Q

from audit.models import Checkpoint, GovernanceEvent, GovernanceEventType, LogLeaf
from audit.transparency import keys, leafdata, merkle, note, store
from audit.transparency.checkpoints import check_checkpoint
from core import writeauth


class ChainNotAuthentic(Exception):
    """A stored head the service did not write (no valid tag, nothing in the signed log vouches for it):
    nothing may be chained after it. `code`: the error the run is ended with on its row alone
    (`audit.write.refusal.end_unauthentic_run`)."""

    code = "CHAIN_NOT_AUTHENTIC"


class ChainFinished(ChainNotAuthentic):
    """The stored chain already ends the run (RUN_FINISHED) while its row says it is open: a database
    writer changed the row to reopen it (or, rarer, the row's terminal write failed after RUN_FINISHED
    committed on its own). Nothing may be chained after the end, nothing executed."""

    code = "RUN_REOPENED"


class Link(Protocol):
    sequence_no: int
    hash: str
    tag: str


@dataclass(slots=True)
class TagVerdict:
    """A stored chain's links against their tags. `legacy`: untagged links accepted because the log (or
    the upgrade) vouches for them; `problems`: links not written by the service, named by sequence
    numbers only; `head_key_id`: the key id of the newest valid tag ("" for none)."""

    legacy: int = 0
    problems: list[str] = field(default_factory=list)
    head_key_id: str = ""
    authenticated_upto: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


def tag_verdict(
    links: Iterable[Link],
    *,
    domain: str,
    vouched_upto: int = 0,
    adopted_upto: int | Callable[[], int] = 0,
    verifier: writeauth.Verifier | None = None,
    what: str = "sequence",
) -> TagVerdict:
    """The verdict of `links` (one chain, in sequence order): each must carry a tag that verifies, or be
    untagged at or below `max(vouched_upto, adopted_upto)` (see the module docstring). `adopted_upto`
    may be a callable, asked only when an untagged link lies beyond `vouched_upto` (a query the common
    case never needs)."""
    verifier = verifier or writeauth.verifier()
    allowed: int | None = None
    verdict = TagVerdict()
    unauthenticated: list[int] = []
    bad: dict[str, list[int]] = {}  # problem -> sequence numbers
    for link in links:
        seq = link.sequence_no
        if not link.tag:
            if seq > vouched_upto and allowed is None:
                adopted = adopted_upto() if callable(adopted_upto) else adopted_upto
                allowed = max(vouched_upto, adopted)
            if seq <= vouched_upto or seq <= (allowed or 0):
                verdict.legacy += 1
            else:
                unauthenticated.append(seq)
            continue
        problem = verifier.problem(domain, link.hash, link.tag)
        if problem is None:
            verdict.authenticated_upto = max(verdict.authenticated_upto, seq)
            verdict.head_key_id = writeauth.key_id_of_tag(link.tag)
        else:
            bad.setdefault(problem, []).append(seq)
    for problem, numbers in bad.items():
        verdict.problems.append(f"{_label(what, numbers)}: {problem} (not written by the service)")
    if unauthenticated:
        verdict.problems.append(
            f"{_label(what, unauthenticated)}: no write tag, and nothing in the signed log vouches for "
            f"{'it' if len(unauthenticated) == 1 else 'them'} (not written by the service)"
        )
    return verdict


def _label(what: str, numbers: Sequence[int]) -> str:
    """`sequence 4`, `sequences 1–17`, `governance events 3–5, 9`."""
    if len(numbers) == 1:
        return f"{what} {numbers[0]}"
    plural = "governance events" if what == "governance event" else what + "s"
    return f"{plural} {_ranges(numbers)}"


def _ranges(numbers: Sequence[int]) -> str:
    """`3`, `3–7`, `3–7, 9`: consecutive runs of sequence numbers."""
    parts, start, prev = [], numbers[0], numbers[0]
    for n in numbers[1:]:
        if n == prev + 1:
            prev = n
            continue
        parts.append(str(start) if start == prev else f"{start}–{prev}")
        start = prev = n
    parts.append(str(start) if start == prev else f"{start}–{prev}")
    return ", ".join(parts)


# --------------------------------------------------------------------------------------------------
# What vouches for untagged links
# --------------------------------------------------------------------------------------------------
def legacy_vouched_upto(leaves: Iterable[Any]) -> int:
    """The newest sequence number a leaf of before write authentication anchors among `leaves` (stored
    leaves of one run, or governance leaves), 0 for none; leaves whose data does not decode vouch for
    nothing. Whether each leaf is signed and matches the chain is the log's and the anchor's check."""
    upto = 0
    for leaf in leaves:
        try:
            fields = leafdata.decode_any(leaf.data)
        except ValueError:
            continue
        if leafdata.write_key_id(fields) is None:
            upto = max(upto, fields["lastSequenceNo"])
    return upto


def anchored_before_write_authentication(leaves: Iterable[Any]) -> bool:
    """Whether a leaf of before write authentication anchors the run (its record, row included, is one
    the signed log vouches for: it needs no creation tag)."""
    for leaf in leaves:
        try:
            fields = leafdata.decode_any(leaf.data)
        except ValueError:
            continue
        if leafdata.write_key_id(fields) is None:
            return True
    return False


@dataclass(frozen=True, slots=True)
class Adoption:
    """What the upgrade to write authentication adopted (`WRITE_AUTH_STARTED`, tagged): the governance
    events before it and the chains of the runs still open then, up to their heads."""

    governance_upto: int = 0
    runs: dict[str, int] = field(default_factory=dict)
    access_log_upto: int = 0  # the newest reasoning access-log row of before reads were chained


def adoption(verifier: writeauth.Verifier | None = None) -> Adoption:
    """The upgrade's adoption as its governance event records it; empty when the store was written with
    write authentication from the start (or the event does not authenticate: then it adopts nothing)."""
    verifier = verifier or writeauth.verifier()
    event = (
        GovernanceEvent.objects.filter(event_type=GovernanceEventType.WRITE_AUTH_STARTED)
        .order_by("sequence_no")
        .first()
    )
    if event is None or not verifier.valid(writeauth.GOVERNANCE, event.hash, event.tag):
        return Adoption()
    details = event.details if isinstance(event.details, dict) else {}
    runs = details.get("openRuns") if isinstance(details.get("openRuns"), dict) else {}
    return Adoption(
        governance_upto=event.sequence_no - 1,
        runs={str(k): int(v) for k, v in runs.items() if isinstance(v, int)},
        access_log_upto=int(details.get("accessLogUpto") or 0),
    )


# --------------------------------------------------------------------------------------------------
# Writers: the head they build on
# --------------------------------------------------------------------------------------------------
def require_authentic_head(domain: str, head: Sequence[Any], *, run_id: str | None = None) -> None:
    """ChainNotAuthentic unless the stored head `(sequence_no, hash, tag)` of a run's chain (`run_id`)
    or of the governance chain is one the service wrote: its tag verifies, or it is untagged and a leaf
    of before write authentication anchors exactly it, proven included in the newest signed checkpoint.
    (The upgrade tags the heads it adopts, `audit.transparency.adoption`: they verify by their tags.)"""
    seq, digest, tag = head[0], head[1], head[2] if len(head) > 2 else ""
    verifier = writeauth.verifier()
    where = f"run {run_id}" if run_id else "the governance chain"
    if tag:
        problem = verifier.problem(domain, digest, tag)
        if problem is not None:
            raise ChainNotAuthentic(f"{where}: head at sequence {seq}: {problem}")
        return
    if _vouched_by_log(seq, digest, run_id=run_id):
        return
    raise ChainNotAuthentic(
        f"{where}: head at sequence {seq} carries no write tag and no signed leaf anchors it"
    )


def _vouched_by_log(seq: int, digest: str, *, run_id: str | None) -> bool:
    """Whether a leaf of before write authentication anchors exactly (seq, digest) and is included in the
    newest checkpoint, whose signature verifies with a known key."""
    if run_id is not None:
        rows = LogLeaf.objects.filter(Q(run_id=run_id) | Q(tail_of=run_id))
    else:
        rows = LogLeaf.objects.filter(governance_sequence_no=seq)
    for leaf in rows.order_by("leaf_index"):
        try:
            fields = leafdata.decode_any(leaf.data)
        except ValueError:
            continue
        if (
            leafdata.write_key_id(fields) is None
            and fields["lastSequenceNo"] == seq
            and fields["chainHead"] == digest
            and (run_id is None or fields.get("runId") == run_id)
            and included_in_newest_checkpoint(leaf)
        ):
            return True
    return False


def included_in_newest_checkpoint(leaf: Any) -> bool:
    """Whether the stored leaf is proven included in the newest stored checkpoint, whose signature
    verifies with a key this deployment knows (its body, not its columns, gives size and root)."""
    newest = Checkpoint.objects.order_by("-tree_size").first()
    if newest is None or check_checkpoint(newest, keys.verification_keys()):
        return False
    try:
        body = note.parse_any(newest.body)
        if leaf.leaf_index >= body.tree_size:
            return False
        proof = store.inclusion_proof(leaf.leaf_index, body.tree_size)
        merkle.verify_inclusion(
            merkle.leaf_hash(leaf.data.encode("utf-8")),
            leaf.leaf_index,
            body.tree_size,
            proof.hashes,
            bytes.fromhex(body.root_hash),
        )
    except (note.NoteError, merkle.ProofError, store.TreeIncomplete, ValueError):
        return False
    return True


def authenticated_chain(run_id: str) -> list[Any]:
    """The run's stored events in sequence order, once proven written by the service — the hash chain
    verifies and every link's tag does (or the log or the upgrade vouches for it) — else
    ChainNotAuthentic. What the runtime acts on when it resumes a run (a recorded decision must not be
    one a database writer put there or changed)."""
    from audit.models import TraceEvent
    from audit.verify.hash_chain import verify_chain

    events = list(TraceEvent.objects.filter(run_id=run_id).order_by("sequence_no"))
    chain = verify_chain(events)
    tags = tag_verdict(
        events,
        domain=writeauth.RUN,
        vouched_upto=legacy_vouched_upto(LogLeaf.objects.filter(Q(run_id=run_id) | Q(tail_of=run_id))),
        adopted_upto=lambda: adoption().runs.get(run_id, 0),
    )
    if not chain.valid or not tags.ok:
        raise ChainNotAuthentic(f"run {run_id}: its chain does not authenticate")
    return events


def written_by_the_service(domain: str = writeauth.GOVERNANCE) -> Callable[[Link], bool]:
    """A predicate for single links of the governance chain read on their own (the holds and purges a
    retention purge obeys): its tag verifies, or it is untagged and the upgrade adopted it. A forged
    event — a hold lift, a backdated purge — is never taken for a real one, whatever the rest of the
    chain says (`verify_audit` names it)."""
    verifier = writeauth.verifier()
    adopted: list[int] = []

    def ok(link: Link) -> bool:
        if link.tag:
            return verifier.valid(domain, link.hash, link.tag)
        if not adopted:
            adopted.append(adoption(verifier).governance_upto)
        return link.sequence_no <= adopted[0]

    return ok
