"""Authority from the chain (issue 43 item 3): a review, an approval decision and a legal hold count only
from an actor who held the right at that point of the governance chain. A right a database writer gave
outside the application (a raw INSERT into the permission tables fires no signal, so no governance event)
confers nothing: the services refuse it, and `verify_audit` names any authenticated decision whose actor
lacked it."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from agent.runtime import approvals
from audit.models import REVIEW_PERMISSION, GovernanceEvent, HoldScope
from audit.models import GovernanceEventType as T
from audit.verify import authority
from audit.write.retention import place_hold
from audit.write.reviews import record_review
from diagnosis.models import APPROVE_PERMISSION
from tests.factories import make_recorded_run, make_waiting_approval

pytestmark = pytest.mark.django_db


def _verify(*args):
    out = io.StringIO()
    try:
        call_command("verify_audit", *args, stdout=out)
    except CommandError:
        return False, out.getvalue()
    return True, out.getvalue()


def _join_behind_the_applications_back(user, group_name: str) -> None:
    """What a database writer does: a membership row, no signal, no governance event."""
    group = Group.objects.get(name=group_name)
    with connection.cursor() as cursor:
        table = user.groups.through._meta.db_table
        cursor.execute(f"INSERT INTO {table} (user_id, group_id) VALUES (%s, %s)", [user.pk, group.pk])


class _Event:
    def __init__(self, seq, event_type, subject_user="", group="", permission="", details=None):
        self.sequence_no, self.event_type = seq, event_type
        self.subject_user, self.group, self.permission = subject_user, group, permission
        self.details = details or {}


def test_the_replay_follows_memberships_grants_flags_deletions_and_the_baseline():
    events = [
        _Event(
            1,
            T.PERMISSION_GRANTED,
            group="Reviewers",
            permission=REVIEW_PERMISSION,
            details={"via": "group", "members": ["old"]},
        ),
        _Event(2, T.GROUP_MEMBER_ADDED, subject_user="ann", group="Reviewers"),
        _Event(3, T.USER_DEACTIVATED, subject_user="ann"),
        _Event(4, T.USER_REACTIVATED, subject_user="ann"),
        _Event(
            5,
            T.PERMISSION_REVOKED,
            group="Reviewers",
            permission=REVIEW_PERMISSION,
            details={"via": "group", "members": ["ann", "old"]},
        ),
        _Event(6, T.SUPERUSER_GRANTED, subject_user="bob"),
        _Event(7, T.USER_DELETED, subject_user="bob"),
        _Event(
            8,
            T.RIGHTS_BASELINE,
            details={
                "users": {
                    "cat": {
                        "superuser": False,
                        "active": True,
                        "permissions": [APPROVE_PERMISSION],
                        "groups": [],
                    }
                },
                "groups": {},
            },
        ),
        _Event(9, T.TOKEN_ISSUED, subject_user="cat"),
    ]
    replayed = authority.replay(events)
    held = replayed.held
    assert held("old", REVIEW_PERMISSION, 1) and not held("ann", REVIEW_PERMISSION, 1)
    assert held("ann", REVIEW_PERMISSION, 2) and not held("ann", REVIEW_PERMISSION, 3)  # deactivated
    assert held("ann", REVIEW_PERMISSION, 4) and not held(
        "ann", REVIEW_PERMISSION, 5
    )  # revoked from the group
    assert held("bob", APPROVE_PERMISSION, 6) and not held("bob", APPROVE_PERMISSION, 7)  # a deleted user
    assert not held("old", REVIEW_PERMISSION, 8) and held("cat", APPROVE_PERMISSION, 8)  # the baseline
    assert replayed.head == 9 and not held("nobody", REVIEW_PERMISSION)


def test_a_right_given_behind_the_applications_back_confers_nothing(user, superuser):
    run = make_recorded_run(user)
    _join_behind_the_applications_back(user, "Reviewers")
    user.refresh_from_db()
    assert user.has_perm(REVIEW_PERMISSION)  # the tables say yes …
    assert not authority.permitted(user, REVIEW_PERMISSION)  # … the chain says no
    with pytest.raises(PermissionDenied):
        record_review(run=run, user=user, verdict="correct")
    with pytest.raises(PermissionDenied):
        place_hold(user=user, scope=HoldScope.RUN, target_id=run.run_id, reason="x")
    waiting, call_id = make_waiting_approval(superuser)
    _join_behind_the_applications_back(user, approvals.APPROVERS_GROUP)
    user = type(user).objects.get(pk=user.pk)
    with pytest.raises(approvals.ApprovalForbidden):
        approvals.decide(run=waiting, tool_call_id=call_id, decision=approvals.APPROVED, user=user)


def test_verify_audit_names_a_decision_whose_actor_lacked_the_right(user, auditor, monkeypatch):
    """The verifier's own rule, should a decision ever be recorded by someone the chain gave no right
    (a service check bypassed: here the service's check is replaced to let one through)."""
    run = make_recorded_run(user)
    record_review(run=run, user=auditor, verdict="correct")
    assert _verify("--run", run.run_id)[0]
    _join_behind_the_applications_back(user, "Reviewers")
    import audit.write.reviews

    monkeypatch.setattr(audit.write.reviews, "permitted", lambda who, permission: True)
    record_review(run=run, user=user, verdict="unsafe")
    ok, out = _verify("--run", run.run_id)
    assert not ok
    head = GovernanceEvent.objects.order_by("-sequence_no").first().sequence_no
    assert (
        f"review by {user.username}, who did not hold {REVIEW_PERMISSION} at governance event {head}" in out
    )
    assert f"review by {auditor.username}" not in out


def test_a_hold_placed_by_someone_the_chain_gave_no_right_is_named(user, superuser, monkeypatch):
    run = make_recorded_run(user)
    import audit.write.retention

    monkeypatch.setattr(audit.write.retention, "permitted", lambda who, permission: True)
    place_hold(user=user, scope=HoldScope.RUN, target_id=run.run_id, reason="not mine to place")
    ok, out = _verify()
    assert not ok
    assert f"LEGAL_HOLD_PLACED by {user.username}, who did not hold audit.place_legal_hold then" in out


def test_the_chain_is_replayed_only_when_it_verifies(user, superuser):
    """The replay is verified once per head of the chain (cached): one untagged event, and from the next
    head on nothing is taken from the chain any more (fail-closed)."""
    from audit.write import record_governance_event

    assert authority.permitted(superuser, REVIEW_PERMISSION)
    granted = GovernanceEvent.objects.filter(event_type=T.SUPERUSER_GRANTED, subject_user=superuser.username)
    granted.update(tag="")
    record_governance_event(event_type=T.TOKEN_ISSUED, actor="x", subject_user=user.username)
    assert authority.current().problems
    assert not authority.permitted(superuser, REVIEW_PERMISSION)
