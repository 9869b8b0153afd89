"""Witness cosigning (issue 35 items 2 and 4): the checkpointer submits each new checkpoint to the
configured witnesses over C2SP tlog-witness, stores their cosignatures and puts them in evidence bundles;
a witness that is down or refuses is recorded, exported on /metrics and asked again by the next run; a
split view (the same size with another history) is refused by the witness and fails the policy.

The witness is `tests/witness_server.py`, a tlog-witness written from the specifications with no code of
this project, served over HTTP on 127.0.0.1 with its own state file (no Go toolchain here for
litewitness: see that module)."""

import base64
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from audit.models import (
    Checkpoint,
    CheckpointCosignature,
    LogHead,
    LogLeaf,
    LogNode,
    WitnessAttempt,
    WitnessOutcome,
)
from audit.transparency import bundle, keys, log, merkle, note, signednote, store, witnesses
from audit.transparency.evidence import build_bundle
from telemetry.metrics import witness_metrics
from tests.audit.transparency.support import delete_run, finished_runs, legacy_checkpoints
from tests.witness_server import Witness, WitnessServer, verify_consistency

pytestmark = pytest.mark.django_db


@pytest.fixture
def witness(tmp_path, signing_key, settings):
    """A running witness that trusts this log's key for its origin, configured in AUDIT_WITNESSES."""
    trusted = {settings.AUDIT_LOG_ORIGIN: [keys.current_key().public]}
    w = Witness("witness.test/w1", tmp_path / "w1.json", trusted)
    server = WitnessServer(w)
    settings.AUDIT_WITNESSES = [f"{server.url} {w.vkey}"]
    settings.AUDIT_WITNESS_TIMEOUT_SECONDS = 2.0
    yield w, server
    server.stop()


def _policy(*witnesses: Witness, quorum=None) -> signednote.Policy:
    return signednote.make_policy([w.vkey for w in witnesses], quorum)


def _samples(name: str) -> dict[tuple, float]:
    found = {}
    for family in witness_metrics():
        for sample in family.samples:
            if sample.name == name:
                found[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def test_the_fixture_witness_checks_consistency_like_rfc_9162(user, signing_key):
    # The witness's own proof check against proofs from the stored tree (and a wrong one).
    finished_runs(user, 7)
    log.checkpoint(batch_size=3)
    for old in range(1, 7):
        for new in range(old, 8):
            proof = store.consistency_proof(old, new).hashes if old < new else []
            assert verify_consistency(old, new, store.root(old), store.root(new), proof)
            if proof:
                assert not verify_consistency(old, new, store.root(old), merkle.leaf_hash(b"x"), proof)


def test_each_checkpoint_is_cosigned_stored_and_bundled(user, witness):
    w, _ = witness
    finished_runs(user, 2)
    first = log.checkpoint().newest
    [cosig] = CheckpointCosignature.objects.filter(checkpoint=first)
    verifier = signednote.parse_vkey(w.vkey)
    raw = base64.b64decode(cosig.signature)
    line = signednote.Signature(cosig.witness, raw[:4], raw[4:])
    stamp = signednote.verify_cosignature(first.body, line, verifier)
    assert (cosig.witness, cosig.key_id) == ("witness.test/w1", verifier.key_id.hex())
    assert int(cosig.cosigned_at.timestamp()) == stamp
    # The next checkpoint is submitted with a consistency proof from the size the witness cosigned.
    runs = finished_runs(user, 3)
    second = log.checkpoint().newest
    assert second.cosignatures.count() == 1
    assert w.requests == [(0, 200), (first.tree_size, 200)]
    attempts = list(WitnessAttempt.objects.order_by("id").values_list("outcome", "old_size", "tree_size"))
    assert attempts == [("cosigned", 0, first.tree_size), ("cosigned", first.tree_size, second.tree_size)]
    # Nothing new: nothing submitted again.
    log.checkpoint()
    assert len(w.requests) == 2
    # The bundle carries the cosignature; the policy holds with it, and fails for another witness.
    data = build_bundle(run=runs[0])
    assert "\n\u2014 witness.test/w1 " in data["anchor"]["checkpoint"]["note"]
    public = [keys.current_key().public]
    report = bundle.verify(data, public, _policy(w))
    assert report.ok, report.failures
    assert any(p.startswith("witnesses: the checkpoint of tree size") for p in report.passed)
    other = Witness("witness.test/w2", w.state, {})
    report = bundle.verify(data, public, _policy(w, other, quorum=2))
    assert report.failures == [
        "anchor.checkpoint: witness policy: cosigned by 1 of the 2 of 2 witness(es) (witness.test/w1, "
        "witness.test/w2), 2 required (no valid cosignature by witness.test/w2)"
    ]
    assert bundle.verify(data, public, _policy(w, other, quorum=1)).ok
    assert _samples("diagnosis_audit_witness_last_cosigned_size") == {
        (("witness", "witness.test/w1"),): second.tree_size
    }
    # An independent note parser (sigstore-python) reads the cosigned note: both signature lines.
    from sigstore._internal.rekor.checkpoint import SignedCheckpoint

    parsed = SignedCheckpoint.from_text(data["anchor"]["checkpoint"]["note"])
    names = [(sig.name, sig.sig_hash) for sig in parsed.signed_note.signatures]
    assert names == [
        (note.parse_note_body(second.body).origin, bytes.fromhex(second.key_id)),
        ("witness.test/w1", verifier.key_id),
    ]


def test_a_witness_that_is_down_is_recorded_alerted_and_retried(user, witness, settings):
    w, server = witness
    settings.AUDIT_WITNESSES = [f"http://127.0.0.1:9 {w.vkey}"]  # nothing listens there
    finished_runs(user, 2)
    cp = log.checkpoint().newest
    assert cp is not None and cp.cosignatures.count() == 0  # the checkpoint is signed all the same
    [attempt] = WitnessAttempt.objects.all()
    # The two runs and the governance chain migrate wrote: 3 leaves.
    assert (attempt.witness, attempt.outcome, attempt.tree_size) == ("witness.test/w1", "unreachable", 3)
    assert _samples("diagnosis_audit_witness_failures_total") == {
        (("reason", "unreachable"), ("witness", "witness.test/w1")): 1.0
    }
    log.checkpoint()  # still down: asked again, recorded again
    assert (
        _samples("diagnosis_audit_witness_failures_total")[
            (("reason", "unreachable"), ("witness", "witness.test/w1"))
        ]
        == 2.0
    )
    # Back: the next run (nothing new to sign) submits the newest checkpoint again.
    settings.AUDIT_WITNESSES = [f"{server.url} {w.vkey}"]
    assert log.checkpoint().checkpoints == []
    assert cp.cosignatures.count() == 1 and w.requests == [(0, 200)]
    assert WitnessAttempt.objects.order_by("-id").first().outcome == "cosigned"


def test_a_witness_that_does_not_know_the_log_or_its_key_refuses(user, witness, settings):
    w, _ = witness
    w.logs = {"another.example/log": [keys.current_key().public]}
    finished_runs(user, 1)
    log.checkpoint()
    w.logs = {settings.AUDIT_LOG_ORIGIN: [note.load_private(keys.generate_key_text()).public_key()]}
    log.checkpoint()
    outcomes = list(WitnessAttempt.objects.order_by("id").values_list("outcome", "status"))
    assert outcomes == [(WitnessOutcome.UNKNOWN_LOG, 404), (WitnessOutcome.FORBIDDEN, 403)]
    assert CheckpointCosignature.objects.count() == 0


def test_a_witness_ahead_of_what_we_stored_is_caught_up_from_its_size(user, witness):
    w, _ = witness
    finished_runs(user, 2)
    first = log.checkpoint().newest
    CheckpointCosignature.objects.all().delete()  # e.g. restored from a backup taken before
    finished_runs(user, 2)
    second = log.checkpoint().newest
    assert w.requests == [(0, 200), (0, 409), (first.tree_size, 200)]
    assert second.cosignatures.count() == 1


def _rebuild_history(user, victim) -> None:
    """What an operator rewriting history does: delete a run, add another, and rebuild the log and its
    checkpoints from scratch, signing them with the log's own key (a consistent history of its own)."""
    delete_run(victim.run_id)
    CheckpointCosignature.objects.all().delete()
    Checkpoint.objects.all().delete()
    LogLeaf.objects.all().delete()
    LogNode.objects.all().delete()
    LogHead.objects.filter(pk=1).update(tree_size=0, root_hash="", scan_from=None)
    finished_runs(user, 1)
    log.checkpoint(full_scan=True)


def test_a_split_view_is_refused_by_the_witness_and_fails_the_policy(user, witness, settings):
    w, _ = witness
    runs = finished_runs(user, 3)
    honest = log.checkpoint().newest
    assert honest.cosignatures.count() == 1
    honest_bundle = build_bundle(run=runs[1])

    _rebuild_history(user, runs[0])
    rebuilt = Checkpoint.objects.order_by("-tree_size").first()
    assert rebuilt.tree_size == honest.tree_size and rebuilt.root_hash != honest.root_hash
    # The witness holds the honest checkpoint of that size: it refuses the other one.
    assert w.requests[-2:] == [(0, 409), (honest.tree_size, 422)]
    last = WitnessAttempt.objects.order_by("-id").first()
    assert (last.outcome, last.status) == (WitnessOutcome.BAD_PROOF, 422)
    assert rebuilt.cosignatures.count() == 0
    assert _samples("diagnosis_audit_witness_failures_total") == {
        (("reason", "bad-proof"), ("witness", "witness.test/w1")): 1.0
    }
    # Verified with the policy, the rebuilt history fails; the bundle taken before still verifies.
    public = [keys.current_key().public]
    report = bundle.verify(build_bundle(run=runs[1]), public, _policy(w))
    assert not report.ok
    assert "witness.test/w1" in report.failures[-1] and "witness policy" in report.failures[-1]
    assert bundle.verify(honest_bundle, public, _policy(w)).ok
    # Without witnesses to ask and without a policy the rebuilt log verifies in itself: this is what
    # witnesses are for.
    configured = settings.AUDIT_WITNESSES
    settings.AUDIT_WITNESSES = []
    call_command("verify_audit")
    # Asked for its size, the witness answers that it cosigned another tree of that size (422).
    settings.AUDIT_WITNESSES = configured
    ok, out = _verify_audit()
    assert not ok
    assert (
        f"log INVALID witness witness.test/w1 has cosigned tree size {honest.tree_size} with another root "
        "than the log's newest checkpoint (the log was rebuilt)"
    ) in out
    settings.AUDIT_WITNESS_POLICY = [w.vkey]
    with pytest.raises(CommandError):
        call_command("verify_audit")


def _verify_audit(*args) -> tuple[bool, str]:
    out = io.StringIO()
    try:
        call_command("verify_audit", *args, stdout=out)
    except CommandError:
        return False, out.getvalue()
    return True, out.getvalue()


def test_the_policy_is_n_of_m_in_verify_audit(user, witness, tmp_path, settings):
    w, _ = witness
    down = Witness("witness.test/w2", tmp_path / "w2.json", {})
    third = Witness("witness.test/w3", tmp_path / "w3.json", {})
    settings.AUDIT_WITNESSES = [*settings.AUDIT_WITNESSES, f"http://127.0.0.1:9 {down.vkey}"]
    runs = finished_runs(user, 2)
    cp = log.checkpoint().newest
    ok, out = _verify_audit("--witness-key", w.vkey)
    assert ok, out
    assert "witness policy 1 of 1 witness(es) (witness.test/w1), 1 required" in out
    ok, out = _verify_audit("--witness-key", w.vkey, "--witness-key", down.vkey, "--witness-quorum", "1")
    assert ok, out
    ok, out = _verify_audit("--witness-key", w.vkey, "--witness-key", down.vkey)  # all: 2 of 2
    assert not ok
    assert (
        f"log INVALID checkpoint tree_size={cp.tree_size}: witness policy: cosigned by 1 of the 2 of 2 "
        "witness(es) (witness.test/w1, witness.test/w2), 2 required "
        "(no valid cosignature by witness.test/w2); "
        f"witness.test/w2 last unreachable (HTTP 0) at size {cp.tree_size}: ConnectError"
    ) in out
    settings.AUDIT_WITNESS_POLICY = [w.vkey, down.vkey, third.vkey]
    settings.AUDIT_WITNESS_QUORUM = 2
    assert not _verify_audit()[0]
    assert _verify_audit("--witness-quorum", "1")[0]
    ok, out = _verify_audit("--run", runs[0].run_id)
    assert not ok
    assert f"run={runs[0].run_id} INVALID checkpoint tree_size={cp.tree_size}: witness policy" in out
    # A stored cosignature that was changed fails its signature, policy or not.
    settings.AUDIT_WITNESS_POLICY, settings.AUDIT_WITNESS_QUORUM = [], 0
    cosig = CheckpointCosignature.objects.get()
    raw = bytearray(base64.b64decode(cosig.signature))
    raw[-1] ^= 1
    CheckpointCosignature.objects.filter(pk=cosig.pk).update(signature=base64.b64encode(bytes(raw)).decode())
    ok, out = _verify_audit()
    assert not ok
    assert "stored cosignature of witness.test/w1: cosignature by witness.test/w1 does not verify" in out


def test_old_format_checkpoints_do_not_meet_a_policy_and_verify_without_one(user, witness, settings):
    w, server = witness
    settings.AUDIT_WITNESSES = []
    finished_runs(user, 1)
    log.checkpoint()
    legacy_checkpoints()
    assert _verify_audit()[0]
    ok, out = _verify_audit("--witness-key", w.vkey)
    assert not ok and "in the JSON format of before witnesses, without cosignatures" in out
    # The next checkpoint is a note, submitted and cosigned: the policy holds again.
    settings.AUDIT_WITNESSES = [f"{server.url} {w.vkey}"]
    finished_runs(user, 1)
    log.checkpoint()
    ok, out = _verify_audit("--witness-key", w.vkey)
    assert ok, out


def test_the_offline_verifier_takes_the_policy(user, witness, tmp_path):
    w, _ = witness
    run = finished_runs(user, 1)[0]
    log.checkpoint()
    path = tmp_path / "evidence.json"
    call_command("export_evidence", run.run_id, "--output", str(path), stderr=io.StringIO())
    public = note.public_text(keys.current_key().public)
    other = Witness("witness.test/w2", tmp_path / "w2.json", {})

    def offline(*args):
        return subprocess.run(
            [sys.executable, "-m", "audit.verify_bundle", str(path), "--public-key", public, *args],
            capture_output=True,
            text=True,
            check=False,
            env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(Path(__file__).parents[3])},
        )

    done = offline("--witness-key", w.vkey)
    assert done.returncode == 0 and "OK witnesses: the checkpoint of tree size" in done.stdout, done.stdout
    done = offline("--witness-key", w.vkey, "--witness-key", other.vkey)
    assert done.returncode == 1
    assert "FAIL anchor.checkpoint: witness policy: cosigned by 1 of the 2 of 2" in done.stdout
    assert "NOT VERIFIED" in done.stdout
    done = offline("--witness-key", w.vkey, "--witness-key", other.vkey, "--witness-quorum", "1")
    assert done.returncode == 0, done.stdout
    assert offline("--witness-key", "not-a-vkey").returncode == 2


# --------------------------------------------------------------------------------------------------
# Issue 43, item 6: verify_audit asks the witnesses for their size (a rollback caught)
# --------------------------------------------------------------------------------------------------
@pytest.fixture
def second_witness(tmp_path, signing_key, settings, witness):
    """A second running witness of this log, added to AUDIT_WITNESSES."""
    trusted = {settings.AUDIT_LOG_ORIGIN: [keys.current_key().public]}
    w = Witness("witness.test/w2", tmp_path / "w2.json", trusted)
    server = WitnessServer(w)
    settings.AUDIT_WITNESSES = [*settings.AUDIT_WITNESSES, f"{server.url} {w.vkey}"]
    yield w, server
    server.stop()


def _cut_back(to: Checkpoint | None) -> None:
    """What a database writer without keys does to hide the newest runs: delete every leaf, node,
    cosignature, witness attempt and checkpoint above the older checkpoint `to` (None: everything) and the
    runs those leaves anchored, and set the log head back to it. The log is then consistent in itself."""
    size = to.tree_size if to else 0
    for leaf in LogLeaf.objects.filter(leaf_index__gte=size):
        if leaf.run_id:
            delete_run(leaf.run_id)
    LogLeaf.objects.filter(leaf_index__gte=size).delete()
    for node in LogNode.objects.all():
        if (node.node_index + 1) << node.level > size:
            node.delete()
    CheckpointCosignature.objects.filter(checkpoint__tree_size__gt=size).delete()
    WitnessAttempt.objects.filter(tree_size__gt=size).delete()
    Checkpoint.objects.filter(tree_size__gt=size).delete()
    LogHead.objects.filter(pk=1).update(tree_size=size, root_hash=to.root_hash if to else "")


def test_a_log_cut_back_below_what_a_witness_cosigned_fails_verify_audit(user, witness, settings):
    w, _ = witness
    finished_runs(user, 2)
    older = log.checkpoint().newest
    finished_runs(user, 3)
    newest = log.checkpoint().newest
    assert newest.cosignatures.count() == 1
    # The untouched log verifies, the witness asked: the newest checkpoint at its own size, 200.
    requests = len(w.requests)
    ok, out = _verify_audit()
    assert ok, out
    assert "1 witness(es) asked for their size, 1 at the log's: ok" in out
    assert w.requests[requests:] == [(newest.tree_size, 200)]

    _cut_back(older)
    # Without witnesses to ask, the cut log verifies in itself, and it meets the policy too: its newest
    # checkpoint was validly cosigned when it was the newest.
    configured = settings.AUDIT_WITNESSES
    settings.AUDIT_WITNESSES = []
    assert _verify_audit()[0]
    assert _verify_audit("--witness-key", w.vkey)[0]
    # Asked, the witness answers 409 with the size it cosigned: the rollback is named, policy or not.
    settings.AUDIT_WITNESSES = configured
    requests = len(w.requests)
    for args in ((), ("--witness-key", w.vkey)):
        ok, out = _verify_audit(*args)
        assert not ok
        assert (
            f"log INVALID witness witness.test/w1 has cosigned tree size {newest.tree_size}; the log's "
            f"newest checkpoint is {older.tree_size} (the log was rolled back)"
        ) in out
        assert "1 witness(es) asked for their size, 0 at the log's: 1 problem(s)" in out
    assert w.requests[requests:] == [(older.tree_size, 409)] * 2
    # Asking changed nothing stored: no attempt recorded, no cosignature added.
    assert not WitnessAttempt.objects.filter(tree_size__gt=older.tree_size).exists()
    assert CheckpointCosignature.objects.count() == 1

    # Grown again past the witness's size, the log has no checkpoint of that size: still a problem
    # (the checkpointer's submission is a conflict), not a witness behind.
    finished_runs(user, 5)
    grown = log.checkpoint().newest
    assert grown.tree_size > newest.tree_size and grown.cosignatures.count() == 0
    assert WitnessAttempt.objects.order_by("-id").first().outcome == WitnessOutcome.CONFLICT
    ok, out = _verify_audit()
    assert not ok
    assert (
        f"log INVALID witness witness.test/w1 has cosigned tree size {newest.tree_size}, the size of no "
        f"checkpoint of the log (newest {grown.tree_size}): the log was cut back and grew again"
    ) in out


def test_a_witness_that_cannot_be_asked_is_a_note_or_with_the_policy_a_problem(
    user, witness, second_witness, settings
):
    w1, server1 = witness
    w2, _ = second_witness
    finished_runs(user, 2)
    cp = log.checkpoint().newest
    assert cp.cosignatures.count() == 2
    server1.stop()
    down = "witness witness.test/w1 could not be asked for its size: unreachable (ConnectError)"
    ok, out = _verify_audit()
    assert ok, out
    assert f"log NOTE {down}" in out
    assert "2 witness(es) asked for their size, 1 at the log's: ok" in out
    # With a policy of 1 of the 2, the one that answered is enough; of 2 of 2, the check fails closed
    # (the cosignatures stored would meet the policy: they are not what this check trusts).
    ok, out = _verify_audit("--witness-key", w1.vkey, "--witness-key", w2.vkey, "--witness-quorum", "1")
    assert ok and f"log NOTE {down}" in out, out
    settings.AUDIT_WITNESS_POLICY = [w1.vkey, w2.vkey]
    ok, out = _verify_audit()
    assert not ok
    assert f"log INVALID {down}" in out
    assert "2 witness(es) asked for their size, 1 at the log's: 1 problem(s)" in out
    # A witness that answers something else than the protocol's answers is named by its status.
    w2.logs = {}
    settings.AUDIT_WITNESS_POLICY = []
    ok, out = _verify_audit()
    assert ok, out
    assert (
        "log NOTE witness witness.test/w2 could not be asked for its size: HTTP 404 (the witness does not "
        "know this log's origin)"
    ) in out


def test_a_log_cut_back_to_nothing_cannot_be_submitted_and_fails_the_policy(user, witness, settings):
    w, _ = witness
    finished_runs(user, 2)
    log.checkpoint()
    _cut_back(None)
    # No checkpoint is left to submit: the witness cannot be asked, which fails closed under a policy.
    why = "witness witness.test/w1 could not be asked for its size: " + witnesses.NO_NOTE
    ok, out = _verify_audit()
    assert ok and f"log NOTE {why}" in out, out
    settings.AUDIT_WITNESS_POLICY = [w.vkey]
    ok, out = _verify_audit()
    assert not ok and f"log INVALID {why}" in out, out


def test_a_witness_behind_the_log_is_a_note(user, witness, settings):
    w, server = witness
    finished_runs(user, 2)
    cosigned = log.checkpoint().newest
    settings.AUDIT_WITNESSES = [f"http://127.0.0.1:9 {w.vkey}"]  # down while the next one is signed
    finished_runs(user, 2)
    newest = log.checkpoint().newest
    assert newest.cosignatures.count() == 0
    settings.AUDIT_WITNESSES = [f"{server.url} {w.vkey}"]
    ok, out = _verify_audit()
    assert ok, out
    assert (
        f"log NOTE witness witness.test/w1 has cosigned tree size {cosigned.tree_size}; the log's newest "
        f"checkpoint is {newest.tree_size} (the witness is behind: the checkpointer's next submission "
        "catches it up)"
    ) in out
    # The next checkpoint run catches it up; then it is at the log's size.
    log.checkpoint()
    ok, out = _verify_audit()
    assert ok and "1 witness(es) asked for their size, 1 at the log's: ok" in out, out


def test_a_witness_ahead_because_a_checkpoint_was_signed_meanwhile_is_a_note(witness, settings):
    # The race with the checkpointer (a checkpoint signed while verify_audit read the log), judged alone.
    w, _ = witness
    [configured] = witnesses.configured()
    answers = [witnesses.WitnessSize(configured, 9)]
    assert witnesses.size_findings(answers, 6, {9}, None) == (
        [],
        [
            "witness witness.test/w1 has cosigned tree size 9; the log's newest checkpoint is 6, and a "
            "checkpoint of that size was signed meanwhile: verify again"
        ],
    )
    assert witnesses.size_findings(answers, 6, set(), _policy(w))[0] == [
        "witness witness.test/w1 has cosigned tree size 9; the log's newest checkpoint is 6 (the log was "
        "rolled back)"
    ]
