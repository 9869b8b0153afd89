"""The transparency log's format modules at their edges (issue 43 item 11): leaf data read back only in
canonical form, checkpoint bodies and keys refused for the exact reason, witness policies and
cosignatures; each test kills mutants of `audit.transparency.leafdata`, `note` and `signednote` that the
golden vectors leave alive (docs/contributing.md, "Mutation testing of the format")."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.transparency import leafdata, note, signednote

VECTORS = json.loads((Path(__file__).parent / "vectors" / "format-v1.json").read_text(encoding="utf-8"))
LEAVES = {v["name"]: v for v in VECTORS["leaves"]}
N = VECTORS["signedNotes"]
PRIVATE = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(N["rfc8032Seed"]))
WITNESS = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(N["witnessSeed"]))
CHECKPOINT = N["checkpoints"][1]


def exactly(message: str) -> str:
    """A `match=` pattern for exactly this message (a changed message is a changed behaviour)."""
    return f"^{re.escape(message)}$"


# --------------------------------------------------------------------------------------------------
# Leaves
# --------------------------------------------------------------------------------------------------
def _event(seq, event_type="X", details=None, when="2026-03-01T12:00:00.000001+00:00"):
    return SimpleNamespace(sequence_no=seq, event_type=event_type, details=details or {}, hash=f"{seq:064x}",
                           created_at=when)  # fmt: skip


def test_a_run_leaf_is_read_from_the_chain_head_and_its_last_finish():
    finished = {"runDigest": "cd" * 32}
    events = [_event(1, "RUN_STARTED"), _event(2, "RUN_FINISHED", {"runDigest": "00"}, "t1")]
    events += [_event(3, "RUN_FINISHED", finished, "2026-03-01T12:00:00.000001+00:00"), _event(19)]
    events[-1].hash = "ab" * 32
    fields = leafdata.run_leaf(run_id="run_0f3c2a9e", session_id="sess_77b1", events=events)
    assert leafdata.encode(fields).decode() == LEAVES["a finished run"]["data"]
    assert leafdata.run_leaf(run_id="运行-1", session_id="sess_77b1", events=[]) == json.loads(
        LEAVES["a run with no events"]["data"]
    )
    assert leafdata.anchored_prefix(events, 3) == events[:3]
    assert leafdata.anchored_prefix(events, 0) == []


def _text(fields):
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@pytest.mark.parametrize(
    ("decode", "fields_message"),
    [
        (leafdata.decode, "leaf data does not have exactly the leaf fields"),
        (leafdata.decode_any, "leaf data does not have exactly the run leaf fields"),
    ],
)
def test_a_run_leaf_is_read_back_only_in_exactly_its_canonical_form(decode, fields_message):
    data = LEAVES["an authenticated run leaf"]["data"]
    fields = json.loads(data)
    assert decode(data) == fields == decode(data.encode())
    for bad, message in (
        ({**fields, "extra": 1}, fields_message),
        ({k: v for k, v in fields.items() if k != "runDigest"}, fields_message),
        ({**fields, "writeKeyId": ""}, fields_message),
        ({**fields, "writeKeyId": 7}, fields_message),
    ):
        with pytest.raises(ValueError, match=exactly(message)):
            decode(_text(bad))
    with pytest.raises(ValueError, match=exactly("leaf data is not in canonical form")):
        decode(json.dumps(fields))
    with pytest.raises(ValueError):
        decode("[1]")


def test_decode_reads_run_leaves_only():
    with pytest.raises(ValueError, match=exactly("unknown leaf kind 'runTail'")):
        leafdata.decode(
            _text({**json.loads(LEAVES["a run tail"]["data"]), "runDigest": None, "finishedAt": None})
        )
    with pytest.raises(ValueError, match=exactly("leaf data does not have exactly the leaf fields")):
        leafdata.decode(LEAVES["a run tail"]["data"])


def test_decode_any_names_what_is_wrong():
    tail = json.loads(LEAVES["a run tail"]["data"])
    assert leafdata.decode_any(LEAVES["a run tail"]["data"]) == tail
    cases = (
        ("{", "leaf data is not JSON"),
        ("[]", "leaf data is not an object"),
        (_text({**tail, "kind": "other"}), "unknown leaf kind 'other'"),
        (_text({k: v for k, v in tail.items() if k != "kind"}), "unknown leaf kind None"),
        (_text({**tail, "runDigest": None}), "leaf data does not have exactly the runTail leaf fields"),
        (_text({**tail, "lastSequenceNo": "21"}), "leaf data's lastSequenceNo is not an integer"),
        (_text({**tail, "lastSequenceNo": True}), "leaf data's lastSequenceNo is not an integer"),
        (json.dumps(tail), "leaf data is not in canonical form"),
    )
    for text, message in cases:
        with pytest.raises(ValueError, match=exactly(message)):
            leafdata.decode_any(text)


def test_decode_governance_reads_governance_leaves_only():
    data = LEAVES["an authenticated governance head"]["data"]
    fields = json.loads(data)
    assert leafdata.decode_governance(data.encode()) == fields
    assert leafdata.write_key_id(fields) == "1a2b3c4d"
    with pytest.raises(
        ValueError, match=exactly("leaf data does not have exactly the governance leaf fields")
    ):
        leafdata.decode_governance(LEAVES["a run tail"]["data"])
    with pytest.raises(
        ValueError, match=exactly("leaf data does not have exactly the governance leaf fields")
    ):
        leafdata.decode_governance("[]")
    wrong_kind = {**fields, "kind": "run"}
    with pytest.raises(ValueError, match=exactly("not a governance leaf: kind 'run'")):
        leafdata.decode_governance(_text(wrong_kind))
    with pytest.raises(ValueError, match=exactly("leaf data is not in canonical form")):
        leafdata.decode_governance(json.dumps(fields))


# --------------------------------------------------------------------------------------------------
# Legacy checkpoint bodies, keys and signatures
# --------------------------------------------------------------------------------------------------
LEGACY = json.loads(N["legacy"]["body"])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": "v0"}, "checkpoint format is not diagnosis-audit-checkpoint/v1"),
        ({"treeSize": 0}, "checkpoint treeSize is not a positive integer"),
        ({"treeSize": True}, "checkpoint treeSize is not a positive integer"),
        ({"treeSize": "8"}, "checkpoint treeSize is not a positive integer"),
        ({"origin": ""}, "checkpoint origin is not a string"),
        ({"signedAt": 5}, "checkpoint signedAt is not a string"),
        ({"keyId": ""}, "checkpoint keyId is not a string"),
        ({"rootHash": ""}, "checkpoint rootHash is not a hex hash"),
        ({"rootHash": "AB" * 32}, "checkpoint rootHash is not a hex hash"),
        ({"rootHash": "ab" * 31}, "checkpoint rootHash is not a hex hash"),
        ({"rootHash": 5}, "checkpoint rootHash is not a hex hash"),
        ({"previous": "ab"}, "checkpoint previous is not a hex hash"),
        ({"previous": None}, "checkpoint previous is not a hex hash"),
        ({"extra": 1}, "checkpoint body does not have exactly the v1 fields"),
    ],
)
def test_a_legacy_body_is_refused_for_its_exact_fault(change, message):
    with pytest.raises(note.NoteError, match=rf"^{message}$"):
        note.parse_body(_text({**LEGACY, **change}))


def test_a_legacy_body_is_json_of_exactly_its_fields_in_canonical_form():
    assert note.parse_body(N["legacy"]["body"]).previous == ""
    assert note.parse_body(_text({**LEGACY, "treeSize": 1})).tree_size == 1  # the smallest tree signed
    assert note.parse_body(_text({**LEGACY, "previous": "ab" * 32})).previous == "ab" * 32
    for text, message in (
        ("{", "checkpoint body is not JSON"),
        (None, "checkpoint body is not JSON"),
        ("[]", "checkpoint body does not have exactly the v1 fields"),
        (json.dumps(LEGACY), "checkpoint body is not in canonical form"),
    ):
        with pytest.raises(note.NoteError, match=exactly(message)):
            note.parse_body(text)
    assert not note.is_legacy(CHECKPOINT["body"]) and not note.is_legacy(None)


def test_public_and_private_keys_in_their_published_forms():
    public = PRIVATE.public_key()
    raw = bytes.fromhex(N["rfc8032Public"])
    pem = public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert note.raw_public(note.load_public(pem.decode() + "\n")) == raw
    assert note.raw_public(note.load_public(f"  {N['publicText']}  ")) == raw
    urlsafe = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    assert note.raw_public(note.load_public(urlsafe)) == raw
    other = ec.generate_private_key(ec.SECP256R1()).public_key()
    other_pem = other.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    with pytest.raises(note.NoteError, match=r"^not an Ed25519 public key$"):
        note.load_public(other_pem.decode())
    with pytest.raises(note.NoteError, match=r"^not a PEM public key$"):
        note.load_public("-----BEGIN PUBLIC KEY-----\nxx\n-----END PUBLIC KEY-----")
    with pytest.raises(note.NoteError, match=r"^an Ed25519 public key is 32 bytes$"):
        note.load_public(base64.b64encode(raw[:31]).decode())
    with pytest.raises(note.NoteError, match=r"^not base64$"):
        note.load_public("!!")
    seed = bytes.fromhex(N["rfc8032Seed"])
    loaded = note.load_private(base64.urlsafe_b64encode(seed).decode().rstrip("="))
    assert note.raw_public(loaded.public_key()) == raw
    with pytest.raises(note.NoteError, match=r"^an Ed25519 private key is a 32-byte seed$"):
        note.load_private(base64.b64encode(seed + b"x").decode())


def test_a_legacy_signature_is_accepted_only_as_issued():
    body, signature, public = N["legacy"]["body"], N["legacy"]["signature"], PRIVATE.public_key()
    note.verify(body, signature, public)
    raw = base64.b64decode(signature)
    # The last base64 character before the padding has unused bits: another text of the same bytes.
    alias = signature[:-3] + chr(ord(signature[-3]) + 1) + signature[-2:]
    assert base64.b64decode(alias) == raw and alias != signature
    for sig, message in (
        (None, "checkpoint signature is not a string"),
        ("***", "checkpoint signature is not base64"),
        (alias, "checkpoint signature is not in canonical base64"),
        (base64.b64encode(bytes(64)).decode(), "checkpoint signature does not verify"),
    ):
        with pytest.raises(note.NoteError, match=rf"^{message}$"):
            note.verify(body, sig, public)
    with pytest.raises(note.NoteError, match=r"^checkpoint signature does not verify$"):
        note.verify(body + " ", signature, public)


def test_a_note_checkpoint_names_its_signer_in_its_signature():
    body = note.parse_note_body(CHECKPOINT["body"])
    public, stranger = PRIVATE.public_key(), WITNESS.public_key()
    assert note.signer_key_id(body, CHECKPOINT["signature"]) == N["noteKeyId"]
    assert note.signer_key_id(body, "***") == ""
    unnamed = note.NoteBody("no key name", 8, CHECKPOINT["rootHash"], CHECKPOINT["signedAt"], "")
    assert note.signer_key_id(unnamed, CHECKPOINT["signature"]) == ""  # read under its own origin
    assert note.find_signer(body, CHECKPOINT["signature"], [stranger, public]) is public
    assert note.find_signer(body, CHECKPOINT["signature"], [stranger]) is None
    legacy = note.parse_body(N["legacy"]["body"])
    assert note.find_signer(legacy, N["legacy"]["signature"], [stranger]) is None
    with pytest.raises(note.NoteError, match=r"^checkpoint signature does not verify$"):
        note.verify_checkpoint(CHECKPOINT["body"], body, CHECKPOINT["signature"], stranger)
    with pytest.raises(note.NoteError, match=r"^checkpoint signature does not verify$"):
        note.verify_checkpoint(N["legacy"]["body"], legacy, N["legacy"]["signature"], stranger)
    with pytest.raises(note.NoteError, match=r"^checkpoint signature is not a string$"):
        note.signature_line(N["origin"], None)
    with pytest.raises(note.NoteError, match=r"^checkpoint signature: "):
        note.signature_line(N["origin"], "AAAA")


# --------------------------------------------------------------------------------------------------
# Cosignatures and witness policies
# --------------------------------------------------------------------------------------------------
W1 = signednote.parse_vkey(N["witnessVkey"])


def _cosig(timestamp=1772366400, private=WITNESS, name="witness.example/w1"):
    return signednote.cosign(CHECKPOINT["body"], name, private, timestamp)


def test_a_cosignature_is_refused_for_its_exact_fault():
    body = CHECKPOINT["body"]
    good = _cosig()
    assert signednote.verify_cosignature(body, good, W1) == 1772366400
    assert signednote.verify_cosignature(body, _cosig(1), W1) == 1
    assert signednote.verify_cosignature(body, _cosig((1 << 63) - 1), W1) == (1 << 63) - 1
    log_key = signednote.parse_vkey(N["vkey"])
    with pytest.raises(signednote.SignedNoteError, match=r"^the cosignature is not by witness key "):
        signednote.verify_cosignature(body, good, log_key)
    renamed = signednote.Signature("witness.example/w2", good.key_id, good.signature)
    with pytest.raises(signednote.SignedNoteError, match=r"^the cosignature is not by witness key "):
        signednote.verify_cosignature(body, renamed, W1)
    short = signednote.Signature(good.name, good.key_id, good.signature[:-1])
    with pytest.raises(signednote.SignedNoteError, match=r"^a cosignature/v1 is an 8-byte timestamp"):
        signednote.verify_cosignature(body, short, W1)
    for timestamp in (0, 1 << 63):
        with pytest.raises(signednote.SignedNoteError, match=r"^a cosignature's timestamp is between 1 and"):
            signednote.verify_cosignature(body, _cosig(timestamp), W1)
    with pytest.raises(
        signednote.SignedNoteError, match=r"^cosignature by witness.example/w1 does not verify$"
    ):
        signednote.verify_cosignature(body + "x\n", good, W1)
    assert signednote.cosigned_message("b\n", 7) == b"cosignature/v1\ntime 7\nb\n"


def test_a_witness_policy_is_n_of_m_cosigner_keys():
    w2_private = Ed25519PrivateKey.generate()
    w2 = signednote.Verifier("witness.example/w2", signednote.COSIGNATURE_V1, w2_private.public_key())
    assert signednote.make_policy([]) is None and signednote.make_policy(["  ", ""]) is None
    policy = signednote.make_policy([N["witnessVkey"], w2.vkey])
    assert (policy.quorum, policy.witnesses) == (2, (W1, w2))
    assert signednote.make_policy([N["witnessVkey"], w2.vkey], 1).quorum == 1
    assert policy.describe() == "2 of 2 witness(es) (witness.example/w1, witness.example/w2)"
    with pytest.raises(signednote.SignedNoteError, match=r"^a witness policy names each witness key once$"):
        signednote.make_policy([N["witnessVkey"], N["witnessVkey"]])
    with pytest.raises(
        signednote.SignedNoteError, match=r"^a witness policy names cosigner keys \(vkey type"
    ):
        signednote.make_policy([N["vkey"]])
    for quorum in (0, 3):
        with pytest.raises(
            signednote.SignedNoteError, match=rf"^a witness policy needs between 1 and 2 .* not {quorum}$"
        ):
            signednote.make_policy([N["witnessVkey"], w2.vkey], quorum)

    body = CHECKPOINT["body"]
    w1_sig = _cosig()
    w2_sig = signednote.cosign(body, w2.name, w2_private, 5)
    stranger = _cosig(private=Ed25519PrivateKey.generate())  # the same name, another key: another key id
    assert signednote.check_policy(body, [stranger, w2_sig, w1_sig], policy) == (
        ["witness.example/w1", "witness.example/w2"],
        [],
    )
    bad = signednote.Signature(w1_sig.name, w1_sig.key_id, w1_sig.signature[:8] + bytes(64))
    verified, problems = signednote.check_policy(body, [bad, w1_sig], policy)
    assert verified == ["witness.example/w1"]
    assert problems == [
        "cosignature by witness.example/w1 does not verify",
        "cosigned by 1 of the 2 of 2 witness(es) (witness.example/w1, witness.example/w2), 2 required "
        "(no valid cosignature by witness.example/w2)",
    ]
    one_of_two = signednote.make_policy([N["witnessVkey"], w2.vkey], 1)
    assert signednote.check_policy(body, [w2_sig, w2_sig], one_of_two) == (["witness.example/w2"], [])
    assert signednote.check_policy(body, [], one_of_two)[1] == [
        "cosigned by 0 of the 1 of 2 witness(es) (witness.example/w1, witness.example/w2), 1 required "
        "(no valid cosignature by witness.example/w1, witness.example/w2)"
    ]


def test_a_signed_note_joins_its_body_and_signature_lines():
    line = signednote.Signature(
        N["origin"], *(lambda r: (r[:4], r[4:]))(base64.b64decode(CHECKPOINT["signature"]))
    )
    cosig = _cosig()
    text = signednote.join_note(CHECKPOINT["body"], [line, cosig])
    assert text == CHECKPOINT["note"] + CHECKPOINT["cosignature"]["line"]
    assert signednote.split_note(text) == (CHECKPOINT["body"], [line, cosig])
    assert (
        note.signed_note(CHECKPOINT["body"], N["origin"], CHECKPOINT["signature"], [cosig.line[:-1]]) == text
    )


# --------------------------------------------------------------------------------------------------
# Merkle trees: the boundaries of the ranges and the exact refusals
# --------------------------------------------------------------------------------------------------
M = VECTORS["merkle"]
HASHES = [bytes.fromhex(h) for h in M["leafHashes"]]
ROOTS = [bytes.fromhex(h) for h in M["roots"]]


def test_ranges_and_proofs_refuse_what_is_outside_the_tree():
    from audit.transparency import merkle

    for index, size in ((-1, 3), (3, 3), (0, 0)):
        with pytest.raises(ValueError, match=r"^leaf index outside the tree$"):
            merkle.inclusion_ranges(index, size)
        with pytest.raises(ValueError, match=r"^leaf index outside the tree$"):
            merkle.path(index, HASHES[: max(size, 0)])
    for old, new in ((0, 3), (4, 3), (-1, 3)):
        with pytest.raises(ValueError, match=r"^a consistency proof needs 0 < old size <= new size$"):
            merkle.consistency_ranges(old, new)
    for start, end in ((3, 3), (4, 3), (-1, 3)):
        with pytest.raises(ValueError, match=r"^an empty or negative range has no nodes$"):
            merkle.range_nodes(start, end)
    with pytest.raises(ValueError, match=r"^nothing to fold$"):
        merkle.fold([])
    for n in (0, 1):
        with pytest.raises(ValueError, match=r"^a split needs at least two leaves$"):
            merkle.split(n)
    assert [merkle.split(n) for n in (2, 3, 4, 5, 8, 9)] == [1, 2, 2, 4, 4, 8]
    assert merkle.inclusion_ranges(0, 1) == [] and merkle.consistency_ranges(5, 5) == []
    assert merkle.inclusion_ranges(2, 3) == [(0, 2)] and merkle.inclusion_ranges(1, 3) == [(0, 1), (2, 3)]
    assert merkle.consistency_ranges(3, 7) == [(2, 3), (3, 4), (0, 2), (4, 7)]
    assert merkle.consistency_ranges(4, 7) == [(4, 7)]
    assert merkle.range_nodes(0, 7) == [(2, 0), (1, 2), (0, 6)] and merkle.range_nodes(5, 8) == [
        (0, 5),
        (1, 3),
    ]
    assert merkle.root_nodes(0) == [] and merkle.root_nodes(6) == [(2, 0), (1, 2)]
    assert merkle.nodes_needed([(0, 3), (4, 6)]) == {(1, 0), (0, 2), (1, 2)}


def test_a_frontier_reports_the_nodes_each_leaf_completes():
    from audit.transparency import merkle

    frontier = merkle.Frontier()
    made = [frontier.append(h) for h in HASHES[:4]]
    assert made[0] == [] and made[2] == []
    assert made[1] == [(1, 0, merkle.node_hash(HASHES[0], HASHES[1]))]
    assert made[3] == [(1, 1, merkle.node_hash(HASHES[2], HASHES[3])), (2, 0, ROOTS[3])]
    assert frontier.size == 4 and frontier.root() == ROOTS[3]
    resumed = merkle.Frontier(3, [merkle.node_hash(HASHES[0], HASHES[1]), HASHES[2]])
    assert resumed.root() == ROOTS[2] and resumed.size == 3
    with pytest.raises(ValueError, match=r"^a tree of 3 leaves has 2 right-edge nodes, not 1$"):
        merkle.Frontier(3, [ROOTS[2]])


def test_inclusion_proofs_are_refused_for_their_exact_fault():
    from audit.transparency import merkle

    proof = [merkle.path(5, HASHES)][0]
    assert merkle.root_from_inclusion(HASHES[5], 5, 8, proof) == ROOTS[7]
    for index, size in ((8, 8), (-1, 8)):
        with pytest.raises(
            merkle.ProofError, match=rf"^leaf index {index} is outside a tree of {size} leaves$"
        ):
            merkle.root_from_inclusion(HASHES[5], index, size, proof)
    with pytest.raises(merkle.ProofError, match=r"^leaf\[0\] is not a 32-byte hash$"):
        merkle.root_from_inclusion(HASHES[5][:31], 5, 8, proof)
    with pytest.raises(merkle.ProofError, match=r"^proof\[1\] is not a 32-byte hash$"):
        merkle.root_from_inclusion(HASHES[5], 5, 8, [proof[0], "x" * 32, proof[2]])
    assert merkle.root_from_inclusion(bytearray(HASHES[5]), 5, 8, [bytearray(p) for p in proof]) == ROOTS[7]
    with pytest.raises(merkle.ProofError, match=r"^inclusion proof is longer than the path of the leaf$"):
        merkle.root_from_inclusion(HASHES[5], 5, 8, [*proof, ROOTS[0]])
    with pytest.raises(merkle.ProofError, match=r"^inclusion proof is shorter than the path of the leaf$"):
        merkle.root_from_inclusion(HASHES[5], 5, 8, proof[:-1])
    with pytest.raises(
        merkle.ProofError, match=r"^inclusion proof of leaf 5 does not lead to the root of tree size 8$"
    ):
        merkle.verify_inclusion(HASHES[5], 5, 8, proof, ROOTS[6])
    # The last leaf of an unbalanced tree climbs past the levels where it has no sibling.
    proof = merkle.path(6, HASHES[:7])
    assert merkle.root_from_inclusion(HASHES[6], 6, 7, proof) == ROOTS[6]


def test_consistency_proofs_are_refused_for_their_exact_fault():
    from audit.transparency import merkle

    proof = merkle.subproof(3, HASHES[:7])
    merkle.verify_consistency(3, 7, ROOTS[2], ROOTS[6], proof)
    merkle.verify_consistency(4, 7, ROOTS[3], ROOTS[6], merkle.subproof(4, HASHES[:7]))  # old: a power of 2
    cases = (
        ((3, 7, ROOTS[2][:31], ROOTS[6], proof), r"^root\[0\] is not a 32-byte hash$"),
        ((3, 7, ROOTS[2], ROOTS[6], [*proof[:1], b"x"]), r"^proof\[1\] is not a 32-byte hash$"),
        ((0, 7, ROOTS[2], ROOTS[6], proof), "^no consistency proof from size 0 to size 7$"),
        ((8, 7, ROOTS[2], ROOTS[6], proof), "^no consistency proof from size 8 to size 7$"),
        ((3, 7, ROOTS[2], ROOTS[6], []), "^empty consistency proof$"),
        ((3, 7, ROOTS[2], ROOTS[6], [*proof, ROOTS[0]]), "^consistency proof is longer than needed$"),
        ((3, 7, ROOTS[2], ROOTS[6], proof[:-1]), "^consistency proof is shorter than needed$"),
        ((3, 7, ROOTS[1], ROOTS[6], proof), "^consistency proof does not lead to the root of tree size 3$"),
        ((3, 7, ROOTS[2], ROOTS[5], proof), "^consistency proof does not lead to the root of tree size 7$"),
    )
    for args, message in cases:
        with pytest.raises(merkle.ProofError, match=message):
            merkle.verify_consistency(*args)


def test_a_note_signature_is_refused_for_its_exact_fault():
    body = CHECKPOINT["body"]
    log_key = signednote.parse_vkey(N["vkey"])
    good = signednote.sign_line(body, N["origin"], PRIVATE)
    signednote.verify_signature(body, good, log_key)
    by_id = f"the signature is not by key {N['origin']}+{N['noteKeyId']}"
    wrong_id = signednote.Signature(good.name, b"\x00\x00\x00\x00", good.signature)  # a valid signature
    with pytest.raises(signednote.SignedNoteError, match=exactly(by_id)):
        signednote.verify_signature(body, wrong_id, log_key)
    renamed = signednote.Signature("other.example/log", good.key_id, good.signature)
    with pytest.raises(signednote.SignedNoteError, match=exactly(by_id)):
        signednote.verify_signature(body, renamed, log_key)
    with pytest.raises(
        signednote.SignedNoteError, match=r"^the signature is not by key witness\.example/w1\+"
    ):
        signednote.verify_signature(body, good, W1)
    short = signednote.Signature(good.name, good.key_id, good.signature[:63])
    with pytest.raises(signednote.SignedNoteError, match=exactly("an Ed25519 signature is 64 bytes")):
        signednote.verify_signature(body, short, log_key)
    with pytest.raises(
        signednote.SignedNoteError, match=exactly(f"signature by {N['origin']} does not verify")
    ):
        signednote.verify_signature(body + "x\n", good, log_key)
    with pytest.raises(signednote.SignedNoteError, match=exactly("the note has no signature by a known key")):
        signednote.verify_note(CHECKPOINT["note"], [W1])


def test_a_signed_note_is_split_at_its_last_blank_line_and_refused_for_its_exact_fault():
    line = signednote.parse_signature_line(CHECKPOINT["note"].split("\n\n")[-1])
    text = "first\n\nsecond\n\n" + line.line  # a blank line inside the text: the last one separates
    assert signednote.split_note(text) == ("first\n\nsecond\n", [line])
    assert signednote.split_note("\n\n" + line.line) == ("\n", [line])  # an empty text
    assert len(signednote.split_note("t\n\n" + line.line * 64)[1]) == 64
    for bad, message in (
        ("t\n\n" + line.line[:-1], "a signed note ends with a newline"),
        ("t\x01\n\n" + line.line, "a signed note has no control characters but newlines"),
        ("t\n" + line.line, "a signed note has a blank line before its signatures"),
        ("t\n\n", "a signed note has at least one signature"),
        ("t\n\n" + line.line * 65, "a signed note has more than 64 signatures"),
        ("t\n\n- x y\n", "a signature line starts with an em dash and a space"),
        ("t\n\n\u2014 x\n", "a signature line is '— <name> <base64>'"),
        ("t\n\n\u2014 x AAAA\n", "a signature has a key id and at least one byte"),
        ("t\n\n\u2014 x+y AAAAAAA=\n", "a key name is non-empty, without spaces or '+'"),
    ):
        with pytest.raises(signednote.SignedNoteError, match=exactly(message)):
            signednote.split_note(bad)


def test_a_vkey_and_a_checkpoint_body_are_refused_for_their_exact_fault():
    name, key_id, material = N["vkey"].split("+", 2)
    for bad, message in (
        (f"{name}+{key_id}", "a vkey is <name>+<hex key id>+<base64 key>"),
        (f"{name}+zz{key_id[2:]}+{material}", "vkey key id is not hex"),
        (f"{name}+{key_id}+{material[:-1]}!", "vkey key is not base64"),
        (
            f"{name}+{key_id}+{material[:-4]}",
            "vkey is not an Ed25519 (0x01) or Ed25519 cosignature (0x04) key",
        ),
        (f"{name}+{key_id}00+{material}", "vkey is not an Ed25519 (0x01) or Ed25519 cosignature (0x04) key"),
    ):
        with pytest.raises(signednote.SignedNoteError, match=exactly(message)):
            signednote.parse_vkey(bad)
    body = CHECKPOINT["body"]
    origin, size, root = body.split("\n")[:3]
    for bad, message in (
        (body[:-1], "a checkpoint ends with a newline"),
        (f"{origin}\n{size}\n", "a checkpoint has an origin, a size and a root hash line"),
        (f"\n{size}\n{root}\n", "checkpoint origin is empty"),
        (f"{origin}\n08\n{root}\n", "checkpoint size is not a decimal without leading zeros"),
        (f"{origin}\n-8\n{root}\n", "checkpoint size is not a decimal without leading zeros"),
        (f"{origin}\n{size}\n{root[:-4]}\n", "checkpoint root hash is not 32 bytes"),
        (f"{origin}\n{size}\n{root}\n\n", "checkpoint extension lines are not empty"),
    ):
        with pytest.raises(signednote.SignedNoteError, match=exactly(message)):
            signednote.parse_checkpoint(bad)
    assert signednote.parse_checkpoint(f"{origin}\n0\n{root}\n").tree_size == 0
