"""Reviews: append-only, chained into the run's timeline, bound by digest, covered by verify_audit; the
review API's statuses and error shape; the reviewer groups and their governance."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied, ValidationError

from audit.models import (
    REVIEW_PERMISSION,
    EventType,
    GovernanceEvent,
    GovernanceEventType,
    RunReview,
    TraceEvent,
)
from audit.read import get_trace
from audit.transparency.log import checkpoint
from audit.verify.hash_chain import verify_chain
from audit.verify.runs import verify_run
from audit.write.reviews import RunNotFinished, record_review
from diagnosis import services
from diagnosis.models import DiagnosisRun
from surfaces.api.audit_serializers import serialize_trace
from surfaces.api.trace_render import trace_data

pytestmark = pytest.mark.django_db


@pytest.fixture
def reviewer(django_user_model):
    user = django_user_model.objects.create_user("reviewer", password="pw-reviewer-1", is_staff=True)
    user.groups.add(Group.objects.get(name="Reviewers"))
    return user


def _url(run):
    return f"/api/diagnosis/{run.session_id}/runs/{run.run_id}/reviews"


def test_both_reviewer_groups_hold_the_permission(reviewer, auditor, staff_user):
    assert reviewer.has_perm(REVIEW_PERMISSION)
    assert auditor.has_perm(REVIEW_PERMISSION)
    assert not staff_user.has_perm(REVIEW_PERMISSION)


def test_a_review_is_a_chained_event_and_a_bound_row(traced_run, reviewer):
    before = TraceEvent.objects.filter(run_id=traced_run.run_id).count()
    review = record_review(run=traced_run, user=reviewer, verdict="correct", note="Checked the runbook.")

    events = list(TraceEvent.objects.filter(run_id=traced_run.run_id).order_by("sequence_no"))
    assert len(events) == before + 1
    last = events[-1]
    assert last.event_type == EventType.REVIEW_RECORDED
    assert last.sequence_no == review.sequence_no
    assert events[-2].event_type == EventType.RUN_FINISHED
    assert last.details["reviewId"] == review.review_id
    assert last.details["verdict"] == "correct"
    assert last.details["reviewer"] == "reviewer"
    assert "Checked" not in str(last.details)  # the note is bound by digest, not copied into the chain
    assert verify_chain(events).valid

    result = verify_run(traced_run.run_id)
    assert result.ok, (result.invalid, result.incomplete, result.facts)
    trace = get_trace(run=DiagnosisRun.objects.get(pk=traced_run.pk))
    assert trace.summary.audit_complete and trace.summary.rows_verified, trace.summary.gaps
    # The run's own counts are unchanged: a review is not something the recorder expected.
    assert trace.summary.expected.events == trace.summary.persisted.events


def test_reviews_are_append_only_and_the_latest_supersedes_in_display(traced_run, reviewer, auditor):
    first = record_review(run=traced_run, user=reviewer, verdict="needs_follow_up", note="Ask the DBA.")
    second = record_review(run=traced_run, user=auditor, verdict="incorrect", note="Wrong runbook.")
    assert RunReview.objects.filter(run_id=traced_run.run_id).count() == 2
    first.refresh_from_db()
    assert (first.verdict, first.note) == ("needs_follow_up", "Ask the DBA.")

    run = DiagnosisRun.objects.get(pk=traced_run.pk)
    assert (run.review_verdict, run.reviewed_at) == ("incorrect", second.created_at)
    body = trace_data(get_trace(run=run))
    assert body == serialize_trace(get_trace(run=run))
    assert [(r["verdict"], r["reviewer"], r["superseded"]) for r in body["reviews"]] == [
        ("needs_follow_up", "reviewer", True),
        ("incorrect", "auditor", False),
    ]
    assert body["reviews"][1]["sequenceNo"] == second.sequence_no


def test_an_edited_review_row_is_detected(traced_run, reviewer):
    review = record_review(run=traced_run, user=reviewer, verdict="unsafe", note="Advises a restart.")
    RunReview.objects.filter(pk=review.pk).update(verdict="correct")

    result = verify_run(traced_run.run_id)
    assert not result.ok
    assert (
        f"review {review.review_id}: stored row does not match its digest at sequence {review.sequence_no}"
        in (result.invalid)
    )
    summary = get_trace(run=DiagnosisRun.objects.get(pk=traced_run.pk)).summary
    assert not summary.audit_complete and not summary.rows_verified


def test_a_deleted_or_inserted_review_row_is_detected(traced_run, reviewer):
    review = record_review(run=traced_run, user=reviewer, verdict="correct")
    RunReview.objects.filter(pk=review.pk).delete()
    assert f"review {review.review_id} missing (recorded at sequence {review.sequence_no})" in (
        verify_run(traced_run.run_id).invalid
    )

    forged = RunReview.objects.create(
        review_id="rev_forged",
        run_id=traced_run.run_id,
        session_id=traced_run.session_id,
        verdict="correct",
        reviewer_username="nobody",
        sequence_no=999,
        created_at=review.created_at,
    )
    assert (
        f"review {forged.review_id}: stored row not recorded in the chain"
        in verify_run(traced_run.run_id).invalid
    )


def test_a_review_after_anchoring_keeps_the_anchor_valid(traced_run, reviewer):
    checkpoint()
    record_review(run=traced_run, user=reviewer, verdict="correct")
    result = verify_run(traced_run.run_id)
    assert result.ok and result.leaf_index is not None, result.invalid


def test_only_finished_runs_and_only_reviewers_and_bounded_notes(traced_run, reviewer, staff_user):
    unfinished = services.create_run(session=traced_run.session, query="still running?")
    with pytest.raises(RunNotFinished):
        record_review(run=unfinished, user=reviewer, verdict="correct")
    with pytest.raises(PermissionDenied):
        record_review(run=traced_run, user=staff_user, verdict="correct")
    with pytest.raises(ValidationError):
        record_review(run=traced_run, user=reviewer, verdict="fine")
    with pytest.raises(ValidationError):
        record_review(run=traced_run, user=reviewer, verdict="correct", note="x" * 2001)
    assert not RunReview.objects.exists()


def test_the_api_records_a_review(api_client, traced_run, reviewer):
    api_client.force_login(reviewer)
    response = api_client.post(_url(traced_run), {"verdict": "correct", "note": "Good."}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["verdict"] == "correct" and body["note"] == "Good." and body["reviewer"] == "reviewer"
    assert body["superseded"] is False
    assert RunReview.objects.get().review_id == body["reviewId"]


def test_the_api_refuses_in_the_contract_shape(
    api_client, traced_run, user, other_user, reviewer, django_user_model
):
    def post(data, run=traced_run):
        return api_client.post(_url(run), data, format="json")

    assert post({"verdict": "correct"}).status_code == 401
    # A reviewer who may not see the run (not staff, not its owner) gets the same 404 as for no run.
    outsider = django_user_model.objects.create_user("outsider", password="pw-out-1")
    outsider.groups.add(Group.objects.get(name="Reviewers"))
    api_client.force_login(outsider)
    missing = api_client.post(
        f"/api/diagnosis/{traced_run.session_id}/runs/run_nope/reviews", {"verdict": "correct"}, format="json"
    )
    hidden = post({"verdict": "correct"})
    assert hidden.status_code == missing.status_code == 404
    assert hidden.json() == missing.json()
    # The owner sees the run but holds no review permission.
    api_client.force_login(user)
    refused = post({"verdict": "correct"})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "permission_denied"
    api_client.force_login(reviewer)
    for bad in ({"verdict": "fine"}, {"verdict": "correct", "note": "x" * 2001}, {}):
        response = post(bad)
        assert response.status_code == 400 and set(response.json()) == {"error"}
    unfinished = services.create_run(session=traced_run.session, query="still running?")
    conflict = post({"verdict": "correct"}, run=unfinished)
    assert conflict.status_code == 409 and conflict.json()["error"]["code"] == "conflict"
    assert not RunReview.objects.exists()


def test_membership_of_reviewers_is_governed(django_user_model):
    person = django_user_model.objects.create_user("newreviewer", password="pw-new-1")
    person.groups.add(Group.objects.get(name="Reviewers"))
    event = GovernanceEvent.objects.order_by("-sequence_no").first()
    assert event.event_type == GovernanceEventType.GROUP_MEMBER_ADDED
    assert (event.subject_user, event.group) == ("newreviewer", "Reviewers")
    assert REVIEW_PERMISSION in event.details["sensitivePermissions"]


def test_the_evidence_bundle_carries_the_review_rows_and_verifies_offline(traced_run, reviewer):
    from audit.transparency import bundle, keys
    from audit.transparency.evidence import build_bundle

    checkpoint()
    review = record_review(run=traced_run, user=reviewer, verdict="needs_follow_up", note="Ask the DBA.")
    public = [keys.current_key().public]
    built = build_bundle(run=DiagnosisRun.objects.get(pk=traced_run.pk))
    assert [r["form"]["row"]["review_id"] for r in built["rows"]["reviews"]] == [review.review_id]
    report = bundle.verify(built, public)
    assert report.ok, report.failures

    built["rows"]["reviews"][0]["form"]["row"]["verdict"] = "correct"
    assert any("rows.reviews[0]" in f for f in bundle.verify(built, public).failures)
    built["rows"]["reviews"] = []
    assert any(
        f"review {review.review_id} bound at sequence" in f for f in bundle.verify(built, public).failures
    )
