"""The verifier trusts only what was signed (issue: "Verification that trusts only what was signed").

Each test is an attack by someone who can write the database but holds no signing key, using the
project's own functions to re-hash what they changed; each must end with `verify_audit` failing and
naming the row. Index columns of the log (`audit_log_leaf.run_id`, `tail_of`, `governance_sequence_no`),
the hold table and tombstones are attacker-writeable: what is anchored, held or purged comes from the
signed leaves and the chained events.
"""

from __future__ import annotations

import io
import json

import pytest
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command

from audit.models import (
    Checkpoint,
    EventType,
    GovernanceEvent,
    GovernanceEventType,
    LegalHold,
    LogLeaf,
    RunReview,
    RunTombstone,
    TailPending,
    TraceEvent,
)
from audit.transparency import leafdata, log
from audit.verify import row_digests
from audit.write.retention import place_hold, purge_expired_runs
from audit.write.reviews import record_review
from core import writeauth
from diagnosis.models import DiagnosisRun
from tests.audit.transparency.support import delete_run, rebuild_tree, rehash_chain
from tests.audit.transparency.test_governance_anchor import rehash_governance
from tests.factories import make_recorded_run

pytestmark = pytest.mark.django_db


def _verify(*args: str) -> tuple[bool, str]:
    out = io.StringIO()
    try:
        call_command("verify_audit", *args, stdout=out)
    except CommandError:
        return False, out.getvalue()
    return True, out.getvalue()


def _rewrite_content(run: DiagnosisRun, content: str) -> None:
    """Rewrite the released content, its digest in RUN_FINISHED, and re-hash the chain."""
    DiagnosisRun.objects.filter(pk=run.pk).update(content=content)
    finished = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.RUN_FINISHED)
    stored = DiagnosisRun.objects.get(pk=run.pk)
    details = dict(finished.details)
    form = row_digests.run_form(details.get("runForm"))
    details["runDigest"] = form.digest_of(stored)
    TraceEvent.objects.filter(pk=finished.pk).update(details=details)
    rehash_chain(run.run_id, start=finished.sequence_no)


def flip_review(review: RunReview, *, verdict: str) -> None:
    """Change a review's verdict in its row, its event's details and digest, and re-hash the chain from
    there with the project's own functions: every per-run check passes afterwards."""
    RunReview.objects.filter(pk=review.pk).update(verdict=verdict)
    review.refresh_from_db()
    event = TraceEvent.objects.get(run_id=review.run_id, event_type=EventType.REVIEW_RECORDED)
    digest = row_digests.form_of(RunReview).digest_of(review)
    details = dict(event.details, verdict=verdict, reviewDigest=digest)
    TraceEvent.objects.filter(pk=event.pk).update(details=details, status=verdict.upper())
    rehash_chain(review.run_id, start=event.sequence_no)


@pytest.fixture
def keeper(django_user_model):
    user = django_user_model.objects.create_user("keeper", password="pw-keeper-1", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="place_legal_hold"))
    return django_user_model.objects.get(pk=user.pk)


def test_a_rewrite_after_clearing_the_leafs_run_column_is_detected_even_after_the_next_checkpoint(
    user, signing_key
):
    run = make_recorded_run(user)
    log.checkpoint()
    assert _verify()[0]
    leaf = LogLeaf.objects.get(run_id=run.run_id)
    LogLeaf.objects.filter(pk=leaf.pk).update(run_id=None)
    _rewrite_content(run, "rm -rf / fixes it")
    log.checkpoint()  # the checkpointer, reading the index, anchors the rewrite as a new leaf

    ok, out = _verify()
    assert not ok
    assert f"log leaf {leaf.leaf_index}: its index column(s) run_id differ from its signed data" in out
    ok, out = _verify("--run", run.run_id)
    assert not ok
    assert f"anchored in log leaf {leaf.leaf_index}" in out and "the run was rewritten" in out


def test_a_deleted_run_whose_leaf_column_was_cleared_is_missing(user, signing_key):
    run = make_recorded_run(user)
    log.checkpoint()
    leaf = LogLeaf.objects.get(run_id=run.run_id)
    LogLeaf.objects.filter(pk=leaf.pk).update(run_id=None)
    delete_run(run.run_id)
    ok, out = _verify()
    assert not ok
    assert f"anchored run {run.run_id} (leaf {leaf.leaf_index}) is missing from the store" in out


def test_a_governance_grant_deleted_renumbered_and_rehashed_with_cleared_columns_is_detected(
    user, superuser, signing_key
):
    for _ in range(3):
        user.is_staff = not user.is_staff
        user.save()
    log.checkpoint()
    assert _verify()[0]
    victim = GovernanceEvent.objects.order_by("sequence_no").first()
    victim.delete()
    for event in GovernanceEvent.objects.order_by("sequence_no"):
        GovernanceEvent.objects.filter(pk=event.pk).update(sequence_no=event.sequence_no - 1)
    first = GovernanceEvent.objects.order_by("sequence_no").first()
    GovernanceEvent.objects.filter(pk=first.pk).update(prev_hash="0" * 64)
    rehash_governance(start=1)
    LogLeaf.objects.filter(governance_sequence_no__isnull=False).update(governance_sequence_no=None)

    ok, out = _verify()
    assert not ok
    assert "governance_sequence_no differ from its signed data" in out
    assert "the chain was rewritten after it was anchored" in out or "missing from the chain" in out


def test_a_review_appended_after_the_anchor_is_anchored_by_the_next_checkpoint(user, superuser, signing_key):
    run = make_recorded_run(user)
    log.checkpoint()
    record_review(run=run, user=superuser, verdict="unsafe", note="suggests a destructive command")
    assert TailPending.objects.filter(run_id=run.run_id).exists()
    ok, out = _verify()
    assert ok, out
    assert "appended after the newest anchored head" in out

    result = log.checkpoint()
    assert result.tails == 1 and not TailPending.objects.filter(run_id=run.run_id).exists()
    tail = LogLeaf.objects.get(tail_of=run.run_id)
    fields = leafdata.decode_any(tail.data)
    head = TraceEvent.objects.filter(run_id=run.run_id).order_by("-sequence_no").first()
    assert fields == {
        "kind": "runTail",
        "runId": run.run_id,
        "sessionId": run.session_id,
        "chainHead": head.hash,
        "lastSequenceNo": head.sequence_no,
        "writeKeyId": writeauth.key_id_of_tag(head.tag),  # the key whose tag on the head was verified
    }
    ok, out = _verify()
    assert ok, out
    assert "appended after the newest anchored head" not in out
    assert log.checkpoint().tails == 0  # nothing grew: no new tail leaf


def test_a_review_flipped_after_its_tail_was_anchored_is_detected(user, superuser, signing_key):
    run = make_recorded_run(user)
    log.checkpoint()
    review = record_review(run=run, user=superuser, verdict="unsafe", note="destructive")
    log.checkpoint()
    assert _verify()[0]

    # Row, event details, digest and hash rewritten with the project's own functions.
    flip_review(review, verdict="correct")

    ok, out = _verify()
    assert not ok
    tail = LogLeaf.objects.get(tail_of=run.run_id)
    assert f"run={run.run_id} INVALID anchored in log leaf {tail.leaf_index} (a tail)" in out
    assert "the run's record was rewritten after it was anchored" in out


def test_a_tail_leaf_whose_column_was_cleared_is_still_held_against_the_run(user, superuser, signing_key):
    run = make_recorded_run(user)
    log.checkpoint()
    record_review(run=run, user=superuser, verdict="incorrect")
    log.checkpoint()
    tail = LogLeaf.objects.get(tail_of=run.run_id)
    LogLeaf.objects.filter(pk=tail.pk).update(tail_of=None)
    event = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.REVIEW_RECORDED)
    TraceEvent.objects.filter(pk=event.pk).delete()  # the review removed from the chain's end
    RunReview.objects.filter(run_id=run.run_id).delete()

    ok, out = _verify()
    assert not ok and f"log leaf {tail.leaf_index}: its index column(s) tail_of differ" in out
    ok, out = _verify("--run", run.run_id)
    assert not ok and f"anchored in log leaf {tail.leaf_index} (a tail)" in out


def test_a_deleted_hold_row_neither_releases_the_run_nor_hides_a_purge(
    user, keeper, signing_key, monkeypatch
):
    import datetime as dt

    from django.utils import timezone

    run = make_recorded_run(user)
    hold = place_hold(user=keeper, scope="RUN", target_id=run.run_id, reason="litigation 42")
    log.checkpoint()
    LegalHold.objects.filter(pk=hold.pk).delete()
    ok, out = _verify()
    assert not ok and f"legal hold {hold.pk} (governance event" in out and "row is missing" in out

    then = timezone.now() + dt.timedelta(days=200)
    monkeypatch.setattr(timezone, "now", lambda: then)
    assert purge_expired_runs().purged == []  # the chain still holds it
    assert DiagnosisRun.objects.filter(run_id=run.run_id).exists()

    # The attacker purges it by hand and forges the tombstone the purge would have written.
    leaf = LogLeaf.objects.get(run_id=run.run_id)
    delete_run(run.run_id)
    RunTombstone.objects.create(
        run_id=run.run_id,
        session_id=run.session_id,
        leaf_index=leaf.leaf_index,
        finished_at=json.loads(leaf.data)["finishedAt"],
        purged_at=then,
        retention_days=183,
        reason="retention",
        purged_by="purge_audit",
    )
    ok, out = _verify()
    assert not ok
    assert (
        f"tombstone of run {run.run_id}: no chained retention purge (AUDIT_RUNS_PURGED) names the run" in out
    )
    assert f"purged while legal hold {hold.pk} covered it" in out


def test_a_purge_by_retention_is_judged_by_its_chained_event(user, signing_key, monkeypatch):
    import datetime as dt

    from django.utils import timezone

    run = make_recorded_run(user)
    log.checkpoint()
    then = timezone.now() + dt.timedelta(days=200)
    monkeypatch.setattr(timezone, "now", lambda: then)
    assert purge_expired_runs().purged == [run.run_id]
    assert GovernanceEvent.objects.filter(event_type=GovernanceEventType.AUDIT_RUNS_PURGED).exists()
    assert _verify()[0]
    # Moving the tombstone's time does not move the purge.
    RunTombstone.objects.filter(run_id=run.run_id).update(purged_at=then - dt.timedelta(days=100))
    ok, out = _verify()
    assert not ok and "its purge time differs from the chained purge" in out


def test_a_checkpoints_signed_at_column_must_equal_its_signed_body(user, signing_key):
    import datetime as dt

    make_recorded_run(user)
    cp = log.checkpoint().newest
    Checkpoint.objects.filter(pk=cp.pk).update(signed_at=cp.signed_at - dt.timedelta(days=30))
    ok, out = _verify()
    assert (
        not ok and f"checkpoint tree_size={cp.tree_size}: stored columns differ from its signed body" in out
    )


def test_a_configured_witness_file_that_cannot_be_read_is_a_problem(user, signing_key, settings, tmp_path):
    settings.AUDIT_WITNESS_PATH = str(tmp_path / "witness.jsonl")
    make_recorded_run(user)
    log.checkpoint()
    assert _verify()[0]
    (tmp_path / "witness.jsonl").unlink()
    ok, out = _verify()
    assert not ok
    assert "the configured witness file (AUDIT_WITNESS_PATH) cannot be read: FileNotFoundError" in out


def test_a_leaf_rewritten_with_a_rebuilt_tree_is_caught_by_the_signed_roots(user, signing_key):
    run = make_recorded_run(user)
    log.checkpoint()
    leaf = LogLeaf.objects.get(run_id=run.run_id)
    _rewrite_content(run, "forged")
    fields = leafdata.decode(leaf.data)
    head = TraceEvent.objects.filter(run_id=run.run_id).order_by("-sequence_no").first()
    fields["chainHead"] = head.hash
    data = leafdata.encode(fields)
    from audit.transparency import merkle

    LogLeaf.objects.filter(pk=leaf.pk).update(data=data.decode(), leaf_hash=merkle.leaf_hash(data).hex())
    rebuild_tree()
    ok, out = _verify()
    assert not ok and "root does not match" in out


def test_a_deleted_tail_note_is_named_not_left_as_pending_for_ever(user, superuser, signing_key):
    run = make_recorded_run(user)
    log.checkpoint()
    record_review(run=run, user=superuser, verdict="needs_follow_up")
    TailPending.objects.filter(run_id=run.run_id).delete()
    ok, out = _verify()
    assert not ok
    assert f"run={run.run_id} INVALID 1 event(s) appended after the newest anchored head" in out
    assert "have no tail note" in out


def test_a_bundle_proves_the_tail_and_fails_when_the_review_was_flipped(user, superuser, signing_key):
    from audit.transparency import bundle, keys
    from audit.transparency.evidence import build_bundle

    public = [keys.current_key().private.public_key()]
    run = make_recorded_run(user)
    log.checkpoint()
    review = record_review(run=run, user=superuser, verdict="unsafe")
    pending = bundle.verify(build_bundle(run=run), public)
    assert pending.ok, pending.failures
    assert any("appended after the newest anchored head" in n for n in pending.notes)

    log.checkpoint()
    built = build_bundle(run=run)
    assert len(built["tails"]) == 1
    report = bundle.verify(json.loads(json.dumps(built)), public)
    assert report.ok, report.failures
    assert any(p.startswith("tails: 1 later head(s) anchored") for p in report.passed)

    flip_review(review, verdict="correct")
    report = bundle.verify(build_bundle(run=run), public)
    assert not report.ok
    assert any(f.startswith("tails[0].leafData: differs from the chain") for f in report.failures)


def test_the_purge_decides_by_the_signed_leaf_not_the_runs_mutable_columns(user, keeper, signing_key):
    import datetime as dt

    from django.utils import timezone

    backdated, moved = make_recorded_run(user), make_recorded_run(user)
    place_hold(user=keeper, scope="SESSION", target_id=moved.session_id, reason="regulator request")
    log.checkpoint()
    long_ago = timezone.now() - dt.timedelta(days=400)
    DiagnosisRun.objects.filter(pk=backdated.pk).update(finished_at=long_ago, created_at=long_ago)
    # Out of its session's hold by its column, and backdated too.
    DiagnosisRun.objects.filter(pk=moved.pk).update(
        session_id=backdated.session_id, finished_at=long_ago, created_at=long_ago
    )
    report = purge_expired_runs()
    assert report.purged == []
    assert DiagnosisRun.objects.filter(run_id__in=[backdated.run_id, moved.run_id]).count() == 2


def test_the_trace_holds_the_run_to_its_tail_anchor(user, superuser, signing_key):
    from audit.read import get_trace

    run = make_recorded_run(user)
    log.checkpoint()
    review = record_review(run=run, user=superuser, verdict="unsafe")
    log.checkpoint()
    run = DiagnosisRun.objects.get(pk=run.pk)
    before = get_trace(run=run)
    assert before.summary.audit_complete, before.summary.gaps
    flip_review(review, verdict="correct")
    after = get_trace(run=run)
    assert not after.summary.audit_complete
    assert any("(a tail)" in gap and "rewritten after it was anchored" in gap for gap in after.summary.gaps)
