"""Retention that keeps the proof: runs past AUDIT_RETENTION_DAYS are purged to tombstones and the log
still verifies; legal holds exempt a run or session from both purges; a tombstone forged to hide a run
deleted early, or one purged under a hold, is detected; holds through the API and the admin."""

import datetime as dt
import io

import pytest
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from audit.models import AgentStep, LegalHold, LogLeaf, RunReview, RunTombstone, TraceEvent
from audit.transparency import log
from audit.write.reasoning_changes import purge_reasoning
from audit.write.retention import place_hold, purge_expired_runs
from audit.write.reviews import record_review
from diagnosis import services
from diagnosis.models import DiagnosisRun
from reasoning.models import AgentReasoningAudit
from tests.audit.transparency.support import delete_run
from tests.factories import issue_token, make_recorded_run, record_full_run
from tests.surfaces.admin.support import grant_console

pytestmark = pytest.mark.django_db


def _verify(*args):
    out = io.StringIO()
    try:
        call_command("verify_audit", *args, stdout=out)
    except CommandError:
        return False, out.getvalue()
    return True, out.getvalue()


@pytest.fixture
def keeper(django_user_model):
    user = django_user_model.objects.create_user("keeper", password="pw-keeper-1", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="place_legal_hold"))
    return django_user_model.objects.get(pk=user.pk)  # fresh permission cache


@pytest.fixture
def later(monkeypatch):
    """Travel 200 days ahead (past the default 183 days of retention)."""
    then = timezone.now() + dt.timedelta(days=200)
    monkeypatch.setattr(timezone, "now", lambda: then)
    return then


def test_a_purge_after_retention_keeps_verify_audit_green_and_holds_exempt(
    user, keeper, superuser, signing_key, monkeypatch
):
    plain, run_held, session_held = (make_recorded_run(user) for _ in range(3))
    record_review(run=plain, user=superuser, verdict="correct", note="reviews go with their run")
    place_hold(user=keeper, scope="RUN", target_id=run_held.run_id, reason="litigation 42")
    place_hold(user=keeper, scope="SESSION", target_id=session_held.session_id, reason="regulator request")
    log.checkpoint()
    then = timezone.now() + dt.timedelta(days=200)
    monkeypatch.setattr(timezone, "now", lambda: then)
    recent = make_recorded_run(user)  # finished "now", 200 days on: kept

    out = io.StringIO()
    call_command("purge_audit", stdout=out)
    assert "purged 1 run(s)" in out.getvalue() and "kept 2 under legal hold" in out.getvalue()
    assert not DiagnosisRun.objects.filter(run_id=plain.run_id).exists()
    assert not TraceEvent.objects.filter(run_id=plain.run_id).exists()
    assert not AgentReasoningAudit.objects.filter(run_id=plain.run_id).exists()
    tombstone = RunTombstone.objects.get(run_id=plain.run_id)
    assert tombstone.leaf_index == LogLeaf.objects.get(run_id=plain.run_id).leaf_index
    assert tombstone.rows_deleted["events"] == 18 and tombstone.rows_deleted["steps"] == 2
    assert (
        tombstone.rows_deleted["reviews"] == 1 and not RunReview.objects.filter(run_id=plain.run_id).exists()
    )
    for kept in (run_held, session_held, recent):
        assert DiagnosisRun.objects.filter(run_id=kept.run_id).exists()

    ok, out = _verify()
    assert ok, out
    assert "1 anchored run(s) purged by retention (tombstones)" in out
    ok, out = _verify("--run", plain.run_id)
    assert ok, out
    assert f"run={plain.run_id} NOTE records purged" in out and "inclusion in checkpoint" in out

    # The reasoning purge respects the holds too, even when it names the run.
    assert purge_reasoning(run_id=run_held.run_id) == 0
    assert purge_reasoning(run_id=session_held.run_id) == 0
    assert purge_reasoning(run_id=recent.run_id) == 2

    # Lifted: the next purge takes it.
    from audit.write.retention import lift_hold

    lift_hold(user=keeper, hold=LegalHold.objects.get(target_id=run_held.run_id), reason="case closed")
    assert purge_expired_runs().purged == [run_held.run_id]
    assert _verify()[0] is True


def test_a_tombstone_forged_for_a_run_deleted_early_is_detected(user, signing_key):
    run = make_recorded_run(user)
    log.checkpoint()
    leaf = LogLeaf.objects.get(run_id=run.run_id)
    delete_run(run.run_id)
    RunTombstone.objects.create(
        run_id=run.run_id,
        session_id=run.session_id,
        leaf_index=leaf.leaf_index,
        finished_at="",
        purged_at=timezone.now(),
        retention_days=0,
        reason="retention",
        purged_by="purge_audit",
    )
    ok, out = _verify()
    assert not ok
    assert (
        f"tombstone of run {run.run_id}: purged before the retention of 183 day(s) after its anchored finish"
        in out
    )


def test_a_run_purged_under_a_hold_is_detected(user, keeper, signing_key, later):
    run = make_recorded_run(user)
    log.checkpoint()
    hold = place_hold(user=keeper, scope="SESSION", target_id=run.session_id, reason="hold")
    leaf = LogLeaf.objects.get(run_id=run.run_id)
    delete_run(run.run_id)
    RunTombstone.objects.create(
        run_id=run.run_id,
        session_id=run.session_id,
        leaf_index=leaf.leaf_index,
        finished_at="",
        purged_at=timezone.now(),
        retention_days=183,
        reason="retention",
        purged_by="purge_audit",
    )
    ok, out = _verify()
    assert not ok and f"purged while legal hold {hold.pk} covered it" in out


def test_only_anchored_runs_are_purged_and_the_purge_checkpoints_first(user, signing_key):
    session = services.create_session(owner=user)
    run = services.create_run(session=session, query="q")
    record_full_run(run)
    report = purge_expired_runs(retention_days=0, now=timezone.now() + dt.timedelta(seconds=1))
    assert report.purged == [run.run_id] and report.unanchored == 0  # anchored by the purge itself
    assert not AgentStep.objects.filter(run_id=run.run_id).exists()


# --------------------------------------------------------------------------------------------------
# Holds through the API and the admin
# --------------------------------------------------------------------------------------------------
def _api(user):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {issue_token(user)}")
    return client


def test_holds_through_the_api(user, other_user, staff_user, keeper):
    run = make_recorded_run(user)
    url = f"/api/diagnosis/{run.session_id}/holds"
    assert APIClient().get(url).status_code == 401
    assert _api(other_user).get(url).status_code == 404  # not their session
    assert _api(staff_user).get(url).status_code == 403  # sees it, may not hold
    client = _api(keeper)
    assert client.post(url, {"runId": run.run_id}, format="json").status_code == 400  # no reason
    assert client.post(url, {"runId": "run_absent", "reason": "x"}, format="json").status_code == 404
    placed = client.post(url, {"runId": run.run_id, "reason": "litigation 7"}, format="json")
    assert placed.status_code == 201
    hold = placed.json()
    assert (hold["scope"], hold["targetId"], hold["placedBy"], hold["active"]) == (
        "RUN",
        run.run_id,
        "keeper",
        True,
    )
    whole = client.post(url, {"reason": "regulator"}, format="json").json()
    assert whole["scope"] == "SESSION" and whole["targetId"] == run.session_id
    assert [h["id"] for h in client.get(url).json()] == [whole["id"], hold["id"]]

    lift = f"{url}/{hold['id']}/lift"
    assert _api(staff_user).post(lift, {"reason": "x"}, format="json").status_code == 403
    lifted = client.post(lift, {"reason": "settled"}, format="json")
    assert lifted.status_code == 200
    assert (lifted.json()["active"], lifted.json()["liftedBy"], lifted.json()["liftReason"]) == (
        False,
        "keeper",
        "settled",
    )
    again = client.post(lift, {"reason": "again"}, format="json")
    assert again.status_code == 400 and again.json()["error"]["code"] == "invalid_request"
    assert client.post(f"{url}/999999/lift", {"reason": "x"}, format="json").status_code == 404


def test_holds_through_the_admin(user, keeper):
    run = make_recorded_run(user)
    client = Client()
    client.force_login(grant_console(keeper))
    add = reverse("admin:audit_legalhold_add")
    response = client.post(add, {"scope": "RUN", "target_id": run.run_id, "reason": "audit request"})
    assert response.status_code == 302, response.content.decode()[:2000]
    hold = LegalHold.objects.get()
    assert (hold.placed_by_username, hold.reason, hold.active) == ("keeper", "audit request", True)
    change = reverse("admin:audit_legalhold_change", args=[hold.pk])
    assert client.post(change, {"lift": "done"}).status_code == 302
    hold.refresh_from_db()
    assert (hold.active, hold.lifted_by_username, hold.lift_reason) == (False, "keeper", "done")
    assert client.post(reverse("admin:audit_legalhold_delete", args=[hold.pk])).status_code == 403
