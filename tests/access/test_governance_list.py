"""Issue 21 item 4, the whole list: each kind of change to who may do what writes exactly one governance
event — membership of "Reasoning Auditors", "Approvers", "Reviewers", "Staff viewers" (governed by name,
whether the group holds a sensitive permission or not, created before or after the setting names it);
grants of sensitive permissions to users and groups; superuser and staff flags; token issue and revoke;
reasoning key rotation; run and reasoning purges; legal holds; and deleting a governed group or a user
who held sensitive rights (Django removes their memberships without `m2m_changed`)."""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet
from django.contrib.auth.models import Group, Permission
from django.core.cache import cache

from audit.models import GovernanceEvent
from audit.models import GovernanceEventType as T
from audit.verify.governance_chain import verify_governance
from tests.factories import issue_token, make_recorded_run

pytestmark = pytest.mark.django_db

GOVERNED = ("Reasoning Auditors", "Approvers", "Reviewers", "Staff viewers")


def _mark() -> int:
    last = GovernanceEvent.objects.order_by("-sequence_no").first()
    return last.sequence_no if last else 0


def _after(mark: int) -> list[GovernanceEvent]:
    return list(GovernanceEvent.objects.filter(sequence_no__gt=mark).order_by("sequence_no"))


def _one(mark: int, event_type: str) -> GovernanceEvent:
    events = _after(mark)
    assert [e.event_type for e in events] == [event_type]
    return events[0]


def _perm(name: str) -> Permission:
    app_label, codename = name.split(".")
    return Permission.objects.get(content_type__app_label=app_label, codename=codename)


@pytest.mark.parametrize("name", GOVERNED)
def test_membership_of_each_governed_group_writes_one_event_each_way(name, user):
    group, _ = Group.objects.get_or_create(name=name)  # Approvers/Reviewers may not exist yet
    mark = _mark()
    user.groups.add(group)
    added = _one(mark, T.GROUP_MEMBER_ADDED)
    assert (added.subject_user, added.group) == (user.username, name)
    mark = _mark()
    group.user_set.remove(user)
    assert _one(mark, T.GROUP_MEMBER_REMOVED).group == name


def test_a_group_created_later_under_a_governed_name_is_governed_from_its_first_member(settings, user):
    settings.GOVERNED_GROUPS = [*settings.GOVERNED_GROUPS, "Release managers"]
    mark = _mark()
    group = Group.objects.create(name="Release managers")  # no permission at all
    assert _after(mark) == []  # creating an empty group changes nobody's rights
    user.groups.add(group)
    assert _one(mark, T.GROUP_MEMBER_ADDED).details["sensitivePermissions"] == []
    mark = _mark()
    user.groups.add(Group.objects.create(name="Readers"))  # neither named nor sensitive
    assert _after(mark) == []


@pytest.mark.parametrize("permission", ["reasoning.view_reasoning_content", "audit.place_legal_hold"])
def test_a_sensitive_permission_granted_and_revoked_to_a_user_and_to_a_group(permission, user):
    group = Group.objects.create(name="Ops")
    for relation in (user.user_permissions, group.permissions):
        mark = _mark()
        relation.add(_perm(permission))
        assert _one(mark, T.PERMISSION_GRANTED).permission == permission
        mark = _mark()
        relation.remove(_perm(permission))
        assert _one(mark, T.PERMISSION_REVOKED).permission == permission


@pytest.mark.parametrize(
    ("flag", "on", "off"),
    [
        ("is_superuser", T.SUPERUSER_GRANTED, T.SUPERUSER_REVOKED),
        ("is_staff", T.STAFF_GRANTED, T.STAFF_REVOKED),
    ],
)
def test_superuser_and_staff_flags_one_event_per_change(flag, on, off, user):
    for value, expected in ((True, on), (False, off)):
        mark = _mark()
        setattr(user, flag, value)
        user.save()
        assert _one(mark, expected).subject_user == user.username


def test_token_issue_and_revoke_one_event_each(user):
    from access.models import ApiToken
    from access.services import revoke_token

    mark = _mark()
    plaintext = issue_token(user)
    issued = _one(mark, T.TOKEN_ISSUED)
    assert issued.details["prefix"] == plaintext[:8] and plaintext not in str(issued.details)
    mark = _mark()
    assert revoke_token(token=ApiToken.objects.get(prefix=plaintext[:8]), actor="owner")
    assert _one(mark, T.TOKEN_REVOKED).details["prefix"] == plaintext[:8]


def test_reasoning_key_rotation_one_event(settings, user):
    from audit.write.reasoning_changes import rotate_reasoning_keys

    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.REASONING_ENCRYPTION_KEYS = [old]
    cache.clear()
    try:
        make_recorded_run(user)
        settings.REASONING_ENCRYPTION_KEYS = [new, old]
        cache.clear()
        mark = _mark()
        report = rotate_reasoning_keys()
        event = _one(mark, T.REASONING_KEYS_ROTATED)
        assert event.details["rows"] == report.rotated > 0
    finally:
        cache.clear()


def test_a_run_purge_one_event(user, settings):
    import datetime as dt

    from django.utils import timezone

    from audit.transparency import keys
    from audit.write.retention import purge_expired_runs

    settings.AUDIT_SIGNING_KEYS = [keys.generate_key_text()]
    settings.AUDIT_VERIFY_KEYS = []
    run = make_recorded_run(user)
    mark = _mark()
    report = purge_expired_runs(retention_days=0, now=timezone.now() + dt.timedelta(seconds=1))
    assert report.purged == [run.run_id]
    assert _one(mark, T.AUDIT_RUNS_PURGED).details["runIds"] == [run.run_id]


def test_a_reasoning_purge_and_a_legal_hold_one_event_each(superuser, traced_run):
    from audit.write.reasoning_changes import purge_reasoning
    from audit.write.retention import lift_hold, place_hold

    mark = _mark()
    hold = place_hold(user=superuser, scope="RUN", target_id=traced_run.run_id, reason="litigation")
    assert _one(mark, T.LEGAL_HOLD_PLACED).details["holdId"] == hold.pk
    mark = _mark()
    lift_hold(user=superuser, hold=hold, reason="settled")
    assert _one(mark, T.LEGAL_HOLD_LIFTED).details["holdId"] == hold.pk
    mark = _mark()
    purge_reasoning(run_id=traced_run.run_id)
    assert _one(mark, T.REASONING_ROWS_PURGED).details["runIds"] == [traced_run.run_id]


# --------------------------------------------------------------------------------------------------
# Deletions
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", GOVERNED)
def test_deleting_a_governed_group_writes_one_event_with_its_members(name, settings, user, other_user):
    group, _ = Group.objects.get_or_create(name=name)
    group.user_set.add(user, other_user)
    held = {
        f"{p.content_type.app_label}.{p.codename}" for p in group.permissions.select_related("content_type")
    }
    granted = sorted(held & set(settings.SENSITIVE_PERMISSIONS))  # e.g. Approvers: approve_tool_call
    mark = _mark()
    group_id = group.pk
    group.delete()
    event = _one(mark, T.GROUP_DELETED)
    assert event.group == name
    assert event.details == {
        "groupId": group_id,
        "members": ["other", "owner"],
        "sensitivePermissions": granted,
    }
    assert verify_governance()[1] == []


def test_deleting_a_group_that_holds_a_sensitive_permission_is_recorded_and_a_plain_one_is_not(user):
    holds = Group.objects.create(name="Legal")
    holds.permissions.add(_perm("audit.place_legal_hold"))
    holds.user_set.add(user)
    plain = Group.objects.create(name="Readers")
    plain.user_set.add(user)
    mark = _mark()
    plain.delete()
    assert _after(mark) == []
    holds.delete()
    event = _one(mark, T.GROUP_DELETED)
    assert event.details["sensitivePermissions"] == ["audit.place_legal_hold"]
    assert event.details["members"] == ["owner"]


def test_deleting_a_user_who_held_sensitive_rights_writes_one_event(auditor, django_user_model):
    auditor.user_permissions.add(_perm("audit.place_legal_hold"))
    mark = _mark()
    user_id = auditor.pk
    auditor.delete()
    event = _one(mark, T.USER_DELETED)
    assert event.subject_user == "auditor"
    assert event.details == {
        "userId": user_id,
        "superuser": False,
        "staff": True,
        # Reasoning Auditors also review runs (audit.review_run, granted on migrate).
        "sensitivePermissions": [
            "audit.place_legal_hold",
            "audit.review_run",
            "reasoning.view_reasoning_content",
        ],
        "directPermissions": ["audit.place_legal_hold"],
        "groups": ["Reasoning Auditors"],
    }
    boss = django_user_model.objects.create_superuser("boss", password="pw-boss-1")
    mark = _mark()
    boss.delete()
    assert _one(mark, T.USER_DELETED).details["superuser"] is True


def test_deleting_a_user_without_sensitive_rights_writes_nothing(user):
    mark = _mark()
    user.delete()
    assert _after(mark) == []


def test_a_deleted_holder_counts_as_a_loss_in_the_access_review(auditor):
    import datetime as dt

    from django.utils import timezone

    from access.review import access_review

    since = timezone.now() - dt.timedelta(days=1)
    auditor.delete()
    review = access_review(since=since)
    reasoning = next(p for p in review.permissions if p.permission == "reasoning.view_reasoning_content")
    assert "auditor" in reasoning.held_during and "auditor" not in reasoning.held_now
