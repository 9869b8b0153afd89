"""RFC 9162 §2.1 Merkle tree hashing, proofs and their verification; the standard library only.

Leaf hash `SHA-256(0x00 || data)`, node `SHA-256(0x01 || left || right)`; inclusion (PATH) and
consistency (PROOF) proofs and their verifiers are the RFC's algorithms. Proofs are read from stored
complete subtrees, O(log n) nodes each (`inclusion_ranges`, `consistency_ranges`, `range_nodes`,
`fold`); `Frontier` is a growing tree's right edge. `mth`, `path` and `subproof` are the RFC's recursive
definitions, kept as the reference the storage-shaped functions are tested against.
Details: docs/audit-integrity.md, *Merkle tree (`audit/transparency/merkle.py`)*.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

LEAF_PREFIX = b"\x00"
NODE_PREFIX = b"\x01"
HASH_BYTES = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()

Node = tuple[
    int, int
]  # (level, index): the complete subtree of leaves [index << level, (index + 1) << level)
Range = tuple[int, int]  # [start, end) of leaf indexes


class ProofError(ValueError):
    """A proof that does not verify; the message says which check failed (no data)."""


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(LEAF_PREFIX + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(NODE_PREFIX + left + right).digest()


def split(n: int) -> int:
    """The largest power of two smaller than `n` (n ≥ 2)."""
    if n < 2:
        raise ValueError("a split needs at least two leaves")
    return 1 << ((n - 1).bit_length() - 1)


# --------------------------------------------------------------------------------------------------
# The RFC's recursive definitions (reference)
# --------------------------------------------------------------------------------------------------
def mth(leaves: Sequence[bytes]) -> bytes:
    """MTH(D[n]) of a list of leaf hashes (§2.1.1)."""
    n = len(leaves)
    if n == 0:
        return EMPTY_ROOT
    if n == 1:
        return leaves[0]
    k = split(n)
    return node_hash(mth(leaves[:k]), mth(leaves[k:]))


def path(m: int, leaves: Sequence[bytes]) -> list[bytes]:
    """PATH(m, D[n]) (§2.1.3.1)."""
    n = len(leaves)
    if not 0 <= m < n:
        raise ValueError("leaf index outside the tree")
    if n == 1:
        return []
    k = split(n)
    if m < k:
        return [*path(m, leaves[:k]), mth(leaves[k:])]
    return [*path(m - k, leaves[k:]), mth(leaves[:k])]


def subproof(m: int, leaves: Sequence[bytes], b: bool = True) -> list[bytes]:
    """SUBPROOF(m, D[n], b) (§2.1.4.1); PROOF(m, D[n]) is `subproof(m, leaves, True)`."""
    n = len(leaves)
    if m == n:
        return [] if b else [mth(leaves)]
    k = split(n)
    if m <= k:
        return [*subproof(m, leaves[:k], b), mth(leaves[k:])]
    return [*subproof(m - k, leaves[k:], False), mth(leaves[:k])]


# --------------------------------------------------------------------------------------------------
# The same proofs as leaf ranges, and ranges as stored complete subtrees
# --------------------------------------------------------------------------------------------------
def inclusion_ranges(index: int, size: int) -> list[Range]:
    """The ranges whose MTHs form PATH(index, D[size]), leaf side first."""
    if not 0 <= index < size:
        raise ValueError("leaf index outside the tree")
    ranges: list[Range] = []
    start, end = 0, size
    while end - start > 1:
        k = split(end - start)
        if index < start + k:
            ranges.append((start + k, end))
            end = start + k
        else:
            ranges.append((start, start + k))
            start += k
    ranges.reverse()
    return ranges


def consistency_ranges(old_size: int, new_size: int) -> list[Range]:
    """The ranges whose MTHs form PROOF(old_size, D[new_size]), leaf side first (empty when equal)."""
    if not 0 < old_size <= new_size:
        raise ValueError("a consistency proof needs 0 < old size <= new size")
    ranges: list[Range] = []
    start, end, complete = 0, new_size, True
    while True:
        n, m = end - start, old_size - start
        if m == n:
            if not complete:
                ranges.append((start, end))
            break
        k = split(n)
        if m <= k:
            ranges.append((start + k, end))
            end = start + k
        else:
            ranges.append((start, start + k))
            start += k
            complete = False
    ranges.reverse()
    return ranges


def range_nodes(start: int, end: int) -> list[Node]:
    """The maximal complete subtrees that make up `[start, end)`, left to right. For the ranges of the
    RFC recursion (and `[0, n)`) their right fold is the range's MTH."""
    if not 0 <= start < end:
        raise ValueError("an empty or negative range has no nodes")
    nodes: list[Node] = []
    while start < end:
        level = (end - start).bit_length() - 1
        while start & ((1 << level) - 1):
            level -= 1
        nodes.append((level, start >> level))
        start += 1 << level
    return nodes


def fold(hashes: Sequence[bytes]) -> bytes:
    """The MTH of consecutive complete subtrees, largest first: `H(h1, H(h2, … hk))`."""
    if not hashes:
        raise ValueError("nothing to fold")
    root = hashes[-1]
    for h in reversed(hashes[:-1]):
        root = node_hash(h, root)
    return root


def proof_from_nodes(ranges: Sequence[Range], lookup: Callable[[Node], bytes]) -> list[bytes]:
    """The proof hashes of `ranges` from stored complete subtrees (`lookup((level, index))`)."""
    return [fold([lookup(node) for node in range_nodes(*r)]) for r in ranges]


def nodes_needed(ranges: Sequence[Range]) -> set[Node]:
    """Every stored node the ranges read (to fetch them in one query)."""
    return {node for r in ranges for node in range_nodes(*r)}


def root_nodes(size: int) -> list[Node]:
    """The complete subtrees of a tree of `size` leaves (its right edge): `size`'s binary digits."""
    return range_nodes(0, size) if size else []


# --------------------------------------------------------------------------------------------------
# Appending
# --------------------------------------------------------------------------------------------------
class Frontier:
    """The complete subtrees of a tree of `size` leaves, as (level, hash), largest first.

    `append` adds one leaf hash and returns the complete nodes it completes (level ≥ 1, with index and
    hash), which the log stores; `root()` is the tree head."""

    def __init__(self, size: int = 0, hashes: Sequence[bytes] = ()) -> None:
        levels = [level for level, _ in root_nodes(size)]
        if len(levels) != len(hashes):
            raise ValueError(f"a tree of {size} leaves has {len(levels)} right-edge nodes, not {len(hashes)}")
        self.size = size
        self._stack: list[tuple[int, bytes]] = list(zip(levels, hashes, strict=True))

    def append(self, leaf: bytes) -> list[tuple[int, int, bytes]]:
        index = self.size
        self.size += 1
        self._stack.append((0, leaf))
        made: list[tuple[int, int, bytes]] = []
        while len(self._stack) >= 2 and self._stack[-1][0] == self._stack[-2][0]:
            level, right = self._stack.pop()
            _, left = self._stack.pop()
            parent = node_hash(left, right)
            self._stack.append((level + 1, parent))
            made.append((level + 1, index >> (level + 1), parent))
        return made

    def root(self) -> bytes:
        return fold([h for _, h in self._stack]) if self._stack else EMPTY_ROOT


# --------------------------------------------------------------------------------------------------
# Verification (§2.1.3.2, §2.1.4.2)
# --------------------------------------------------------------------------------------------------
def _check_hashes(hashes: Sequence[bytes], what: str) -> None:
    for i, h in enumerate(hashes):
        if not isinstance(h, bytes | bytearray) or len(h) != HASH_BYTES:
            raise ProofError(f"{what}[{i}] is not a {HASH_BYTES}-byte hash")


def root_from_inclusion(leaf: bytes, index: int, size: int, proof: Sequence[bytes]) -> bytes:
    """The root that `proof` yields for `leaf` at `index` in a tree of `size` leaves (§2.1.3.2 steps 1–4),
    or ProofError when the proof has the wrong length for that position."""
    if not 0 <= index < size:
        raise ProofError(f"leaf index {index} is outside a tree of {size} leaves")
    _check_hashes([leaf], "leaf")
    _check_hashes(proof, "proof")
    fn, sn, r = index, size - 1, bytes(leaf)
    for p in proof:
        if sn == 0:
            raise ProofError("inclusion proof is longer than the path of the leaf")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while not fn & 1 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("inclusion proof is shorter than the path of the leaf")
    return r


def verify_inclusion(leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes) -> None:
    """Raise ProofError unless `proof` shows `leaf` at `index` in the tree of `size` leaves with `root`."""
    if root_from_inclusion(leaf, index, size, proof) != root:
        raise ProofError(f"inclusion proof of leaf {index} does not lead to the root of tree size {size}")


def verify_consistency(
    old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]
) -> None:
    """Raise ProofError unless `proof` shows that the tree of `new_size` leaves with `new_root` extends the
    tree of `old_size` leaves with `old_root` (§2.1.4.2; equal sizes: an empty proof and equal roots)."""
    _check_hashes([old_root, new_root], "root")
    _check_hashes(proof, "proof")
    if not 0 < old_size <= new_size:
        raise ProofError(f"no consistency proof from size {old_size} to size {new_size}")
    if old_size == new_size:
        if proof:
            raise ProofError("a consistency proof between equal sizes must be empty")
        if old_root != new_root:
            raise ProofError(f"two different roots for tree size {old_size}")
        return
    if not proof:
        raise ProofError("empty consistency proof")
    path_ = list(proof)
    if old_size & (old_size - 1) == 0:  # an exact power of two: the old root is the first subtree
        path_.insert(0, bytes(old_root))
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path_[0]
    for c in path_[1:]:
        if sn == 0:
            raise ProofError("consistency proof is longer than needed")
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while not fn & 1 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("consistency proof is shorter than needed")
    if fr != old_root:
        raise ProofError(f"consistency proof does not lead to the root of tree size {old_size}")
    if sr != new_root:
        raise ProofError(f"consistency proof does not lead to the root of tree size {new_size}")
