"""The C2SP formats (issue 35 item 1): our signed-note, tlog-checkpoint and cosignature code against the
specifications' own examples, round trips, and our checkpoints verified by an independent, maintained
implementation of the note format (sigstore-python's Rekor checkpoint verification)."""

import base64

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.transparency import keys, log, note, signednote
from tests.audit.transparency.support import finished_runs

# https://c2sp.org/signed-note, "Verifier keys" / "Example".
SPEC_VKEY = "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k"
SPEC_NOTE = (
    "This is an example message.\n\n"
    "\u2014 example.com/foo "
    "Uw2QOkn8srV1yJGh2VYRlL1Tnagv1YEq6TfXppzi2ONncAlTgK7Ztg1ERYNZXsYjOBH3mFXmRKuwHjG1Yu72IneyaQM=\n"
)
# https://c2sp.org/tlog-checkpoint (its example; the log's key is not published, so only parsed).
SPEC_CHECKPOINT = (
    "example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n\n"
    "\u2014 example.com/behind-the-sofa "
    "Az3grlgtzPICa5OS8npVmf1Myq/5IZniMp+ZJurmRDeOoRDe4URYN7u5/Zhcyv2q1gGzGku9nTo+zyWE+xeMcTOAYQ8=\n"
)


def test_the_spec_vkey_verifies_the_spec_note():
    verifier = signednote.parse_vkey(SPEC_VKEY)
    assert (verifier.name, verifier.key_id.hex(), verifier.key_type) == ("example.com/foo", "530d903a", 1)
    assert verifier.vkey == SPEC_VKEY
    body, good = signednote.verify_note(SPEC_NOTE, [verifier])
    assert body == "This is an example message.\n" and good == [verifier]
    with pytest.raises(signednote.SignedNoteError):
        signednote.verify_note(SPEC_NOTE.replace("example message", "exemplary message"), [verifier])
    stranger = signednote.Verifier("example.com/foo", 1, Ed25519PrivateKey.generate().public_key())
    with pytest.raises(signednote.SignedNoteError, match="no signature by a known key"):
        signednote.verify_note(SPEC_NOTE, [stranger])  # an unknown key is ignored, then none is left


def test_a_vkey_whose_id_does_not_match_its_key_is_refused():
    with pytest.raises(signednote.SignedNoteError, match="key id"):
        signednote.parse_vkey(SPEC_VKEY.replace("530d903a", "530d903b"))


def test_the_spec_checkpoint_parses():
    body, signatures = signednote.split_note(SPEC_CHECKPOINT)
    cp = signednote.parse_checkpoint(body)
    assert (cp.origin, cp.tree_size, cp.extensions) == ("example.com/behind-the-sofa", 20852163, ())
    assert cp.text() == body
    assert [s.name for s in signatures] == ["example.com/behind-the-sofa"]
    assert signatures[0].line == SPEC_CHECKPOINT.split("\n\n")[1]


def test_a_cosignature_round_trips_and_binds_the_body_and_time():
    private = Ed25519PrivateKey.generate()
    witness = signednote.Verifier("witness.example/w1", signednote.COSIGNATURE_V1, private.public_key())
    body = signednote.split_note(SPEC_CHECKPOINT)[0]
    line = signednote.cosign(body, witness.name, private, 1679315147)
    assert line.key_id == witness.key_id and len(line.signature) == 72
    assert signednote.verify_cosignature(body, line, witness) == 1679315147
    again = signednote.parse_vkey(witness.vkey)
    assert again.key_id == witness.key_id and again.key_type == 4
    with pytest.raises(signednote.SignedNoteError):
        signednote.verify_cosignature(body.replace("20852163", "20852164"), line, witness)
    later = signednote.Signature(line.name, line.key_id, (1679315148).to_bytes(8, "big") + line.signature[8:])
    with pytest.raises(signednote.SignedNoteError):
        signednote.verify_cosignature(body, later, witness)
    # A note signer's key (0x01) is never a cosigner's (0x04): another key id.
    assert signednote.key_id(witness.name, 1, private.public_key()) != witness.key_id


@pytest.mark.django_db
def test_our_checkpoint_round_trips(user, signing_key, settings):
    finished_runs(user, 2)
    cp = log.checkpoint().newest
    body = note.parse_note_body(cp.body, cp.link)
    assert cp.body.splitlines() == [  # no extension lines (issue 50): what a default witness accepts
        settings.AUDIT_LOG_ORIGIN,
        "3",  # the two runs and the governance chain migrate wrote
        base64.b64encode(bytes.fromhex(cp.root_hash)).decode(),
    ]
    link = note.parse_link(cp.link)
    assert (
        body.text() == cp.body and body.signed_at == link.signed_at == cp.link.splitlines()[3].split(" ")[1]
    )
    assert link.checkpoint == note.body_hash(cp.body) and link.tree_size == 3 and not link.previous
    assert note.parse_link(link.text()) == link
    # The link is no checkpoint: its second line is not a decimal size (no checkpoint parser takes it).
    with pytest.raises(signednote.SignedNoteError):
        signednote.parse_checkpoint(cp.link)
    text = note.signed_note(cp.body, body.origin, cp.signature)
    vkey = note.log_vkey(body.origin, keys.current_key().public)
    assert signednote.verify_note(text, [signednote.parse_vkey(vkey)])[0] == cp.body
    assert vkey.split("+")[1] == cp.key_id


@pytest.mark.django_db
def test_our_checkpoints_verify_with_sigstore_python(user, signing_key):
    """sigstore-python (pinned in requirements-dev.txt) parses and verifies Rekor v2's C2SP checkpoints
    with its own signed-note code: it must read and verify ours, and refuse a changed one."""
    from cryptography.hazmat.primitives import serialization
    from sigstore._internal.rekor.checkpoint import SignedCheckpoint
    from sigstore._internal.trust import Keyring
    from sigstore._utils import KeyID
    from sigstore.errors import VerificationError
    from sigstore_models.common.v1 import PublicKey, PublicKeyDetails

    finished_runs(user, 3)
    cp = log.checkpoint().newest
    origin = note.parse_note_body(cp.body).origin
    text = note.signed_note(cp.body, origin, cp.signature)
    public = keys.current_key().public
    der = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    keyring = Keyring([PublicKey(raw_bytes=base64.b64encode(der), key_details=PublicKeyDetails.PKIX_ED25519)])

    signed = SignedCheckpoint.from_text(text)
    assert signed.checkpoint.origin == origin and signed.checkpoint.log_size == cp.tree_size
    assert signed.checkpoint.log_hash == cp.root_hash
    assert [s.name for s in signed.signed_note.signatures] == [origin]
    # sigstore matches the signature's 4-byte hint to the key id it is given: ours, computed per the spec.
    hint = signed.signed_note.signatures[0].sig_hash
    assert hint == signednote.key_id(origin, signednote.ED25519, public) == bytes.fromhex(cp.key_id)
    signed.signed_note.verify(keyring, KeyID(hint + bytes(28)))

    forged = SignedCheckpoint.from_text(text.replace(f"\n{cp.tree_size}\n", f"\n{cp.tree_size + 1}\n", 1))
    with pytest.raises(VerificationError):
        forged.signed_note.verify(keyring, KeyID(hint + bytes(28)))
