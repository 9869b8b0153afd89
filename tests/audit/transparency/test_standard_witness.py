"""Witness-ready checkpoints (issue 50 item 1), checked by software nobody here wrote.

* `aics-witness` (PyPI), a C2SP tlog-witness, runs in its own process with its default settings (only
  `init` and `add-log`: extension lines refused, as standard witnesses do): it cosigns our plain
  checkpoints, over a consistency proof from the size it holds, and refuses (400) one signed with the
  extension lines of before.
* `aics-tlog` (PyPI; both need Python 3.12, so they live in `.venv-witness`, see scripts/setup.sh)
  parses and verifies the cosigned checkpoint note, the log's signature, the witness's cosignature, the
  link note and the consistency and inclusion proofs (`tests/aics_tlog_check.py`).
* sigstore-python (requirements-dev.txt) parses and verifies the checkpoint note and the inclusion proof
  with its own signed-note and Merkle code, in this process.
"""

import base64
import io
import json
import os
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from django.core.management import call_command

from audit.models import CheckpointCosignature, LogLeaf, WitnessAttempt, WitnessOutcome
from audit.transparency import keys, log, note, signednote, store
from audit.transparency.evidence import build_bundle
from tests.audit.transparency.support import finished_runs

# The witness protocol does not depend on the database: run once, on the production one (MariaDB), to keep
# the suite's time (two subprocesses of Python 3.12 and a server).
pytestmark = [pytest.mark.django_db, pytest.mark.mariadb]

ROOT = Path(__file__).resolve().parents[3]
VENV = ROOT / ".venv-witness" / "bin"
ORIGIN = "audit.test/diagnosis"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def standard_witness(tmp_path, settings, signing_key):
    """aics-witness serving on 127.0.0.1, configured only with `init` and `add-log` (its defaults), and
    named in AUDIT_WITNESSES; yields its vkey."""
    if not (VENV / "aics-witness").exists():
        pytest.fail("aics-witness is not installed: run scripts/setup.sh dev (it builds .venv-witness)")
    settings.AUDIT_LOG_ORIGIN = ORIGIN
    config = str(tmp_path / "witness.json")
    cli = [str(VENV / "aics-witness")]
    env = {**os.environ, "AICS_WITNESS_CONFIG": config}
    env.pop("WITNESS_SEED_HEX", None)
    vkey = subprocess.run(
        [*cli, "init", "--name", "witness.test/aics"], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    subprocess.run(
        [*cli, "add-log", "--origin", ORIGIN, "--vkey", keys.current_key().vkey],
        env=env,
        capture_output=True,
        check=True,
    )
    assert "extension_lines" not in Path(config).read_text()  # the default: none allowed
    port = _free_port()
    server = subprocess.Popen(
        [*cli, "serve", "--listen", f"127.0.0.1:{port}"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        else:
            pytest.fail("aics-witness did not start")
        settings.AUDIT_WITNESSES = [f"{url} {vkey}"]
        settings.AUDIT_WITNESS_TIMEOUT_SECONDS = 5.0
        yield vkey
    finally:
        server.terminate()
        server.wait(timeout=10)


def _aics_tlog(document: dict) -> dict:
    done = subprocess.run(
        [str(VENV / "python"), str(ROOT / "tests" / "aics_tlog_check.py")],
        input=json.dumps(document),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)


def _sigstore_verifies(text: str, public, size: int, root: str) -> None:
    """sigstore-python's signed-note and checkpoint code reads and verifies the note."""
    from cryptography.hazmat.primitives import serialization
    from sigstore._internal.rekor.checkpoint import SignedCheckpoint
    from sigstore._internal.trust import Keyring
    from sigstore._utils import KeyID
    from sigstore_models.common.v1 import PublicKey, PublicKeyDetails

    der = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    keyring = Keyring([PublicKey(raw_bytes=base64.b64encode(der), key_details=PublicKeyDetails.PKIX_ED25519)])
    signed = SignedCheckpoint.from_text(text)
    assert (signed.checkpoint.origin, signed.checkpoint.log_size) == (ORIGIN, size)
    assert signed.checkpoint.log_hash == root and signed.checkpoint.other_content == []
    own = [s for s in signed.signed_note.signatures if s.name == ORIGIN]
    signed.signed_note.verify(keyring, KeyID(own[0].sig_hash + bytes(28)))


def _sigstore_includes(leaf_data: str, index: int, size: int, proof: list[str], root: str) -> bool:
    """RFC 9162 inclusion with sigstore-python's Merkle functions (those its Rekor verification uses)."""
    from sigstore._internal import merkle as sigstore_merkle

    hashes = [bytes.fromhex(h) for h in proof]
    inner, border = sigstore_merkle._decomp_inclusion_proof(index, size)
    assert len(hashes) == inner + border
    seed = sigstore_merkle._hash_leaf(leaf_data.encode("utf-8"))
    found = sigstore_merkle._chain_border_right(
        sigstore_merkle._chain_inner(seed, hashes[:inner], index), hashes[inner:]
    )
    return found.hex() == root


def test_an_off_the_shelf_witness_cosigns_our_checkpoints_with_its_defaults(user, settings, standard_witness):
    vkey = standard_witness
    first_run = finished_runs(user, 2)[0]
    first = log.checkpoint().newest
    finished_runs(user, 3)
    second = log.checkpoint().newest
    assert first.tree_size < second.tree_size
    # Both cosigned: the first from size 0, the second over a consistency proof from the first's size.
    attempts = list(WitnessAttempt.objects.order_by("id").values_list("tree_size", "outcome", "status"))
    assert attempts == [(first.tree_size, "cosigned", 200), (second.tree_size, "cosigned", 200)]
    assert CheckpointCosignature.objects.filter(witness="witness.test/aics").count() == 2

    # verify_audit under a policy of that witness, which it also asks live for its size.
    out = io.StringIO()
    call_command("verify_audit", "--witness-key", vkey, stdout=out)  # CommandError on any problem
    assert "witness policy 1 of 1 witness(es) (witness.test/aics), 1 required" in out.getvalue()
    assert "1 witness(es) asked for their size, 1 at the log's: ok" in out.getvalue()

    # The bundle's cosigned note, link and proofs, by aics-tlog and sigstore-python.
    data = build_bundle(run=first_run)
    anchor = data["anchor"]
    assert anchor["treeSize"] == second.tree_size
    proof = store.consistency_proof(first.tree_size, second.tree_size).hex
    found = _aics_tlog(
        {
            "logVkey": keys.current_key().vkey,
            "witnessVkey": vkey,
            "note": anchor["checkpoint"]["note"],
            "link": anchor["checkpoint"]["link"],
            "consistency": {
                "old": first.tree_size,
                "new": second.tree_size,
                "oldRoot": first.root_hash,
                "newRoot": second.root_hash,
                "proof": proof,
            },
            "inclusion": {
                "leafData": anchor["leafData"],
                "index": anchor["leafIndex"],
                "size": anchor["treeSize"],
                "root": second.root_hash,
                "proof": anchor["inclusionProof"],
            },
        }
    )
    assert found["origin"] == ORIGIN and found["size"] == second.tree_size
    assert found["root"] == second.root_hash and found["extensionLines"] == []
    assert found["ok"] and found["logOk"] and found["witnesses"] == ["witness.test/aics"], found["error"]
    assert found["linkSigned"] and not found["linkIsCheckpoint"] and found["linkText"] == second.link
    assert found["consistent"] and found["included"]
    link = note.parse_link(found["linkText"])
    assert (link.checkpoint, link.previous) == (note.body_hash(second.body), first.checkpoint_hash)

    _sigstore_verifies(
        anchor["checkpoint"]["note"], keys.current_key().public, second.tree_size, second.root_hash
    )
    assert _sigstore_includes(
        anchor["leafData"],
        anchor["leafIndex"],
        anchor["treeSize"],
        anchor["inclusionProof"],
        second.root_hash,
    )
    leaf = LogLeaf.objects.get(run_id=first_run.run_id)
    assert not _sigstore_includes(
        leaf.data + " ", leaf.leaf_index, second.tree_size, anchor["inclusionProof"], second.root_hash
    )

    # A checkpoint with the extension lines of before: the same witness, with its defaults, refuses it.
    settings.AUDIT_CHECKPOINT_EXTENSION_LINES = True
    finished_runs(user, 1)
    extended = log.checkpoint().newest
    assert "\nsigned-at " in extended.body
    refused = WitnessAttempt.objects.order_by("-id").first()
    assert (refused.tree_size, refused.outcome, refused.status) == (
        extended.tree_size,
        WitnessOutcome.BAD_REQUEST,
        400,
    )
    assert not CheckpointCosignature.objects.filter(checkpoint=extended).exists()
    assert signednote.parse_checkpoint(second.body).extensions == ()
