"""The stored tree: complete subtrees read by (level, index), the right edge to append to, proofs, and the
run-tail leaves of runs (`tails_of`, `leaves_and_tails`, looked up in pieces the index serves:
`tail_lookup_pieces`).

Level-0 nodes are leaf hashes (`audit_log_leaf`), higher levels `audit_log_node`. A proof or a root reads
only the nodes `audit.transparency.merkle` names for it: O(log n) rows in two queries (leaves, nodes),
whatever the log's size. `rows_read` of a result says how many rows were read (the benchmark reports it).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from django.db.models import Q, QuerySet

from audit.models import LogLeaf, LogNode
from audit.transparency import merkle
from audit.transparency.merkle import Node

# MariaDB prices an IN list of `eq_range_index_dive_limit` (200) values or more by the index's statistics
# instead of looking each value up, and those of `tail_of` (NULL for almost every leaf: two distinct
# values) then make it read the whole log: 1.3 s a query at 1,000,000 leaves, against 1 ms for 100 values
# looked up. Run ids matched against `tail_of` are asked for in lists this long at most.
TAIL_LOOKUP_PIECE = 100


def tail_lookup_pieces(run_ids: Iterable[str]) -> Iterator[list[str]]:
    """`run_ids`, without repeats and in their order, in lists short enough for `tail_of IN (…)` to be
    looked up in its index (`TAIL_LOOKUP_PIECE`); nothing for no ids."""
    ids = list(dict.fromkeys(run_ids))
    for at in range(0, len(ids), TAIL_LOOKUP_PIECE):
        yield ids[at : at + TAIL_LOOKUP_PIECE]


def leaves_and_tails(run_ids: Iterable[str]) -> Iterator[QuerySet[LogLeaf]]:
    """The leaves of `run_ids` and their run-tail leaves, one query per piece of the ids
    (`tail_lookup_pieces`), unordered: the one home of that lookup for readers that need both."""
    for piece in tail_lookup_pieces(run_ids):
        yield LogLeaf.objects.filter(Q(run_id__in=piece) | Q(tail_of__in=piece))


def tails_of(run_ids: Iterable[str]) -> dict[str, list[LogLeaf]]:
    """The run-tail leaves of each run (by the `tail_of` index; `verify_log` proves every leaf's index
    columns agree with its signed data)."""
    tails: dict[str, list[LogLeaf]] = {}
    for piece in tail_lookup_pieces(run_ids):
        for tail in LogLeaf.objects.filter(tail_of__in=piece).order_by("leaf_index"):
            tails.setdefault(tail.tail_of, []).append(tail)
    return tails


class TreeIncomplete(LookupError):
    """A node the tree of that size must hold is not stored (the log was truncated or altered)."""


def fetch_nodes(nodes: Iterable[Node]) -> dict[Node, bytes]:
    """The stored hashes of `nodes` (at most two queries); TreeIncomplete names the first missing one."""
    wanted = set(nodes)
    leaves = sorted(index for level, index in wanted if level == 0)
    inner = sorted((level, index) for level, index in wanted if level > 0)
    found: dict[Node, bytes] = {}
    if leaves:
        for index, h in LogLeaf.objects.filter(leaf_index__in=leaves).values_list("leaf_index", "leaf_hash"):
            found[(0, index)] = bytes.fromhex(h)
    if inner:
        match = Q()
        for level, index in inner:
            match |= Q(level=level, node_index=index)
        for level, index, h in LogNode.objects.filter(match).values_list("level", "node_index", "hash"):
            found[(level, index)] = bytes.fromhex(h)
    for node in sorted(wanted):
        if node not in found:
            level, index = node
            first, last = index << level, ((index + 1) << level) - 1
            raise TreeIncomplete(
                f"log node level {level} index {index} (leaves {first}–{last}) is not stored"
            )
    return found


def frontier(size: int) -> merkle.Frontier:
    """The right edge of the stored tree of `size` leaves, ready to append to."""
    nodes = merkle.root_nodes(size)
    found = fetch_nodes(nodes)
    return merkle.Frontier(size, [found[n] for n in nodes])


def root(size: int) -> bytes:
    """The MTH of the first `size` stored leaves, from O(log n) stored nodes."""
    if size == 0:
        return merkle.EMPTY_ROOT
    nodes = merkle.root_nodes(size)
    found = fetch_nodes(nodes)
    return merkle.fold([found[n] for n in nodes])


@dataclass(frozen=True, slots=True)
class Proof:
    hashes: list[bytes]
    rows_read: int

    @property
    def hex(self) -> list[str]:
        return [h.hex() for h in self.hashes]


def _proof(ranges: list[merkle.Range]) -> Proof:
    needed = merkle.nodes_needed(ranges)
    found = fetch_nodes(needed)
    return Proof(hashes=merkle.proof_from_nodes(ranges, found.__getitem__), rows_read=len(needed))


def inclusion_proof(index: int, size: int) -> Proof:
    """PATH(index, D[size]) from the stored tree."""
    return _proof(merkle.inclusion_ranges(index, size))


def consistency_proof(old_size: int, new_size: int) -> Proof:
    """PROOF(old_size, D[new_size]) from the stored tree."""
    return _proof(merkle.consistency_ranges(old_size, new_size))
