"""The transparency log: finished runs appended in one gapless order by one writer at a time, checkpoints
signed with the configured key and chained, proofs from the stored tree, the witness file, keys and
their system checks, and the server's periodic checkpointer."""

import asyncio
import datetime as dt
import io
import itertools
import json
import time

import pytest
from django.core.management import call_command
from django.db import transaction
from django.utils import timezone

from audit.models import (
    Checkpoint,
    GovernanceEvent,
    GovernanceEventType,
    LogHead,
    LogLeaf,
    LogNode,
    TraceEvent,
)
from audit.transparency import keys, leafdata, log, merkle, note, store
from audit.transparency.checks import check_signing_keys
from audit.write import RunRecorder
from core import writeauth
from diagnosis import services
from diagnosis.models import DiagnosisRun
from tests.audit.transparency.support import finished_runs, manage

pytestmark = pytest.mark.django_db


def _leaves():
    return list(LogLeaf.objects.order_by("leaf_index"))


def _verify_checkpoint(cp, public):
    body = note.parse_note_body(cp.body, cp.link)
    note.verify_checkpoint(cp.body, body, cp.signature, public, cp.link_signature)
    assert (body.tree_size, body.root_hash, body.previous) == (cp.tree_size, cp.root_hash, cp.previous_hash)
    # Witness-ready (issue 50): a plain C2SP checkpoint, its time and predecessor in its signed link.
    assert not body.extended and cp.body.count("\n") == 3
    assert note.body_hash(cp.link) == cp.checkpoint_hash
    return body


def test_finished_runs_are_appended_in_finish_order_and_signed(user, signing_key):
    first, second = finished_runs(user, 2)
    running = services.create_run(session=first.session, query="still running")
    RunRecorder.for_run(running).run_started()

    result = log.checkpoint()
    # The runs, then the governance chain migrate wrote (the role groups' grants): one leaf more.
    assert result.appended == 2 and result.tree_size == 3 and len(result.checkpoints) == 1
    leaves = _leaves()
    assert [leaf.run_id for leaf in leaves] == [first.run_id, second.run_id, None]
    assert [leaf.leaf_index for leaf in leaves] == [0, 1, 2]
    for leaf, run in zip(leaves, (first, second), strict=False):
        events = list(TraceEvent.objects.filter(run_id=run.run_id).order_by("sequence_no"))
        fields = leafdata.run_leaf(run_id=run.run_id, session_id=run.session_id, events=events)
        # The leaf names the write key whose tag on the head the checkpointer verified.
        fields[leafdata.WRITE_KEY_ID] = writeauth.verifier().current.key_id
        assert writeauth.key_id_of_tag(events[-1].tag) == fields[leafdata.WRITE_KEY_ID]
        assert leaf.data == leafdata.encode(fields).decode()
        assert fields["chainHead"] == events[-1].hash and fields["lastSequenceNo"] == events[-1].sequence_no
        assert fields["runDigest"] == events[-1].details["runDigest"]
        assert leaf.leaf_hash == merkle.leaf_hash(leaf.data.encode()).hex()

    cp = result.newest
    public = keys.current_key().public
    body = _verify_checkpoint(cp, public)
    assert cp.key_id == note.note_key_id(body.origin, public) and body.previous == ""
    assert cp.root_hash == merkle.mth([bytes.fromhex(leaf.leaf_hash) for leaf in leaves]).hex()
    head = LogHead.objects.get(pk=1)
    assert (head.tree_size, head.root_hash) == (3, cp.root_hash)

    # Nothing waiting: nothing signed. The running run joins once it finished.
    assert log.checkpoint().checkpoints == []
    RunRecorder.resume(running.run_id).finish(status="FAILED", error_code="X")
    later = log.checkpoint().newest
    assert later.tree_size == 4 and later.previous_hash == cp.checkpoint_hash
    _verify_checkpoint(later, public)
    assert _leaves()[-1].run_id == running.run_id


def test_batches_sign_consecutive_checkpoints_that_are_consistent(user, signing_key):
    finished_runs(user, 5)
    result = log.checkpoint(batch_size=2)
    assert [cp.tree_size for cp in result.checkpoints] == [2, 4, 6]  # the last with the governance head
    for older, newer in itertools.pairwise(result.checkpoints):
        assert newer.previous_hash == older.checkpoint_hash
        proof = store.consistency_proof(older.tree_size, newer.tree_size)
        merkle.verify_consistency(
            older.tree_size,
            newer.tree_size,
            bytes.fromhex(older.root_hash),
            bytes.fromhex(newer.root_hash),
            proof.hashes,
        )
    leaves = [bytes.fromhex(leaf.leaf_hash) for leaf in _leaves()]
    for cp in result.checkpoints:
        for index in range(cp.tree_size):
            proof = store.inclusion_proof(index, cp.tree_size)
            merkle.verify_inclusion(
                leaves[index], index, cp.tree_size, proof.hashes, bytes.fromhex(cp.root_hash)
            )
            assert proof.rows_read <= 2 * cp.tree_size.bit_length()
    # Every complete subtree is stored once: 6 leaves make nodes 1/0, 1/1, 1/2 and 2/0.
    assert sorted(LogNode.objects.values_list("level", "node_index")) == [(1, 0), (1, 1), (1, 2), (2, 0)]


def test_the_search_window_moves_forward_and_full_finds_a_run_before_it(user, signing_key):
    old = finished_runs(user, 1)[0]
    open_run = services.create_run(session=old.session, query="open")
    log.checkpoint()
    assert LogHead.objects.get(pk=1).scan_from <= open_run.created_at  # never past a run still open
    assert LogLeaf.objects.filter(run_id=old.run_id).exists()  # the first scan searches everything

    # One UPDATE of the cursor (issue 43): a database writer moves it into the future.
    LogHead.objects.filter(pk=1).update(scan_from=timezone.now() + dt.timedelta(days=365))
    late = finished_runs(user, 1)[0]
    assert log.checkpoint().appended == 0  # the incremental scan trusts the cursor ...
    out = io.StringIO()
    call_command("audit_checkpoint", stdout=out)  # ... the command searches every run by default
    assert "appended 1 run(s); log holds 3" in out.getvalue()  # and the governance leaf migrate's events made
    assert LogLeaf.objects.filter(run_id=late.run_id).exists()


def test_the_periodic_checkpointer_scans_everything_at_start_and_every_nth_call(user, signing_key, settings):
    """The cursor is only an optimisation: the server's checkpointer searches every run at its first
    call and every AUDIT_CHECKPOINT_FULL_SCAN_EVERY calls, so a cursor moved into the future delays a
    run's anchoring by at most that many intervals, whatever the cursor says."""
    settings.AUDIT_CHECKPOINT_FULL_SCAN_EVERY = 3
    log._periodic["calls"] = 0
    log.periodic_checkpoint()  # the first call: a full scan
    LogHead.objects.filter(pk=1).update(scan_from=timezone.now() + dt.timedelta(days=365))
    hidden = finished_runs(user, 1)[0]
    assert log.periodic_checkpoint().appended == 0
    assert log.periodic_checkpoint().appended == 0
    assert log.periodic_checkpoint().appended == 1  # the third call after the first: a full scan again
    assert LogLeaf.objects.filter(run_id=hidden.run_id).exists()


def test_the_server_checkpointer_yields_after_each_run_it_checks(user, signing_key, monkeypatch):
    """In a serving process the checkpointer sleeps `PACE_SECONDS` after each run the gate verifies, so
    that the event loop and the database pool are not held behind its checks; the command does not."""
    finished_runs(user, 3)
    log._periodic["calls"] = 0
    slept = []
    monkeypatch.setattr(log.time, "sleep", slept.append)
    assert log.periodic_checkpoint().appended == 3
    assert slept == [log.PACE_SECONDS] * 3
    finished_runs(user, 2)
    call_command("audit_checkpoint", stdout=io.StringIO())
    assert LogLeaf.objects.filter(run_id__isnull=False).count() == 5 and len(slept) == 3


def test_a_run_without_a_chain_is_never_anchored_and_the_refusal_is_recorded(user, signing_key):
    """Issue 43: a bare finished run row (every event lost, or inserted by a database writer) is
    authenticated by nothing: the checkpointer refuses it, says so once in the governance chain, and
    anchors the rest of the batch."""
    bare = services.create_run(session=services.create_session(owner=user), query="q")
    DiagnosisRun.objects.filter(pk=bare.pk).update(status="FAILED")
    good = finished_runs(user, 1)[0]
    result = log.checkpoint()
    assert result.refused == [bare.run_id] and result.appended == 1
    assert not LogLeaf.objects.filter(run_id=bare.run_id).exists()
    assert LogLeaf.objects.filter(run_id=good.run_id).exists()
    refusals = GovernanceEvent.objects.filter(event_type=GovernanceEventType.ANCHOR_REFUSED)
    assert [e.details["runIds"] for e in refusals] == [[bare.run_id]]
    assert log.checkpoint().refused == [bare.run_id]  # examined again, not recorded again
    assert refusals.count() == 1
    from telemetry.metrics import anchor_refusals

    samples = {s.name: s.value for s in anchor_refusals().samples}
    assert samples["diagnosis_audit_anchor_refusals_total"] == 1.0


@pytest.fixture
def checked(monkeypatch) -> list[str]:
    """The run ids the gate is asked to admit, in order (`gate.admit_runs` counted)."""
    from audit.transparency import gate

    asked: list[str] = []
    admit = gate.admit_runs

    def counted(run_ids, **kwargs):
        asked.extend(run_ids)
        return admit(run_ids, **kwargs)

    monkeypatch.setattr(gate, "admit_runs", counted)
    return asked


def test_the_server_checkpointer_examines_a_refused_run_again_at_its_full_scans_only(
    user, signing_key, settings, monkeypatch, checked
):
    """A run the server's checkpointer refused is verified again at its next full scan, not by every
    call: re-verifying every refused run every interval let a database writer make each server spend
    CPU in proportion to the runs it forged, for good. `manage.py audit_checkpoint` examines it too."""
    settings.AUDIT_CHECKPOINT_FULL_SCAN_EVERY = 3
    bare = services.create_run(session=services.create_session(owner=user), query="q")
    DiagnosisRun.objects.filter(pk=bare.pk).update(status="FAILED")  # no chain: refused
    monkeypatch.setattr(log, "_periodic", {"calls": 0})
    monkeypatch.setattr(log, "_refused", set())
    assert log.periodic_checkpoint().refused == [bare.run_id]  # the first call: a full scan
    good = finished_runs(user, 1)[0]
    assert log.periodic_checkpoint().appended == 1  # incremental: the new run, not the refused one
    assert log.periodic_checkpoint().refused == []
    assert checked.count(bare.run_id) == 1 and checked.count(good.run_id) == 1
    assert log.periodic_checkpoint().refused == [bare.run_id]  # the next full scan
    call_command("audit_checkpoint", stdout=io.StringIO())
    assert checked.count(bare.run_id) == 3
    assert not LogLeaf.objects.filter(run_id=bare.run_id).exists()


def test_a_call_pages_past_the_runs_it_refuses_and_never_names_them_all_in_a_query(
    user, signing_key, checked
):
    """Runs are read a batch at a time after the last one read (finish time, id): a call examines each
    waiting run once, and no query names the runs it refused in earlier batches. An `IN` list of them
    grew with every batch, to every run a database writer forged (a query too large for the server,
    every call). The cursor still stops at the oldest run refused."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    session = services.create_session(owner=user)
    forged = []
    for i in range(5):
        bare = services.create_run(session=session, query=f"forged {i}")
        finished = None if i == 0 else timezone.now() - dt.timedelta(minutes=10 - i)
        DiagnosisRun.objects.filter(pk=bare.pk).update(  # no chain: refused
            status="FAILED", finished_at=finished, created_at=timezone.now() - dt.timedelta(hours=i + 1)
        )
        forged.append(bare.run_id)
    good = finished_runs(user, 2)
    with CaptureQueriesContext(connection) as queries:
        result = log.checkpoint(batch_size=2)
    assert sorted(result.refused) == sorted(forged) and result.appended == 2
    assert sorted(checked) == sorted(forged + [r.run_id for r in good])  # each once, four batches
    # The gate reads each batch's runs; no read names more runs than a batch holds. (The refusal's
    # governance event names every run it refused, once: the record of the refusal.)
    reads = [q["sql"] for q in queries.captured_queries if q["sql"].lstrip().upper().startswith("SELECT")]
    assert max(sum(f in sql for f in forged) for sql in reads) <= 2
    oldest = DiagnosisRun.objects.get(run_id=forged[-1]).created_at  # 5 hours ago
    assert LogHead.objects.get().scan_from == oldest  # pinned at the oldest run refused


def test_each_checkpoint_is_appended_to_the_witness_file(user, signing_key, settings, tmp_path):
    settings.AUDIT_WITNESS_PATH = str(tmp_path / "witness.jsonl")
    finished_runs(user, 3)
    signed = log.checkpoint(batch_size=2).checkpoints
    lines = [json.loads(line) for line in (tmp_path / "witness.jsonl").read_text().splitlines()]
    assert lines == [
        {"body": cp.body, "signature": cp.signature, "link": cp.link, "linkSignature": cp.link_signature}
        for cp in signed
    ]
    settings.AUDIT_WITNESS_PATH = str(tmp_path / "missing-dir" / "witness.jsonl")
    finished_runs(user, 1)
    assert log.checkpoint().newest.tree_size == 5  # a failed witness write is logged, not raised


def test_the_command_reports_what_it_signed(user, signing_key):
    out = io.StringIO()
    call_command("audit_checkpoint", stdout=out)  # the governance chain migrate wrote: anchored first
    assert "appended 0 run(s), the governance chain up to event" in out.getvalue()
    out = io.StringIO()
    call_command("audit_checkpoint", stdout=out)
    assert "no finished run waiting; newest checkpoint tree_size=1" in out.getvalue()
    finished_runs(user, 2)
    out = io.StringIO()
    call_command("audit_checkpoint", stdout=out)
    cp = Checkpoint.objects.order_by("-tree_size").first()
    assert f"checkpoint tree_size=3 root={cp.root_hash} key={cp.key_id}" in out.getvalue()
    assert "appended 2 run(s); log holds 3" in out.getvalue()


# --------------------------------------------------------------------------------------------------
# Keys
# --------------------------------------------------------------------------------------------------
def test_rotation_signs_with_the_newest_key_and_old_keys_still_verify(user, settings, signing_key):
    old = keys.current_key()
    finished_runs(user, 1)
    first = log.checkpoint().newest
    new_text = keys.generate_key_text()
    settings.AUDIT_SIGNING_KEYS = [new_text, signing_key]
    finished_runs(user, 1)
    second = log.checkpoint().newest
    origin = settings.AUDIT_LOG_ORIGIN
    assert second.key_id == note.note_key_id(origin, keys.current_key().public) != first.key_id
    assert set(keys.verification_keys()) == {old.key_id, keys.current_key().key_id}
    # The old private key removed, its public key kept as a verification key.
    settings.AUDIT_SIGNING_KEYS = [new_text]
    settings.AUDIT_VERIFY_KEYS = [note.public_text(old.public)]
    verifying = list(keys.verification_keys().values())
    for cp in (first, second):
        body = note.parse_note_body(cp.body, cp.link)
        signer = note.find_signer(body, cp.signature, verifying)
        note.verify_checkpoint(cp.body, body, cp.signature, signer, cp.link_signature)
        assert note.note_key_id(origin, signer) == cp.key_id
    with pytest.raises(note.NoteError):
        body = note.parse_note_body(first.body, first.link)
        note.verify_checkpoint(first.body, body, first.signature, keys.current_key().public)


def test_the_development_key_is_generated_once_and_reused(settings, tmp_path):
    key_file = tmp_path / ".local" / "audit-signing.key"
    settings.AUDIT_SIGNING_KEYS = []
    settings.AUDIT_DEV_SIGNING_KEY_FILE = key_file
    first = keys.current_key()
    assert key_file.exists() and (key_file.stat().st_mode & 0o777) == 0o600
    keys._dev_key.cache_clear()  # as a new process would
    assert keys.current_key().key_id == first.key_id
    settings.AUDIT_DEV_SIGNING_KEY_FILE = None
    with pytest.raises(keys.SigningKeysMissing):
        keys.current_key()


def test_system_checks_require_valid_keys_when_debug_is_off(settings):
    settings.DEBUG = False
    settings.AUDIT_SIGNING_KEYS = []
    assert [e.id for e in check_signing_keys()] == ["audit.E001"]
    settings.AUDIT_SIGNING_KEYS = [keys.generate_key_text(), "not-a-key"]
    settings.AUDIT_VERIFY_KEYS = ["also-not-a-key"]
    errors = check_signing_keys()
    assert [e.id for e in errors] == ["audit.E002", "audit.E003"]
    assert all("not-a-key" not in e.msg for e in errors)
    settings.AUDIT_SIGNING_KEYS = [keys.generate_key_text()]
    settings.AUDIT_VERIFY_KEYS = [note.public_text(keys.current_key().public)]
    assert check_signing_keys() == []


# --------------------------------------------------------------------------------------------------
# Several writers
# --------------------------------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_two_processes_checkpointing_at_once_make_one_gapless_log(user, signing_key):
    runs = finished_runs(user, 24, tools=0)
    env = {"AUDIT_SIGNING_KEYS": signing_key}
    log.ensure_head()
    # Hold the log's lock while both start, so that they queue on it and then take turns batch by batch.
    with transaction.atomic():
        LogHead.objects.select_for_update().filter(pk=1).update(updated_at=timezone.now())
        procs = [manage("audit_checkpoint", "--batch-size", "3", env=env, popen=True) for _ in range(2)]
        time.sleep(3)
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    leaves = _leaves()
    # After an earlier test's flush, re-creating "Reasoning Auditors" granted it its permission: a
    # governance event, whose head the last checkpoint anchors after the runs (one more leaf, one more
    # checkpoint).
    governance = 1 if GovernanceEvent.objects.exists() else 0
    assert [leaf.leaf_index for leaf in leaves] == list(range(24 + governance))
    assert sorted(leaf.run_id for leaf in leaves if leaf.run_id) == sorted(r.run_id for r in runs)
    checkpoints = list(Checkpoint.objects.order_by("tree_size"))
    assert checkpoints[-1].tree_size == 24 + governance
    assert all(b.previous_hash == a.checkpoint_hash for a, b in itertools.pairwise(checkpoints))
    hashes = [bytes.fromhex(leaf.leaf_hash) for leaf in leaves]
    public = keys.current_key().public
    for cp in checkpoints:
        _verify_checkpoint(cp, public)
        assert cp.root_hash == merkle.mth(hashes[: cp.tree_size]).hex()
    signed = [line for out, _ in outputs for line in out.splitlines() if line.startswith("checkpoint ")]
    assert len(signed) == len(checkpoints) == 8 + governance  # every batch signed once, by one of the two


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_every_server_process_checkpoints_periodically(user, settings, signing_key):
    from asgiref.sync import sync_to_async

    from agent.runtime import supervisor
    from agent.runtime.db import shutdown_pools

    settings.RUN_SWEEP_INTERVAL_SECONDS = 0
    settings.AUDIT_CHECKPOINT_INTERVAL_SECONDS = 0.1
    await sync_to_async(finished_runs)(user, 2)
    supervisor.ensure_background()
    try:
        for _ in range(100):
            await asyncio.sleep(0.05)
            # 2 runs, and a governance leaf if an earlier test's flush wrote a governance event.
            if await Checkpoint.objects.filter(tree_size__in=(2, 3)).aexists():
                break
        assert await LogLeaf.objects.filter(run_id__isnull=False).acount() == 2
        assert len([t for t in asyncio.all_tasks() if t.get_name() == "audit:checkpoint"]) == 1
    finally:
        await supervisor.stop_background()
        shutdown_pools()
