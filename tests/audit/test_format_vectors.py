"""The record's wire format pinned by golden vectors (issue 43 item 11): every link hash, chain verdict,
row digest, write tag, Merkle hash and proof, leaf and signed checkpoint in `vectors/format-v1.json` is a
literal, checked here against the project's code and against `vectors/reference.py`, an independent
implementation of the documented byte layout. A failure here is a format change: it is never fixed by
editing a vector, only by a new format version (docs/audit-hash_chain.md, "The pinned format")."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from audit.payloads import canonical_json
from audit.transparency import leafdata, merkle, note, signednote
from audit.verify import hash_chain, row_digests
from audit.write.table import RawJSON
from core import writeauth
from reasoning.fields import Ciphertext
from tests.audit.vectors import reference as ref

VECTORS = json.loads((Path(__file__).parent / "vectors" / "format-v1.json").read_text(encoding="utf-8"))
FORMS = {
    **row_digests._RUN_FORMS,
    **row_digests._TOOL_FORMS,
    **{
        f.name: f
        for f in (row_digests.STEP, row_digests.REASONING, row_digests.RUN_START, row_digests.SESSION)
    },
    **{f.name: f for f in (row_digests.REVIEW, row_digests.READ)},
}


def _typed(value):
    return ref.typed(value, cipher=Ciphertext, raw=RawJSON)


def _ids(cases):
    return [c["name"] for c in cases]


def test_the_file_is_format_version_1_and_pins_every_form_and_its_columns():
    assert VECTORS["formatVersion"] == 1
    assert VECTORS["genesisHash"] == hash_chain.GENESIS_HASH == ref.GENESIS
    assert {name: [c for c, _ in cols] for name, cols in VECTORS["forms"].items()} == {
        name: list(form.columns) for name, form in FORMS.items()
    }
    assert {v["form"] for v in VECTORS["rowDigests"]} == set(FORMS)  # every form has a vector


# --------------------------------------------------------------------------------------------------
# Link hashes
# --------------------------------------------------------------------------------------------------
def _link(e, *, prev=None, hash_=None, details_text=None):
    link = SimpleNamespace(
        run_id=e["runId"],
        session_id=e["sessionId"],
        sequence_no=e["sequenceNo"],
        phase=e["phase"],
        event_type=e["eventType"],
        status=e["status"],
        summary=e["summary"],
        details=e["details"],
        created_at=e["createdAt"],
        prev_hash=e.get("prevHash", prev),
        hash=e.get("hash", hash_),
    )
    if details_text is not None or "detailsText" in e:
        link.details_text = e.get("detailsText", details_text)
    return link


def _payload_args(e):
    return {
        "run_id": e["runId"],
        "session_id": e["sessionId"],
        "sequence_no": e["sequenceNo"],
        "phase": e["phase"],
        "event_type": e["eventType"],
        "status": e["status"],
        "summary": e["summary"],
        "created_at": e["createdAt"],
    }


@pytest.mark.parametrize("vector", VECTORS["linkHashes"], ids=_ids(VECTORS["linkHashes"]))
def test_link_hash(vector):
    e = _typed(vector["event"])
    prev, expected = vector["prevHash"], vector["hash"]
    # The independent computation from the documented layout.
    assert ref.event_json(e) == vector["payloadJson"]
    assert ref.link_hash(prev, e) == expected
    # The writer's paths: the payload dict, the text built around canonical details, a stored link.
    payload = hash_chain.event_payload(**_payload_args(e), details=e["details"])
    assert list(payload) == list(hash_chain.EVENT_FIELDS)
    assert canonical_json(payload) == vector["payloadJson"]
    assert hash_chain.chain_hash(prev, payload) == expected
    details_json = canonical_json(e["details"])
    assert (
        hash_chain.event_payload_json(**_payload_args(e), details_json=details_json) == vector["payloadJson"]
    )
    assert hash_chain.link_hash(_link(e, prev=prev, hash_=expected)) == expected
    if prev == ref.GENESIS and e["sequenceNo"] == 1:  # a whole chain: valid, over the text or the details
        assert hash_chain.verify_chain([_link(e, prev=prev, hash_=expected, details_text=details_json)]).valid
        assert hash_chain.verify_chain([_link(e, prev=prev, hash_=expected)]).valid


def test_a_time_is_hashed_in_utc_with_microseconds():
    import datetime as dt

    tokyo = dt.datetime(2026, 3, 1, 21, 0, 0, 500000, tzinfo=dt.timezone(dt.timedelta(hours=9)))
    assert hash_chain.timestamp(tokyo) == "2026-03-01T12:00:00.500000+00:00"
    assert hash_chain.timestamp(tokyo.astimezone(dt.UTC)) == "2026-03-01T12:00:00.500000+00:00"
    assert hash_chain.timestamp(dt.datetime(2026, 3, 1, tzinfo=dt.UTC)) == "2026-03-01T00:00:00.000000+00:00"


# --------------------------------------------------------------------------------------------------
# The chain check: verdict counts, missing sequences and the exact messages
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("vector", VECTORS["chains"], ids=_ids(VECTORS["chains"]))
def test_chain_verdict(vector):
    links = [_link(_typed(e)) for e in vector["events"]]
    verdict = hash_chain.verify_chain(iter(links))  # any iterable, read once
    assert {
        "events": verdict.events,
        "valid": verdict.valid,
        "missingSequences": verdict.missing_sequences,
        "problems": verdict.problems,
    } == vector["verdict"]
    # Every stored hash in the vectors is the independent recomputation (unless the case changed it).
    for e, link in zip(vector["events"], links, strict=True):
        if vector["verdict"]["valid"]:
            assert ref.link_hash(link.prev_hash, _typed(e)) == link.hash


def test_a_verdict_starts_valid_and_empty_and_fail_records_each_problem():
    verdict = hash_chain.ChainVerdict()
    assert (verdict.events, verdict.valid, verdict.missing_sequences, verdict.problems) == (0, True, [], [])
    verdict.fail("one")
    verdict.fail("two")
    assert (verdict.valid, verdict.problems) == (False, ["one", "two"])
    assert hash_chain.ChainVerdict().problems == []  # not shared between verdicts


# --------------------------------------------------------------------------------------------------
# Row digests
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("vector", VECTORS["rowDigests"], ids=_ids(VECTORS["rowDigests"]))
def test_row_digest(vector):
    form, stored = FORMS[vector["form"]], vector["stored"]
    values = _typed(vector["values"])
    columns = VECTORS["forms"][vector["form"]]
    independent = ref.row_document(
        vector["form"], columns, values, stored=stored, cipher_type=Ciphertext, raw_type=RawJSON
    )
    assert ref.canonical(independent) == vector["document"]
    assert ref.row_digest(independent) == vector["digest"]
    assert canonical_json(form.document(values, stored=stored)) == vector["document"]
    assert form.digest(values, stored=stored) == vector["digest"]
    if stored:  # a row object read back: by attribute names
        row = SimpleNamespace(**{form.fields[c].attname: v for c, v in values.items()})
        assert form.digest_of(row) == vector["digest"]
        assert form.values_of(row) == values


# --------------------------------------------------------------------------------------------------
# Write tags
# --------------------------------------------------------------------------------------------------
TAGS = VECTORS["writeTags"]
KEYS = [bytes.fromhex(k) for k in TAGS["keysHex"]]


def test_write_key_ids():
    assert [writeauth.key_id_of(k) for k in KEYS] == TAGS["keyIds"] == [ref.write_key_id(k) for k in KEYS]
    assert [writeauth.parse_key(base64.b64encode(k).decode("ascii")) for k in KEYS] == KEYS
    assert writeauth.parse_key(f"  {base64.b64encode(KEYS[0]).decode('ascii')}\n") == KEYS[0]


@pytest.mark.parametrize(
    "vector", TAGS["tags"], ids=lambda v: f"{v['domain']}-{v['linkHash'][:4]}-k{v['key']}"
)
def test_write_tag(vector):
    key, domain, link = KEYS[vector["key"]], vector["domain"], vector["linkHash"]
    assert ref.write_tag(key, domain, link) == vector["tag"]
    key_id, _, mac = vector["tag"].partition(":")
    assert writeauth.mac(key, key_id, domain, link) == mac
    assert writeauth.key_id_of_tag(vector["tag"]) == key_id
    rotated = writeauth.Verifier(KEYS)  # both keys listed, the first tags
    assert rotated.problem(domain, link, vector["tag"]) is None
    assert rotated.valid(domain, link, vector["tag"])
    if vector["key"] == 0:
        assert rotated.tag(domain, link) == vector["tag"]
    for other in sorted(writeauth.DOMAINS - {domain}):
        assert rotated.problem(other, link, vector["tag"]) == f"tag by write key {key_id} does not verify"
    dropped = writeauth.Verifier([KEYS[1 - vector["key"]]])
    assert dropped.problem(domain, link, vector["tag"]) == f"tagged by an unknown write key {key_id}"
    assert not dropped.valid(domain, link, vector["tag"])


def test_the_current_tag_is_by_the_first_key():
    verifier = writeauth.Verifier(KEYS)
    assert verifier.current.key_id == TAGS["keyIds"][0]
    assert verifier.tag(writeauth.RUN, "3f" * 32) == TAGS["currentTag"]


# --------------------------------------------------------------------------------------------------
# Merkle tree (RFC 6962 / 9162)
# --------------------------------------------------------------------------------------------------
M = VECTORS["merkle"]
LEAF_HASHES = [bytes.fromhex(h) for h in M["leafHashes"]]


def _b(hexes):
    return [bytes.fromhex(h) for h in hexes]


def test_merkle_leaves_and_roots():
    assert (
        M["emptyRoot"] == hashlib.sha256(b"").hexdigest() == merkle.EMPTY_ROOT.hex() == merkle.mth([]).hex()
    )
    assert merkle.Frontier().root() == merkle.EMPTY_ROOT
    assert [merkle.leaf_hash(bytes.fromhex(d)).hex() for d in M["leaves"]] == M["leafHashes"]
    assert [ref.leaf(bytes.fromhex(d)).hex() for d in M["leaves"]] == M["leafHashes"]
    frontier = merkle.Frontier()
    for n in range(1, 9):
        frontier.append(LEAF_HASHES[n - 1])
        expected = M["roots"][n - 1]
        assert merkle.mth(LEAF_HASHES[:n]).hex() == ref.mth(LEAF_HASHES[:n]).hex() == expected
        assert frontier.root().hex() == expected


@pytest.mark.parametrize("vector", M["inclusion"], ids=lambda v: f"{v['index']}-of-{v['size']}")
def test_merkle_inclusion(vector):
    m, n, proof = vector["index"], vector["size"], _b(vector["proof"])
    assert ref.inclusion(m, LEAF_HASHES[:n]) == proof
    assert merkle.path(m, LEAF_HASHES[:n]) == proof
    nodes = _stored(LEAF_HASHES[:n])
    assert merkle.proof_from_nodes(merkle.inclusion_ranges(m, n), nodes.__getitem__) == proof
    root = bytes.fromhex(M["roots"][n - 1])
    assert merkle.root_from_inclusion(LEAF_HASHES[m], m, n, proof) == root
    merkle.verify_inclusion(LEAF_HASHES[m], m, n, proof, root)


@pytest.mark.parametrize("vector", M["consistency"], ids=lambda v: f"{v['old']}-to-{v['new']}")
def test_merkle_consistency(vector):
    m, n, proof = vector["old"], vector["new"], _b(vector["proof"])
    assert ref.consistency(m, LEAF_HASHES[:n]) == proof
    assert merkle.subproof(m, LEAF_HASHES[:n]) == proof
    nodes = _stored(LEAF_HASHES[:n])
    assert merkle.proof_from_nodes(merkle.consistency_ranges(m, n), nodes.__getitem__) == proof
    merkle.verify_consistency(m, n, bytes.fromhex(M["roots"][m - 1]), bytes.fromhex(M["roots"][n - 1]), proof)


def _stored(leaves):
    nodes, frontier = {}, merkle.Frontier()
    for i, leaf in enumerate(leaves):
        nodes[(0, i)] = leaf
        for level, index, h in frontier.append(leaf):
            nodes[(level, index)] = h
    return nodes


# --------------------------------------------------------------------------------------------------
# Leaves
# --------------------------------------------------------------------------------------------------
_BUILD = {"run": leafdata.leaf_fields, "tail": leafdata.tail_fields, "governance": leafdata.governance_fields}
_DECODE = {"run": leafdata.decode, "tail": leafdata.decode_any, "governance": leafdata.decode_governance}


@pytest.mark.parametrize("vector", VECTORS["leaves"], ids=_ids(VECTORS["leaves"]))
def test_leaf(vector):
    args = _typed(vector["args"])
    data = leafdata.encode(_BUILD[vector["kind"]](**args))
    assert data.decode("utf-8") == vector["data"]
    assert merkle.leaf_hash(data).hex() == vector["leafHash"] == ref.leaf(vector["data"].encode()).hex()
    fields = json.loads(vector["data"])
    assert ref.canonical(fields) == vector["data"]  # canonical JSON, as the layout says
    assert _DECODE[vector["kind"]](vector["data"]) == fields == leafdata.decode_any(data)
    assert leafdata.write_key_id(fields) == args.get("write_key_id")


# --------------------------------------------------------------------------------------------------
# Signed checkpoints
# --------------------------------------------------------------------------------------------------
N = VECTORS["signedNotes"]


def _keys():
    private = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(N["rfc8032Seed"]))
    witness = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(N["witnessSeed"]))
    return private, private.public_key(), witness


def test_the_note_key_is_rfc_8032s_and_named_as_c2sp_says():
    _, public, witness = _keys()
    raw = note.raw_public(public)
    assert raw.hex() == N["rfc8032Public"]  # RFC 8032 §7.1, TEST 1
    assert note.public_text(public) == N["publicText"] == base64.b64encode(raw).decode()
    assert note.load_public(N["publicText"]).public_bytes_raw() == raw
    assert (
        note.note_key_id(N["origin"], public) == N["noteKeyId"] == ref.note_key_id(N["origin"], 1, raw).hex()
    )
    assert note.log_vkey(N["origin"], public) == N["vkey"] == ref.vkey(N["origin"], 1, raw)
    assert signednote.parse_vkey(N["vkey"]).public.public_bytes_raw() == raw
    assert N["witnessVkey"] == ref.vkey("witness.example/w1", 4, witness.public_key().public_bytes_raw())


@pytest.mark.parametrize("vector", N["checkpoints"], ids=lambda v: f"size-{v['treeSize']}")
def test_plain_checkpoint_and_its_link(vector):
    """Issue 50: the same inputs as a plain checkpoint (no extension lines) and its signed link, against
    the reference transcription; the key signs both under the origin, and the link names the body."""
    private, public, _ = _keys()
    size, root = vector["treeSize"], vector["rootHash"]
    body = note.NoteBody(N["origin"], size, root, vector["signedAt"], vector["previous"], extended=False)
    text = body.text()
    assert text == ref.plain_checkpoint_body(N["origin"], size, root) and text.count("\n") == 3
    link = body.link().text()
    assert link == ref.checkpoint_link(size, text, vector["signedAt"], vector["previous"])
    assert link.startswith(f"diagnosis-audit-checkpoint-link/v1\ntree-size {size}\ncheckpoint ")
    assert note.parse_note_body(text, link) == body and note.parse_link(link) == body.link()
    assert note.statement_hash(text, link) == hashlib.sha256(link.encode()).hexdigest()
    signature, link_signature = note.sign_note(body, private), note.sign_note(body, private, link)
    note.verify_checkpoint(text, body, signature, public, link_signature)
    raw = base64.b64decode(link_signature)
    assert raw[:4].hex() == N["noteKeyId"]
    Ed25519PublicKey.from_public_bytes(bytes.fromhex(N["rfc8032Public"])).verify(raw[4:], link.encode())
    with pytest.raises(note.NoteError):  # the body's signature is no link signature
        note.verify_checkpoint(text, body, signature, public, signature)
    with pytest.raises(note.NoteError):  # a link names exactly one body
        note.parse_note_body(ref.plain_checkpoint_body(N["origin"], size, "00" * 32), link)


@pytest.mark.parametrize("vector", N["checkpoints"], ids=lambda v: f"size-{v['treeSize']}")
def test_signed_checkpoint(vector):
    private, public, witness = _keys()
    text = ref.checkpoint_body(N["origin"], vector["treeSize"], vector["rootHash"], vector["signedAt"],
                               vector["previous"])  # fmt: skip
    assert text == vector["body"]
    body = note.NoteBody(
        N["origin"], vector["treeSize"], vector["rootHash"], vector["signedAt"], vector["previous"]
    )
    assert body.text() == text and note.parse_note_body(text) == body and note.parse_any(text) == body
    assert note.body_hash(text) == vector["bodyHash"] == hashlib.sha256(text.encode()).hexdigest()
    # Ed25519 is deterministic: the same key signs the same body to the same bytes.
    assert note.sign_note(body, private) == vector["signature"]
    raw = base64.b64decode(vector["signature"])
    assert raw[:4].hex() == N["noteKeyId"]
    Ed25519PublicKey.from_public_bytes(bytes.fromhex(N["rfc8032Public"])).verify(raw[4:], text.encode())
    assert vector["note"] == text + "\n" + ref.signature_line(N["origin"], raw[:4], raw[4:])
    assert note.signed_note(text, N["origin"], vector["signature"]) == vector["note"]
    assert signednote.verify_note(vector["note"], [signednote.parse_vkey(N["vkey"])])[0] == text
    note.verify_checkpoint(text, body, vector["signature"], public)
    assert note.find_signer(body, vector["signature"], [public]) is public
    # The witness's cosignature/v1 over the same body at a fixed time.
    cosig = vector["cosignature"]
    line = signednote.cosign(text, "witness.example/w1", witness, cosig["timestamp"])
    assert line.line == cosig["line"]
    parsed = signednote.parse_signature_line(cosig["line"])
    assert parsed.signature[:8] == ref.cosignature_bytes(cosig["timestamp"], b"")
    witness.public_key().verify(parsed.signature[8:], ref.cosigned_message(text, cosig["timestamp"]))
    verifier = signednote.parse_vkey(N["witnessVkey"])
    assert signednote.verify_cosignature(text, parsed, verifier) == cosig["timestamp"]


def test_legacy_json_checkpoint():
    private, public, _ = _keys()
    legacy = N["legacy"]
    assert note.key_id(public) == legacy["keyId"] == hashlib.sha256(note.raw_public(public)).hexdigest()[:16]
    body = note.parse_body(legacy["body"])
    assert body.text() == legacy["body"] == ref.legacy_body(
        {"origin": N["origin"], "treeSize": 8, "rootHash": N["checkpoints"][1]["rootHash"],
         "signedAt": N["checkpoints"][1]["signedAt"], "previous": "", "keyId": legacy["keyId"]}
    )  # fmt: skip
    assert note.is_legacy(legacy["body"]) and note.parse_any(legacy["body"]) == body
    assert note.body_hash(legacy["body"]) == legacy["bodyHash"]
    assert note.sign(legacy["body"], private) == legacy["signature"]
    public.verify(base64.b64decode(legacy["signature"]), legacy["body"].encode())
    note.verify(legacy["body"], legacy["signature"], public)
    note.verify_checkpoint(legacy["body"], body, legacy["signature"], public)
    assert note.signer_key_id(body, legacy["signature"]) == legacy["keyId"]
    assert note.find_signer(body, legacy["signature"], [public]) is public
