"""`manage.py verify_audit` over the whole store: each attack by someone who can write the database is
detected, exits 1 and says what — a whole run deleted, the newest runs deleted, the log truncated, a run
rewritten with a recomputed chain (and its leaf and tree rebuilt), leaves reordered, a forged checkpoint,
a checkpoint signed by an unknown key — and what needs the outside copy (a witness file)."""

import dataclasses
import datetime as dt
import io
import json

import pytest
from django.core.management import CommandError, call_command

from audit.models import Checkpoint, LogHead, LogLeaf, LogNode, ToolInvocation
from audit.transparency import keys, leafdata, log, merkle, note
from core import writeauth
from diagnosis.models import DiagnosisRun
from tests.audit.transparency.support import (
    delete_run,
    finished_runs,
    legacy_checkpoints,
    rebuild_tree,
    rehash_chain,
    rewrite_tool_output,
)
from tests.factories import REASONING_MARKER

pytestmark = pytest.mark.django_db


def _verify(*args):
    out = io.StringIO()
    try:
        call_command("verify_audit", *args, stdout=out)
    except CommandError as exc:
        assert REASONING_MARKER not in out.getvalue()
        return False, out.getvalue(), str(exc)
    return True, out.getvalue(), ""


@pytest.fixture
def anchored(user, signing_key):
    """Six finished runs, anchored by two checkpoints (sizes 3 and 6), then the governance chain migrate
    wrote (the role groups' grants: leaf 6, checkpoint 7)."""
    runs = finished_runs(user, 6, tools=1)
    assert [cp.tree_size for cp in log.checkpoint(batch_size=3).checkpoints] == [3, 6, 7]
    return runs


def test_a_clean_store_verifies_and_one_run_proves_its_inclusion(anchored, user):
    finished_runs(user, 1)  # finished after the newest checkpoint: counted, not a failure
    ok, out, _ = _verify()
    assert ok, out
    assert "verified 7 run(s): 7 ok, 0 with problems" in out
    assert "1 finished run(s) not yet anchored" in out
    assert "verified the log: 7 leaf(s), 3 checkpoint(s), newest checkpoint 7 signed" in out and out.endswith(
        ": ok\n"
    )
    ok, out, _ = _verify("--run", anchored[4].run_id)
    assert ok, out
    assert f"run={anchored[4].run_id} anchored at log leaf 4; inclusion in checkpoint tree_size=7" in out
    assert "verified\n" in out


def test_a_whole_run_deleted_is_named(anchored):
    delete_run(anchored[1].run_id)
    ok, out, error = _verify()
    assert not ok and "the transparency log has 1 problem(s)" in error
    assert f"log INVALID anchored run {anchored[1].run_id} (leaf 1) is missing from the store" in out
    ok, out, _ = _verify("--run", anchored[1].run_id)  # the leaf still proves it was there
    assert "anchored at log leaf 1" in out


def test_the_newest_runs_deleted_are_named(anchored):
    for run in anchored[-2:]:
        delete_run(run.run_id)
    ok, out, _ = _verify()
    assert not ok
    assert f"anchored run {anchored[4].run_id} (leaf 4) is missing from the store" in out
    assert f"anchored run {anchored[5].run_id} (leaf 5) is missing from the store" in out


def test_a_truncated_log_is_detected(anchored):
    LogLeaf.objects.filter(leaf_index__gte=4).delete()
    ok, out, _ = _verify()
    assert not ok
    assert (
        "log INVALID checkpoint tree_size=6: covers 6 leaves but only 4 are stored (the log was truncated)"
        in out
    )
    assert "log INVALID log head says 7 leaves, 4 are stored" in out


def test_runs_log_and_checkpoints_cut_back_together_need_the_witness(anchored, settings, tmp_path):
    """Deleting the newest runs with their leaves, nodes and checkpoint leaves a consistent older log:
    only a copy of a checkpoint kept outside the database reveals it."""
    witness = tmp_path / "witness.jsonl"
    witness.write_text(
        "".join(log.witness_line(cp) + "\n" for cp in Checkpoint.objects.order_by("tree_size")),
        encoding="utf-8",
    )
    for run in anchored[3:]:
        delete_run(run.run_id)
    LogLeaf.objects.filter(leaf_index__gte=3).delete()
    Checkpoint.objects.filter(tree_size__gt=3).delete()
    rebuild_tree()
    assert _verify()[0] is True  # consistent in itself: the limit of a log without an outside copy
    ok, out, _ = _verify("--witness", str(witness))
    assert not ok
    assert (
        "log INVALID witness line 2: checkpoint tree_size=6 (signed " in out
        and "missing from the database" in out
    )
    assert "witnessed tree_size=6: covers 6 leaves but only 3 are stored (the log was truncated)" in out
    settings.AUDIT_WITNESS_PATH = str(witness)  # the configured witness file is read by default
    assert _verify()[0] is False


def test_a_run_rewritten_with_a_recomputed_chain_is_detected(anchored):
    run = anchored[2]
    sequence = rewrite_tool_output(run, preview="a different tool result")
    assert _verify("--run", anchored[0].run_id)[0] is True
    ok, out, _ = _verify("--run", run.run_id)
    assert not ok
    # The run's rows verify (the attacker recomputed them); the rewritten links carry tags the attacker
    # could not make, and the anchor differs.
    lines = [line for line in out.splitlines() if "INVALID" in line]
    assert lines == [
        f"run={run.run_id} INVALID sequences {sequence}–{_last_sequence(run)}: tag by write key "
        f"{writeauth.verifier().current.key_id} does not verify (not written by the service)",
        f"run={run.run_id} INVALID anchored in log leaf 2: the chain head at sequence "
        f"{_last_sequence(run)} differs from the anchored one (the run was rewritten)",
    ], out
    assert sequence < _last_sequence(run)

    # The attacker also rewrites the leaf and rebuilds the tree: the signed roots no longer match.
    leaf = LogLeaf.objects.get(run_id=run.run_id)
    fields = leafdata.decode(leaf.data)
    fields["chainHead"] = _head(run)
    data = leafdata.encode(fields)
    LogLeaf.objects.filter(pk=leaf.pk).update(data=data.decode(), leaf_hash=merkle.leaf_hash(data).hex())
    rebuild_tree()
    ok, out, _ = _verify()
    assert not ok
    # The run agrees with its (forged) leaf; its links still carry no valid tag.
    assert f"run={run.run_id} INVALID anchored" not in out
    assert f"run={run.run_id} INVALID sequences {sequence}–" in out
    assert "log INVALID checkpoint tree_size=3: root does not match the first 3 stored leaves" in out
    assert "log INVALID checkpoint tree_size=6: root does not match the first 6 stored leaves" in out


def _last_sequence(run):
    return run.events.order_by("-sequence_no").values_list("sequence_no", flat=True).first()


def _head(run):
    return run.events.order_by("-sequence_no").values_list("hash", flat=True).first()


def test_a_changed_leaf_is_named_with_the_nodes_above_it(anchored):
    leaf = LogLeaf.objects.get(leaf_index=4)
    LogLeaf.objects.filter(pk=leaf.pk).update(leaf_hash="0" * 64)
    ok, out, _ = _verify()
    assert not ok
    assert f"log INVALID log leaf 4 (run {leaf.run_id}): leaf hash does not match its data" in out
    assert "log INVALID log node level 1 index 2 (leaves 4–5) does not match its leaves" in out


def test_reordered_leaves_are_detected(anchored):
    a, b = LogLeaf.objects.get(leaf_index=1), LogLeaf.objects.get(leaf_index=4)
    LogLeaf.objects.filter(pk=a.pk).update(leaf_index=-1)
    LogLeaf.objects.filter(pk=b.pk).update(leaf_index=1)
    LogLeaf.objects.filter(pk=a.pk).update(leaf_index=4)
    ok, out, _ = _verify()
    assert not ok
    assert "log INVALID log node level 1 index 0 (leaves 0–1) does not match its leaves" in out
    assert "log INVALID checkpoint tree_size=6: root does not match the first 6 stored leaves" in out
    rebuild_tree()  # the nodes rebuilt for the new order: the signatures still tell
    ok, out, _ = _verify()
    assert not ok and "checkpoint tree_size=3: root does not match the first 3 stored leaves" in out


def test_old_format_checkpoints_still_verify_and_the_next_one_is_a_signed_note(anchored, user):
    legacy_checkpoints()
    assert all(note.is_legacy(cp.body) for cp in Checkpoint.objects.all())
    assert _verify()[0] is True
    finished_runs(user, 1)
    new = log.checkpoint().newest
    older = Checkpoint.objects.filter(tree_size__lt=new.tree_size).order_by("-tree_size").first()
    assert not note.is_legacy(new.body) and new.previous_hash == older.checkpoint_hash
    assert note.parse_note_body(new.body, new.link).previous == older.checkpoint_hash
    ok, out, _ = _verify()
    assert ok, out


@pytest.mark.parametrize("legacy", [False, True], ids=["note", "json"])
def test_a_forged_checkpoint_is_detected(anchored, legacy):
    if legacy:
        legacy_checkpoints()
    cp = Checkpoint.objects.get(tree_size=6)
    if legacy:
        body = json.loads(cp.body)
        body["rootHash"] = "ab" * 32
        forged = note.canonical(body)
    else:
        body = note.parse_note_body(cp.body, cp.link)
        forged = note.NoteBody(body.origin, 6, "ab" * 32, "", "", extended=False).text()
    Checkpoint.objects.filter(pk=cp.pk).update(body=forged, root_hash="ab" * 32)
    ok, out, _ = _verify()
    assert not ok
    if legacy:
        assert "log INVALID checkpoint tree_size=6: checkpoint signature does not verify" in out
        assert "log INVALID checkpoint tree_size=6: stored hash is not the hash of its body" in out
    else:  # its signed link names the body it was signed with
        assert "log INVALID checkpoint tree_size=6: checkpoint link names another checkpoint" in out
    assert "log INVALID checkpoint tree_size=6: root does not match the first 6 stored leaves" in out


def test_a_forged_link_is_detected(anchored):
    """The signed time and predecessor of a plain checkpoint live in its link: a database writer who
    moves the time (in the link and the column alike) or renames the predecessor breaks its signature."""
    cp = Checkpoint.objects.get(tree_size=6)
    link = note.parse_link(cp.link)
    moved = dataclasses.replace(link, signed_at="2001-01-01T00:00:00.000000Z").text()
    Checkpoint.objects.filter(pk=cp.pk).update(
        link=moved, signed_at=dt.datetime(2001, 1, 1, tzinfo=dt.UTC), checkpoint_hash=note.body_hash(moved)
    )
    ok, out, _ = _verify()
    assert not ok
    assert "log INVALID checkpoint tree_size=6: checkpoint link signature does not verify" in out


def test_a_checkpoint_signed_by_an_unknown_key_is_detected(anchored, settings):
    stranger = note.load_private(keys.generate_key_text())
    cp = Checkpoint.objects.get(tree_size=6)
    body = note.parse_note_body(cp.body, cp.link)
    Checkpoint.objects.filter(pk=cp.pk).update(
        key_id=note.note_key_id(body.origin, stranger.public_key()),
        signature=note.sign_note(body, stranger),
        link_signature=note.sign_note(body, stranger, cp.link),
    )
    ok, out, _ = _verify()
    assert not ok
    stranger_id = note.note_key_id(body.origin, stranger.public_key())
    assert f"log INVALID checkpoint tree_size=6: signed by unknown key {stranger_id}" in out
    settings.AUDIT_VERIFY_KEYS = [note.public_text(stranger.public_key())]
    assert _verify()[0] is True


def test_an_old_format_checkpoint_signed_by_an_unknown_key_is_detected(anchored, settings):
    legacy_checkpoints()
    stranger = note.load_private(keys.generate_key_text())
    cp = Checkpoint.objects.order_by("-tree_size").first()  # the newest: no later one names its hash
    body = note.parse_body(cp.body)
    other = note.Body(
        origin=body.origin,
        tree_size=cp.tree_size,
        root_hash=body.root_hash,
        signed_at=body.signed_at,
        previous=body.previous,
        key_id=note.key_id(stranger.public_key()),
    )
    text = other.text()
    Checkpoint.objects.filter(pk=cp.pk).update(
        body=text,
        key_id=other.key_id,
        signature=note.sign(text, stranger),
        checkpoint_hash=note.body_hash(text),
    )
    ok, out, _ = _verify()
    assert not ok
    assert f"log INVALID checkpoint tree_size={cp.tree_size}: signed by unknown key {other.key_id}" in out
    # Once the operator adds its public key as a verification key, it verifies.
    settings.AUDIT_VERIFY_KEYS = [note.public_text(stranger.public_key())]
    assert _verify()[0] is True


def test_unsigned_leaves_a_changed_status_and_events_after_the_anchor_are_named(anchored, user):
    extra = finished_runs(user, 1)[0]
    with_leaf = LogLeaf.objects.get(leaf_index=5)
    LogLeaf.objects.create(
        leaf_index=7,
        run_id=extra.run_id,
        session_id=extra.session_id,
        leaf_hash=merkle.leaf_hash(b"x").hex(),
        data="x",
        appended_at=with_leaf.appended_at,
    )
    DiagnosisRun.objects.filter(run_id=anchored[0].run_id).update(status="RUNNING")
    ok, out, _ = _verify()
    assert not ok
    assert "log INVALID log leaves 7–7 are not covered by a signed checkpoint" in out
    assert (
        f"run={anchored[0].run_id} INVALID anchored in log leaf 0 as finished, "
        "but the run is stored as RUNNING" in out
    )


def test_a_node_deleted_is_named(anchored):
    LogNode.objects.filter(level=2, node_index=0).delete()
    ok, out, _ = _verify()
    assert not ok and "log INVALID log node level 2 index 0 (leaves 0–3) missing" in out
    ok, out, _ = _verify("--run", anchored[4].run_id)  # its proof needs the subtree of leaves 0–3
    assert not ok and "log node level 2 index 0 (leaves 0–3) is not stored" in out


def test_a_chain_rehashed_without_a_change_still_verifies(anchored):
    rehash_chain(anchored[0].run_id)
    assert _verify()[0] is True
    assert ToolInvocation.objects.filter(run_id=anchored[0].run_id).exists()
    assert LogHead.objects.get(pk=1).tree_size == 7


def test_a_store_signed_with_extension_lines_keeps_verifying_and_its_successor_is_plain(
    user, signing_key, settings, tmp_path
):
    """Issue 50: checkpoints signed with `signed-at`/`previous` extension lines (issues 35 to 49, and the
    setting that keeps them) verify as signed, in the database, the witness file and a bundle (also with
    `python -m audit.verify_bundle`); the next checkpoint is plain and its signed link names the last
    extended one, so the chain crosses the formats; a moved time in an extended one is still caught."""
    from audit.transparency.evidence import build_bundle
    from audit.verify.offline import main as verify_bundle

    settings.AUDIT_WITNESS_PATH = str(tmp_path / "witness.jsonl")
    settings.AUDIT_CHECKPOINT_EXTENSION_LINES = True
    first = finished_runs(user, 2)[0]
    extended = log.checkpoint().newest
    assert "\nsigned-at " in extended.body and not extended.link
    extended_bundle = build_bundle(run=first)
    settings.AUDIT_CHECKPOINT_EXTENSION_LINES = False
    finished_runs(user, 1)
    plain = log.checkpoint().newest
    assert plain.body.count("\n") == 3 and plain.previous_hash == extended.checkpoint_hash
    assert note.parse_link(plain.link).previous == extended.checkpoint_hash
    ok, out, _ = _verify("--witness", settings.AUDIT_WITNESS_PATH)
    assert ok, out
    path = tmp_path / "extended.json"
    path.write_text(json.dumps(extended_bundle))
    assert set(extended_bundle["anchor"]["checkpoint"]) == {"note"}
    assert verify_bundle([str(path), "--public-key", keys.current_key().public_text]) == 0

    body = note.parse_note_body(extended.body)
    moved = dataclasses.replace(body, signed_at="2001-01-01T00:00:00.000000Z").text()
    Checkpoint.objects.filter(pk=extended.pk).update(
        body=moved, signed_at=dt.datetime(2001, 1, 1, tzinfo=dt.UTC), checkpoint_hash=note.body_hash(moved)
    )
    ok, out, _ = _verify()
    assert not ok
    assert f"checkpoint tree_size={extended.tree_size}: checkpoint signature does not verify" in out
