"""Verification of the transparency log against the store (`manage.py verify_audit`).

`verify_log` reads the whole log once, in leaf order and in batches (bounded memory), and checks leaves,
stored subtrees, checkpoints (signatures, chaining, roots), the head, that every anchored run still
exists or was purged by retention as allowed, an optional witness file and the witness cosignatures.
`check_anchor` compares one run's stored chain with its leaf; `anchor_of` reads a run's leaf and the
checkpoints covering it. Messages name ids, indexes and sizes, never content.
Details: docs/audit-integrity.md, *What `verify_log` checks (`audit/transparency/verify.py`)*.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.db.models import Q

from audit.models import (
    Checkpoint,
    LogHead,
    LogLeaf,
    LogNode,
    RunTombstone,
)
from audit.transparency import keys, leafdata, merkle, signednote, store
from audit.transparency.checkpoints import WitnessEntry, check_checkpoint, checkpoint_targets
from audit.transparency.cosignatures import check_cosignatures, policy_problems
from audit.verify.holds import chained_holds, chained_purges, tombstone_problems
from audit.verify.rows import GOVERNANCE_EVENTS
from core import writeauth
from diagnosis.models import DiagnosisRun

if TYPE_CHECKING:
    from audit.verify.provenance import GovernanceView

UNANCHORED = "finished, not yet anchored in the transparency log (the next checkpoint appends it)"
LEAF_BATCH = 900  # below SQLite's 999 parameters per query
MAX_NODE_PROBLEMS = 20


@dataclass(slots=True)
class LogVerification:
    leaves: int = 0
    checkpoints: int = 0
    purged: int = 0  # anchored runs whose records were purged by retention (tombstones)
    newest: Checkpoint | None = None
    invalid: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # The anchored governance heads, from the leaves' signed data: sequence number → [(leaf index, fields)]
    governance: dict[int, list[tuple[int, dict[str, Any]]]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.invalid


# --------------------------------------------------------------------------------------------------
# The whole log
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Since:
    """A checkpoint verified before (`verify_audit`'s state file, `audit.verify.incremental`): its signed
    size, root and hash. `verify_log(since=…)` walks only the leaves after it, from the stored right edge
    of its tree, which must still make its root."""

    tree_size: int
    root_hash: str
    checkpoint_hash: str


@dataclass(frozen=True, slots=True)
class StoredLeaf:
    """One stored leaf as the verifier reads it: its index columns and its signed data."""

    index: int
    run_id: str | None
    tail_of: str | None
    session_id: str
    governance_sequence_no: int | None
    leaf_hash: str
    data: str


def _leaf_batches(batch_size: int, start: int = 0) -> Iterator[list[StoredLeaf]]:
    last = start - 1
    while True:
        rows = [
            StoredLeaf(*row)
            for row in LogLeaf.objects.filter(leaf_index__gt=last)
            .order_by("leaf_index")
            .values_list(
                "leaf_index", "run_id", "tail_of", "session_id", "governance_sequence_no", "leaf_hash", "data"
            )[:batch_size]
        ]
        if not rows:
            return
        last = rows[-1].index
        yield rows


def leaf_problems(leaf: StoredLeaf) -> tuple[dict[str, Any] | None, list[str]]:
    """(decoded fields or None, problems) of one stored leaf: its data must be the canonical form of a
    known kind, and its index columns must say exactly what that data says (a column is an index, never
    a source: a leaf whose `run_id` was set to NULL still anchors its run)."""
    where = f"log leaf {leaf.index}"
    try:
        fields = leafdata.decode_any(leaf.data)
    except ValueError as exc:
        return None, [f"{where}: {exc}"]
    kind = fields["kind"]
    if kind == leafdata.KIND_GOVERNANCE:
        wanted = (None, None, "", fields["lastSequenceNo"])
        what = f"governance event {fields['lastSequenceNo']}"
    elif kind == leafdata.KIND_RUN_TAIL:
        wanted = (None, fields["runId"], fields["sessionId"], None)
        what = f"the tail of run {fields['runId']}"
    else:
        wanted = (fields["runId"], None, fields["sessionId"], None)
        what = f"run {fields['runId']}"
    stored = (leaf.run_id, leaf.tail_of, leaf.session_id, leaf.governance_sequence_no)
    problems = []
    if stored != wanted:
        names = ("run_id", "tail_of", "session_id", "governance_sequence_no")
        differ = ", ".join(n for n, a, b in zip(names, stored, wanted, strict=True) if a != b)
        problems.append(
            f"{where}: its index column(s) {differ} differ from its signed data, which anchors {what}"
        )
    return fields, problems


_TWICE = "stored more than once"  # never a node hash (64 hex digits)


def _stored_nodes(first: int, end: int) -> dict[tuple[int, int], str]:
    """Stored nodes (level ≥ 1) completed by the leaves [first, end)."""
    match = Q()
    level = 1
    while (1 << level) <= end:
        # Node (level, i) is completed by leaf (i + 1) * 2^level - 1: first <= that < end.
        width = 1 << level
        lo = -(-(first + 1) // width) - 1
        hi = end // width - 1
        if hi >= lo:
            match |= Q(level=level, node_index__gte=lo, node_index__lte=hi)
        level += 1
    if not match:
        return {}
    found: dict[tuple[int, int], str] = {}  # a node stored twice (its unique index dropped) is named
    for lv, ix, h in LogNode.objects.filter(match).values_list("level", "node_index", "hash"):
        found[(lv, ix)] = _TWICE if (lv, ix) in found else h
    return found


def verify_log(
    *,
    witness: Sequence[WitnessEntry] = (),
    batch_size: int = LEAF_BATCH,
    policy: signednote.Policy | None = None,
    witnesses: Sequence[signednote.Verifier] = (),
    governance: GovernanceView | None = None,
    since: Since | None = None,
) -> LogVerification:
    """Verify the whole log (see the module docstring), or with `since` what was appended after that
    checkpoint: the checkpoints from it on, the leaves after it and the nodes they complete, from the
    stored right edge of its tree (which must make its signed root), and the consistency proof from it to
    the newest checkpoint. Every conclusion about what is anchored comes
    from the leaves' signed data: the anchored runs (whose records must still exist, or be purged by a
    chained retention purge) and the anchored governance heads (`governance`, for
    `audit.verify.governance_chain.verify_governance`). `governance`: the chained purges and holds as this
    verification read them (`audit.verify.provenance.GovernanceView`; read here when not given)."""
    result = LogVerification()
    purges = chained_purges() if governance is None else governance.purges
    holds = chained_holds() if governance is None else governance.holds
    known = keys.verification_keys()
    start = since.tree_size if since is not None else 0
    checkpoints = list(Checkpoint.objects.filter(tree_size__gte=start).order_by("tree_size"))
    result.checkpoints = len(checkpoints)
    result.newest = checkpoints[-1] if checkpoints else None
    cosigners = [*witnesses, *(policy.witnesses if policy else ())]
    first = checkpoints[0] if since is not None and checkpoints else None
    previous = (
        first.previous_hash if first is not None and first.checkpoint_hash == since.checkpoint_hash else ""
    )
    targets = checkpoint_targets(result.invalid, checkpoints, known, cosigners, witness, previous=previous)
    head = LogHead.objects.filter(pk=1).first()
    if head is not None and head.tree_size:
        targets.setdefault(head.tree_size, []).append(("log head", head.root_hash))
    walk = _LeafWalk(result, targets, checkpoints, purges=purges, holds=holds)
    if since is not None:
        walk.start_at(since)
    for rows in _leaf_batches(batch_size, start):
        walk.batch(rows)
    walk.done()
    _check_coverage(result, targets, walk.frontier.size, head, policy, checkpoints, since=since)
    return result


class _LeafWalk:
    """The leaves, in order, one batch at a time: contiguity, leaf hashes, stored nodes, roots, and the
    anchored runs still present (or purged by a chained retention purge)."""

    def __init__(
        self,
        result: LogVerification,
        targets: dict[int, list[tuple[str, str]]],
        checkpoints: list[Checkpoint],
        *,
        purges: Any,
        holds: Any,
    ) -> None:
        self.result = result
        self.targets = targets
        self.checkpoints = checkpoints
        self.purges = purges
        self.holds = holds
        self.frontier = merkle.Frontier()
        self.node_problems = 0
        self.purged_seen: set[str] = set()
        self.authenticated_since: int | None = None  # the first leaf that names a write key

    def start_at(self, since: Since) -> None:
        """Continue after a checkpoint verified before: the stored right edge of its tree must make its
        signed root (else a node, or a leaf under it, was changed since)."""
        try:
            self.frontier = store.frontier(since.tree_size)
        except store.TreeIncomplete as exc:
            self.result.invalid.append(f"verified checkpoint tree_size={since.tree_size}: {exc}")
            self.frontier = merkle.Frontier()
            while self.frontier.size < since.tree_size:
                self.frontier.append(merkle.EMPTY_ROOT)
            return
        if self.frontier.root().hex() != since.root_hash:
            self.result.invalid.append(
                f"verified checkpoint tree_size={since.tree_size}: the stored tree no longer makes its "
                "signed root (a stored node or leaf of the verified log was changed)"
            )
        # The verified log held no untagged leaf after a tagged one: its last leaf says which it was.
        last = LogLeaf.objects.filter(leaf_index=since.tree_size - 1).values_list("data", flat=True).first()
        try:
            tagged = last is not None and leafdata.write_key_id(leafdata.decode_any(last)) is not None
        except ValueError:
            tagged = False
        self.authenticated_since = since.tree_size - 1 if tagged else None

    def batch(self, rows: list[LogLeaf]) -> None:
        first = self.frontier.size
        made: dict[tuple[int, int], str] = {}
        anchored_runs: dict[str, tuple[int, dict[str, Any]]] = {}
        for leaf in rows:
            self._leaf(leaf, made, anchored_runs)
        self._nodes(made, _stored_nodes(first, self.frontier.size))
        self._anchored(anchored_runs)

    def _leaf(
        self,
        leaf: LogLeaf,
        made: dict[tuple[int, int], str],
        anchored_runs: dict[str, tuple[int, dict[str, Any]]],
    ) -> None:
        result, frontier = self.result, self.frontier
        index, leaf_hex, data = leaf.index, leaf.leaf_hash, leaf.data
        fields, problems = leaf_problems(leaf)
        result.invalid.extend(problems)
        if fields is not None and leafdata.write_key_id(fields) is not None:
            self.authenticated_since = index if self.authenticated_since is None else self.authenticated_since
        elif fields is not None and self.authenticated_since is not None:
            result.invalid.append(
                f"log leaf {index}: a leaf of before write authentication after an authenticated one "
                f"(leaf {self.authenticated_since}): the log vouches for untagged records only before"
            )
        if fields is not None and fields["kind"] == leafdata.KIND_GOVERNANCE:
            result.governance.setdefault(fields["lastSequenceNo"], []).append((index, fields))
        elif fields is not None:
            anchored_runs.setdefault(fields["runId"], (index, fields))
        if index != frontier.size:
            gap = f"{frontier.size}" if index == frontier.size + 1 else f"{frontier.size}–{index - 1}"
            result.invalid.append(f"log leaf index {gap} missing (the log was cut or reordered)")
            # Continue from the stored index so later checks still run; roots will not match.
            while frontier.size < index:
                frontier.append(merkle.EMPTY_ROOT)
        computed = merkle.leaf_hash(data.encode("utf-8"))
        if computed.hex() != leaf_hex:
            what = f"run {fields['runId']}" if fields and "runId" in fields else "governance"
            result.invalid.append(f"log leaf {index} ({what}): leaf hash does not match its data")
        try:
            stored_hash = bytes.fromhex(leaf_hex)
        except (ValueError, TypeError):
            stored_hash = computed  # named just above; the roots will still be checked
        for level, node_index, h in frontier.append(stored_hash):
            made[(level, node_index)] = h.hex()
        for label, root_hex in self.targets.get(frontier.size, ()):
            if frontier.root().hex() != root_hex:
                result.invalid.append(f"{label}: root does not match the first {frontier.size} stored leaves")

    def _nodes(self, made: dict[tuple[int, int], str], stored: dict[tuple[int, int], str]) -> None:
        """The stored nodes the batch completed, against those its leaves make."""
        for node in sorted(set(made) | set(stored)):
            if made.get(node) == stored.get(node):
                continue
            self.node_problems += 1
            if self.node_problems > MAX_NODE_PROBLEMS:
                continue
            level, node_index = node
            span = f"leaves {node_index << level}–{((node_index + 1) << level) - 1}"
            if node not in stored:
                self.result.invalid.append(f"log node level {level} index {node_index} ({span}) missing")
            elif node not in made:
                self.result.invalid.append(
                    f"log node level {level} index {node_index} ({span}) stored but not expected"
                )
            else:
                what = "is stored more than once" if stored[node] is _TWICE else "does not match its leaves"
                self.result.invalid.append(f"log node level {level} index {node_index} ({span}) {what}")

    def _anchored(self, anchored_runs: dict[str, tuple[int, dict[str, Any]]]) -> None:
        """Every run these leaves anchor (from their data) must still exist, or be purged by retention."""
        result = self.result
        present = set(
            DiagnosisRun.objects.filter(run_id__in=list(anchored_runs)).values_list("run_id", flat=True)
        )
        gone = {run_id: at for run_id, at in anchored_runs.items() if run_id not in present}
        tombstones = {t.run_id: t for t in RunTombstone.objects.filter(run_id__in=list(gone))} if gone else {}
        for run_id, (index, fields) in sorted(gone.items(), key=lambda item: item[1][0]):
            tombstone = tombstones.get(run_id)
            if tombstone is None:
                result.invalid.append(f"anchored run {run_id} (leaf {index}) is missing from the store")
                continue
            if run_id in self.purged_seen:
                continue
            self.purged_seen.add(run_id)
            result.purged += 1
            first = next((cp for cp in self.checkpoints if cp.tree_size > index), None)
            result.invalid.extend(
                tombstone_problems(
                    tombstone,
                    leaf_index=index,
                    finished_at=fields.get("finishedAt"),
                    signed_at=first.signed_at if first else None,
                    purge=self.purges.get(run_id),
                    holds=self.holds,
                    session_id=fields.get("sessionId"),
                )
            )

    def done(self) -> None:
        """After the last batch: the node problems left unnamed, nodes stored beyond the leaves."""
        result, size = self.result, self.frontier.size
        if self.node_problems > MAX_NODE_PROBLEMS:
            result.invalid.append(f"… and {self.node_problems - MAX_NODE_PROBLEMS} more log node problem(s)")
        beyond = _nodes_beyond(size)
        if beyond:
            result.invalid.append(f"{beyond} log node(s) stored beyond the leaves")
        result.leaves = size


def _nodes_beyond(size: int) -> int:
    """How many stored nodes no tree of `size` leaves has (a level below 1 or beyond its top, an index
    negative or at or past `size >> level`): one index range per level, not a count of the whole table.
    Those in range are checked by the walk (`_LeafWalk._nodes`: a node stored twice too) or, incremental,
    by the right edge that must make the verified checkpoint's root (`_LeafWalk.start_at`)."""
    top = size.bit_length()  # the levels 1 … top - 1 hold nodes (level L: size >> L of them)
    outside = Q(level__lt=1) | Q(level__gte=max(top, 1))
    for level in range(1, top):
        outside |= Q(level=level, node_index__lt=0) | Q(level=level, node_index__gte=size >> level)
    return LogNode.objects.filter(outside).count()


def _check_coverage(
    result: LogVerification,
    targets: dict[int, list[tuple[str, str]]],
    size: int,
    head: LogHead | None,
    policy: signednote.Policy | None,
    checkpoints: list[Checkpoint],
    *,
    since: Since | None = None,
) -> None:
    """What the stored leaves (`size`) must cover: every signed, witnessed and head tree size, no leaf
    unsigned; the head's count, the witness policy, and the consistency of the last two checkpoints."""
    for tree_size in sorted(targets):
        if tree_size > size:
            for label, _ in targets[tree_size]:
                result.invalid.append(
                    f"{label}: covers {tree_size} leaves but only {size} are stored (the log was truncated)"
                )
    if result.newest is not None and size > result.newest.tree_size:
        result.invalid.append(
            f"log leaves {result.newest.tree_size}–{size - 1} are not covered by a signed checkpoint"
        )
    if result.newest is None and size:
        result.invalid.append(f"{size} log leaves but no checkpoint signs them")
    if head is not None and head.tree_size != size:
        result.invalid.append(f"log head says {head.tree_size} leaves, {size} are stored")
    if policy is not None:
        result.invalid.extend(policy_problems(result.newest, policy))
    pairs = []
    if len(checkpoints) >= 2:
        pairs.append((checkpoints[-2].tree_size, checkpoints[-2].root_hash))
    if since is not None and since.tree_size and result.newest is not None:
        pairs.append((since.tree_size, since.root_hash))  # nothing the verified checkpoint signed changed
    for old_size, old_root in pairs if not result.invalid else ():
        newer = checkpoints[-1]
        if old_size >= newer.tree_size:
            continue
        try:
            proof = store.consistency_proof(old_size, newer.tree_size)
            merkle.verify_consistency(
                old_size,
                newer.tree_size,
                bytes.fromhex(old_root),
                bytes.fromhex(newer.root_hash),
                proof.hashes,
            )
        except (merkle.ProofError, store.TreeIncomplete, ValueError) as exc:
            result.invalid.append(f"consistency proof {old_size} → {newer.tree_size}: {exc}")


# --------------------------------------------------------------------------------------------------
# One run's anchor
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Anchor:
    """A run's leaf and the checkpoints covering it: the first (when it was anchored) and the newest."""

    leaf: LogLeaf
    first: Checkpoint | None
    newest: Checkpoint | None


def anchor_of(run_id: str) -> Anchor | None:
    """The run's leaf and covering checkpoints (three queries), or None when it is not in the log."""
    leaf = LogLeaf.objects.filter(run_id=run_id).first()
    if leaf is None:
        return None
    covering = Checkpoint.objects.filter(tree_size__gt=leaf.leaf_index)
    return Anchor(
        leaf=leaf,
        first=covering.order_by("tree_size").first(),
        newest=covering.order_by("-tree_size").first(),
    )


def check_anchor(
    *,
    run: Any | None,
    events: Sequence[Any],
    leaf: LogLeaf | None,
    tails: Sequence[LogLeaf] = (),
    tail_noted: bool | None = None,
) -> tuple[list[str], list[str]]:
    """(problems, notes) of a run's stored chain against every head anchored for it: its run leaf and
    its run-tail leaves (`tails`, any order; without them only the run leaf is checked, and events after
    its head need only be tail events). `events` in sequence order. Notes: `UNANCHORED` for a finished
    run not in the log yet, and events appended after the newest anchored head (anchored by the next
    checkpoint) — a problem instead when `tail_noted` is False: nothing would ever anchor them, as the
    note the append wrote in its transaction (`audit.write.tail`) is gone."""
    if leaf is None:
        problems = [f"log leaf {t.leaf_index}: a tail of the run, which has no run leaf" for t in tails]
        if run is not None and run.is_terminal:
            return problems, [UNANCHORED]
        return problems, []
    problems: list[str] = []
    try:
        anchored = leafdata.decode(leaf.data)
    except ValueError:
        return [f"leaf {leaf.leaf_index}: stored leaf data is not a run leaf"], []
    where = f"anchored in log leaf {leaf.leaf_index}"
    if anchored["runId"] != leaf.run_id:
        problems.append(f"{where}: the leaf names another run")
    last = anchored["lastSequenceNo"]
    prefix = leafdata.anchored_prefix(events, last)
    session_id = run.session_id if run is not None else prefix[0].session_id if prefix else ""
    now = leafdata.run_leaf(run_id=leaf.run_id, session_id=session_id, events=prefix)
    if now["lastSequenceNo"] != last:
        problems.append(
            f"{where}: events up to sequence {last} were anchored, the chain stops at {now['lastSequenceNo']}"
        )
    elif now["chainHead"] != anchored["chainHead"]:
        problems.append(
            f"{where}: the chain head at sequence {last} differs from the anchored one "
            "(the run was rewritten)"
        )
    for key, label in (
        ("runDigest", "terminal summary digest"),
        ("finishedAt", "finish time"),
        ("sessionId", "session"),
    ):
        if now[key] != anchored[key] and not problems:
            problems.append(f"{where}: the {label} differs from the anchored one")
    by_seq = {e.sequence_no: e for e in events}
    problems.extend(_write_key_problems(where, anchored, by_seq.get(last)))
    later = [e for e in events if e.sequence_no > last and e.event_type not in GOVERNANCE_EVENTS]
    if later:
        problems.append(
            f"{where}: {len(later)} event(s) after the anchored head (sequence {last}) "
            "that are not governance events"
        )
    newest = last
    for tail in sorted(tails, key=lambda t: t.leaf_index):
        at = f"anchored in log leaf {tail.leaf_index} (a tail)"
        try:
            fields = leafdata.decode_any(tail.data)
        except ValueError:
            problems.append(f"{at}: stored leaf data is not a leaf")
            continue
        if fields["kind"] != leafdata.KIND_RUN_TAIL or fields["runId"] != leaf.run_id:
            problems.append(f"{at}: the leaf is not a tail of this run")
            continue
        if tail.leaf_index < leaf.leaf_index:
            problems.append(f"{at}: comes before the run's own leaf {leaf.leaf_index}")
        seq = fields["lastSequenceNo"]
        if seq <= newest:
            problems.append(f"{at}: anchors sequence {seq}, not after the head anchored before ({newest})")
        head = by_seq.get(seq)
        if head is None:
            problems.append(f"{at}: events up to sequence {seq} were anchored, the chain stops before")
        elif head.hash != fields["chainHead"]:
            problems.append(
                f"{at}: the chain head at sequence {seq} differs from the anchored one "
                "(the run's record was rewritten after it was anchored)"
            )
        else:
            problems.extend(_write_key_problems(at, fields, head))
        if fields["sessionId"] != anchored["sessionId"]:
            problems.append(f"{at}: names another session than the run's leaf")
        newest = max(newest, seq)
    notes = []
    pending = sum(1 for e in events if e.sequence_no > newest)
    if pending and tail_noted is False:
        problems.append(
            f"{pending} event(s) appended after the newest anchored head (sequence {newest}) have no tail "
            "note: no checkpoint will anchor them (the note written with them was deleted)"
        )
    elif pending and not problems:
        notes.append(
            f"{pending} event(s) appended after the newest anchored head (sequence {newest}); "
            "the next checkpoint anchors them"
        )
    if run is not None and not run.is_terminal:
        problems.append(f"{where} as finished, but the run is stored as {run.status}")
    return problems, notes


def _write_key_problems(where: str, fields: dict[str, Any], head: Any | None) -> list[str]:
    """An authenticated leaf names the write key of the tag on the head it anchors (whether that tag
    verifies is `audit.verify.authenticity.tag_verdict`'s check of the chain)."""
    wanted = leafdata.write_key_id(fields)
    if wanted is None or head is None:
        return []
    if writeauth.key_id_of_tag(getattr(head, "tag", "")) != wanted:
        return [f"{where}: the anchored head's write tag is not by the write key {wanted} the leaf names"]
    return []


def leaves_of(run_ids: Iterable[str]) -> dict[str, LogLeaf]:
    return {leaf.run_id: leaf for leaf in LogLeaf.objects.filter(run_id__in=list(run_ids))}


def prove_run(run_id: str, policy: signednote.Policy | None = None) -> tuple[list[str], str | None]:
    """(problems, summary) of one run's inclusion in the newest checkpoint, proven from the stored tree
    (O(log n) nodes) and the checkpoint's signature, and, with a witness `policy`, that checkpoint's
    cosignatures; summary None when the run is not in the log."""
    anchor = anchor_of(run_id)
    if anchor is None:
        return [], None
    leaf = anchor.leaf
    newest = anchor.newest
    if newest is None:
        return [f"log leaf {leaf.leaf_index} is not covered by a signed checkpoint"], None
    problems = check_checkpoint(newest, keys.verification_keys())
    if policy is not None:
        problems += check_cosignatures(newest, policy.witnesses) + policy_problems(newest, policy)
    leaf_hash = merkle.leaf_hash(leaf.data.encode("utf-8"))
    if leaf_hash.hex() != leaf.leaf_hash:
        problems.append(f"log leaf {leaf.leaf_index}: leaf hash does not match its data")
    try:
        proof = store.inclusion_proof(leaf.leaf_index, newest.tree_size)
        merkle.verify_inclusion(
            leaf_hash, leaf.leaf_index, newest.tree_size, proof.hashes, bytes.fromhex(newest.root_hash)
        )
    except (merkle.ProofError, store.TreeIncomplete) as exc:
        problems.append(
            f"inclusion of log leaf {leaf.leaf_index} in checkpoint tree_size={newest.tree_size}: {exc}"
        )
    summary = (
        f"anchored at log leaf {leaf.leaf_index}; inclusion in checkpoint tree_size={newest.tree_size} "
        f"(signed {newest.signed_at.isoformat()}, key {newest.key_id}) "
        + ("verified" if not problems else "FAILED")
    )
    return problems, summary
