"""RFC 9162 hashing and proofs: the published vectors of RFC 6962 implementations (the Certificate
Transparency / Trillian log verifier tests: 8 leaves, their roots, inclusion and consistency proofs), the
iterative storage-shaped functions against the RFC's recursive definitions for every small tree, and
corrupted proofs refused."""

import hashlib

import pytest

from audit.transparency import merkle

LEAVES = [bytes.fromhex(h) for h in ("", "00", "10", "2021", "3031", "40414243", "5051525354555657",
                                     "606162636465666768696a6b6c6d6e6f")]  # fmt: skip
ROOTS = [
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]
# (leaf index from 0, tree size, PATH)
INCLUSION = [
    (0, 8, ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"]),
    (5, 8, ["bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"]),
    (2, 3, ["fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"]),
    (1, 5, ["6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"]),
    (0, 1, []),
]  # fmt: skip
# (old size, new size, PROOF)
CONSISTENCY = [
    (1, 1, []),
    (1, 8, ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"]),
    (6, 8, ["0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"]),
    (2, 5, ["5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"]),
]  # fmt: skip
SOME_HASH = bytes.fromhex("abacaba000000000000000000000000000000000000000000060061e00123456")

HASHES = [merkle.leaf_hash(d) for d in LEAVES]


def _hex(hashes):
    return [h.hex() for h in hashes]


def _stored(leaves):
    """Every complete subtree of `leaves` as the log stores it: {(level, index): hash}."""
    nodes, frontier = {}, merkle.Frontier()
    for i, leaf in enumerate(leaves):
        nodes[(0, i)] = leaf
        for level, index, h in frontier.append(leaf):
            nodes[(level, index)] = h
    return nodes, frontier


def test_hashing_is_rfc_9162():
    assert merkle.EMPTY_ROOT.hex() == hashlib.sha256(b"").hexdigest()
    assert merkle.mth([]) == merkle.EMPTY_ROOT
    assert merkle.leaf_hash(b"").hex() == ROOTS[0]  # a one-leaf tree's root is its leaf hash
    assert merkle.node_hash(b"a" * 32, b"b" * 32) == hashlib.sha256(b"\x01" + b"a" * 32 + b"b" * 32).digest()


@pytest.mark.parametrize("size", range(1, 9))
def test_published_roots(size):
    assert merkle.mth(HASHES[:size]).hex() == ROOTS[size - 1]
    nodes, frontier = _stored(HASHES[:size])
    assert frontier.root().hex() == ROOTS[size - 1]
    assert merkle.fold([nodes[n] for n in merkle.root_nodes(size)]).hex() == ROOTS[size - 1]


@pytest.mark.parametrize(("index", "size", "proof"), INCLUSION)
def test_published_inclusion_proofs(index, size, proof):
    assert _hex(merkle.path(index, HASHES[:size])) == proof
    nodes, _ = _stored(HASHES[:size])
    assert _hex(merkle.proof_from_nodes(merkle.inclusion_ranges(index, size), nodes.__getitem__)) == proof
    root = bytes.fromhex(ROOTS[size - 1])
    merkle.verify_inclusion(HASHES[index], index, size, [bytes.fromhex(p) for p in proof], root)


@pytest.mark.parametrize(("old", "new", "proof"), CONSISTENCY)
def test_published_consistency_proofs(old, new, proof):
    assert _hex(merkle.subproof(old, HASHES[:new])) == proof
    nodes, _ = _stored(HASHES[:new])
    assert _hex(merkle.proof_from_nodes(merkle.consistency_ranges(old, new), nodes.__getitem__)) == proof
    merkle.verify_consistency(
        old,
        new,
        bytes.fromhex(ROOTS[old - 1]),
        bytes.fromhex(ROOTS[new - 1]),
        [bytes.fromhex(p) for p in proof],
    )


def _many(n):
    return [merkle.leaf_hash(i.to_bytes(4, "big")) for i in range(n)]


def test_every_proof_of_every_small_tree_matches_the_rfc_definitions_and_verifies():
    leaves = _many(70)
    nodes, _ = _stored(leaves)
    for size in range(1, 71):
        root = merkle.mth(leaves[:size])
        assert merkle.fold([nodes[n] for n in merkle.root_nodes(size)]) == root
        for index in range(size):
            ranges = merkle.inclusion_ranges(index, size)
            proof = merkle.proof_from_nodes(ranges, nodes.__getitem__)
            assert proof == merkle.path(index, leaves[:size])
            assert len(merkle.nodes_needed(ranges)) <= 2 * size.bit_length()  # O(log n) stored nodes
            merkle.verify_inclusion(leaves[index], index, size, proof, root)
        for old in range(1, size + 1):
            proof = merkle.proof_from_nodes(merkle.consistency_ranges(old, size), nodes.__getitem__)
            assert proof == merkle.subproof(old, leaves[:size])
            merkle.verify_consistency(old, size, merkle.mth(leaves[:old]), root, proof)


def _inclusion_probes(index, size, proof, root, leaf):
    yield "index - 1", (leaf, index - 1, size, proof, root)
    yield "index + 1", (leaf, index + 1, size, proof, root)
    yield "index ^ 2", (leaf, index ^ 2, size, proof, root)
    yield "size * 2", (leaf, index, size * 2, proof, root)
    yield "size // 2", (leaf, index, size // 2, proof, root)
    yield "wrong leaf", (merkle.leaf_hash(b"WrongLeaf"), index, size, proof, root)
    yield "empty root", (leaf, index, size, proof, merkle.EMPTY_ROOT)
    yield "random root", (leaf, index, size, proof, SOME_HASH)
    yield "trailing garbage", (leaf, index, size, [*proof, b""], root)
    yield "trailing root", (leaf, index, size, [*proof, root], root)
    yield "preceding root", (leaf, index, size, [root, *proof], root)
    for i in range(len(proof)):
        flipped = list(proof)
        flipped[i] = bytes([flipped[i][0] ^ 8]) + flipped[i][1:]
        yield f"proof[{i}] bit flipped", (leaf, index, size, flipped, root)
    if proof:
        yield "removed component", (leaf, index, size, proof[:-1], root)
    if len(proof) > 1:
        yield "inserted component", (leaf, index, size, [proof[0], SOME_HASH, *proof[1:]], root)


@pytest.mark.parametrize(("index", "size", "proof"), INCLUSION[:4])
def test_corrupted_inclusion_proofs_are_refused(index, size, proof):
    proof = [bytes.fromhex(p) for p in proof]
    root = bytes.fromhex(ROOTS[size - 1])
    for desc, args in _inclusion_probes(index, size, proof, root, HASHES[index]):
        with pytest.raises(merkle.ProofError):
            merkle.verify_inclusion(*args)
            pytest.fail(f"verified against: {desc}")


def _consistency_probes(old, new, old_root, new_root, proof):
    yield "old - 1", (old - 1, new, old_root, new_root, proof)
    yield "old + 1", (old + 1, new, old_root, new_root, proof)
    yield "old ^ 2", (old ^ 2, new, old_root, new_root, proof)
    yield "new * 2", (old, new * 2, old_root, new_root, proof)
    yield "new // 2", (old, new // 2, old_root, new_root, proof)
    yield "wrong old root", (old, new, SOME_HASH, new_root, proof)
    yield "wrong new root", (old, new, old_root, SOME_HASH, proof)
    yield "swapped roots", (old, new, new_root, old_root, proof)
    yield "empty proof", (old, new, old_root, new_root, [])
    yield "trailing old root", (old, new, old_root, new_root, [*proof, old_root])
    yield "trailing new root", (old, new, old_root, new_root, [*proof, new_root])
    yield "preceding old root", (old, new, old_root, new_root, [old_root, *proof])
    yield "preceding proof[0]", (old, new, old_root, new_root, [proof[0], *proof])
    yield "truncated", (old, new, old_root, new_root, proof[:-1])
    for i in range(len(proof)):
        flipped = list(proof)
        flipped[i] = bytes([flipped[i][0] ^ 16]) + flipped[i][1:]
        yield f"proof[{i}] bit flipped", (old, new, old_root, new_root, flipped)


@pytest.mark.parametrize(("old", "new", "proof"), CONSISTENCY[1:])
def test_corrupted_consistency_proofs_are_refused(old, new, proof):
    proof = [bytes.fromhex(p) for p in proof]
    old_root, new_root = bytes.fromhex(ROOTS[old - 1]), bytes.fromhex(ROOTS[new - 1])
    for desc, args in _consistency_probes(old, new, old_root, new_root, proof):
        with pytest.raises((merkle.ProofError, ValueError)):
            merkle.verify_consistency(*args)
            pytest.fail(f"verified against: {desc}")


def test_equal_sizes_need_an_empty_proof_and_equal_roots():
    root = bytes.fromhex(ROOTS[2])
    merkle.verify_consistency(3, 3, root, root, [])
    with pytest.raises(merkle.ProofError, match="two different roots"):
        merkle.verify_consistency(3, 3, root, SOME_HASH, [])
    with pytest.raises(merkle.ProofError, match=r"^a consistency proof between equal sizes must be empty$"):
        merkle.verify_consistency(3, 3, root, root, [root])
    with pytest.raises(merkle.ProofError, match="no consistency proof"):
        merkle.verify_consistency(4, 3, root, root, [root])


def test_a_frontier_resumes_from_its_stored_right_edge():
    leaves = _many(45)
    nodes, whole = _stored(leaves)
    for cut in (1, 16, 31, 32, 33):
        edge = [nodes[n] for n in merkle.root_nodes(cut)]
        resumed = merkle.Frontier(cut, edge)
        made = {}
        for i, leaf in enumerate(leaves[cut:], start=cut):
            made[(0, i)] = leaf
            for level, index, h in resumed.append(leaf):
                made[(level, index)] = h
        assert resumed.root() == whole.root() == merkle.mth(leaves)
        assert all(nodes[k] == v for k, v in made.items())
    with pytest.raises(ValueError, match="right-edge nodes"):
        merkle.Frontier(3, [SOME_HASH])
