"""The governance log: every kind of grant and revoke writes exactly one typed event into the chained,
append-only log (from signals, whichever side of a relation changes), the admin shows it read-only, and
`verify_audit` names an edited, deleted or reordered event."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth.models import Group, Permission
from django.core.management import CommandError, call_command
from django_otp.plugins.otp_totp.models import TOTPDevice

from audit.models import GovernanceEvent
from audit.models import GovernanceEventType as T
from audit.verify.governance_chain import verify_governance

pytestmark = pytest.mark.django_db

AUDITORS = "Reasoning Auditors"


def _perm(name: str) -> Permission:
    app_label, codename = name.split(".")
    return Permission.objects.get(content_type__app_label=app_label, codename=codename)


def _events_after(mark: int) -> list[tuple]:
    return list(
        GovernanceEvent.objects.filter(sequence_no__gt=mark)
        .order_by("sequence_no")
        .values_list("event_type", "subject_user", "group", "permission")
    )


def _mark() -> int:
    last = GovernanceEvent.objects.order_by("-sequence_no").first()
    return last.sequence_no if last else 0


def test_sensitive_group_membership_from_either_side_writes_one_event_each(user, other_user):
    auditors = Group.objects.get(name=AUDITORS)
    plain = Group.objects.create(name="Readers")
    mark = _mark()
    user.groups.add(auditors)
    auditors.user_set.add(other_user)
    user.groups.add(plain)  # not a sensitive group: nothing to record
    auditors.user_set.remove(user)
    other_user.groups.clear()
    assert _events_after(mark) == [
        (T.GROUP_MEMBER_ADDED, "owner", AUDITORS, ""),
        (T.GROUP_MEMBER_ADDED, "other", AUDITORS, ""),
        (T.GROUP_MEMBER_REMOVED, "owner", AUDITORS, ""),
        (T.GROUP_MEMBER_REMOVED, "other", AUDITORS, ""),
    ]
    event = GovernanceEvent.objects.get(sequence_no=mark + 1)
    assert event.details["sensitivePermissions"] == ["audit.review_run", "reasoning.view_reasoning_content"]


def test_a_group_given_a_sensitive_permission_becomes_sensitive(user):
    keepers = Group.objects.create(name="Hold Keepers")
    user.groups.add(keepers)
    mark = _mark()
    keepers.permissions.add(_perm("audit.place_legal_hold"), _perm("auth.view_user"))
    user.groups.remove(keepers)
    events = _events_after(mark)
    assert events == [
        (T.PERMISSION_GRANTED, "", "Hold Keepers", "audit.place_legal_hold"),
        (T.GROUP_MEMBER_REMOVED, "owner", "Hold Keepers", ""),
    ]
    granted = GovernanceEvent.objects.get(sequence_no=mark + 1)
    assert granted.details["members"] == ["owner"]
    mark = _mark()
    keepers.permissions.remove(_perm("audit.place_legal_hold"))
    assert _events_after(mark) == [(T.PERMISSION_REVOKED, "", "Hold Keepers", "audit.place_legal_hold")]


def test_direct_grants_of_sensitive_permissions_to_users(user):
    mark = _mark()
    user.user_permissions.add(_perm("reasoning.view_reasoning_content"), _perm("auth.view_user"))
    _perm("audit.place_legal_hold").user_set.add(user)
    user.user_permissions.remove(_perm("reasoning.view_reasoning_content"))
    user.user_permissions.clear()
    assert _events_after(mark) == [
        (T.PERMISSION_GRANTED, "owner", "", "reasoning.view_reasoning_content"),
        (T.PERMISSION_GRANTED, "owner", "", "audit.place_legal_hold"),
        (T.PERMISSION_REVOKED, "owner", "", "reasoning.view_reasoning_content"),
        (T.PERMISSION_REVOKED, "owner", "", "audit.place_legal_hold"),
    ]


def test_superuser_staff_and_active_flags(django_user_model, user):
    mark = _mark()
    django_user_model.objects.create_superuser("boss", password="pw-boss-1")
    user.is_staff = True
    user.save()
    user.is_superuser = True
    user.save()
    user.save()  # no change: nothing recorded
    user.is_superuser = False
    user.is_active = False
    user.save()
    assert _events_after(mark) == [
        (T.SUPERUSER_GRANTED, "boss", "", ""),
        (T.STAFF_GRANTED, "boss", "", ""),
        (T.STAFF_GRANTED, "owner", "", ""),
        (T.SUPERUSER_GRANTED, "owner", "", ""),
        (T.SUPERUSER_REVOKED, "owner", "", ""),
        (T.USER_DEACTIVATED, "owner", "", ""),
    ]


def test_otp_devices_are_recorded(user):
    mark = _mark()
    device = TOTPDevice.objects.create(user=user, name="phone", confirmed=True)
    device.delete()
    assert [e[0] for e in _events_after(mark)] == [T.OTP_DEVICE_ADDED, T.OTP_DEVICE_REMOVED]


def test_a_change_in_the_admin_names_its_actor_and_the_log_is_read_only(client, superuser, user):
    client.force_login(superuser)
    auditors = Group.objects.get(name=AUDITORS)
    form = {
        "username": user.username,
        "is_active": "on",
        "is_staff": "on",
        "groups": [auditors.pk],
        "date_joined_0": "2026-01-01",
        "date_joined_1": "00:00:00",
        "initial-date_joined_0": "2026-01-01",
        "initial-date_joined_1": "00:00:00",
    }
    mark = _mark()
    response = client.post(f"/admin/auth/user/{user.pk}/change/", form)
    assert response.status_code == 302, response.content.decode()[:2000]
    events = list(GovernanceEvent.objects.filter(sequence_no__gt=mark).order_by("sequence_no"))
    assert [(e.event_type, e.actor) for e in events] == [
        (T.STAFF_GRANTED, "root"),
        (T.GROUP_MEMBER_ADDED, "root"),
    ]
    page = client.get(f"/admin/audit/governanceevent/{events[0].pk}/change/")
    assert page.status_code == 200 and b'name="_save"' not in page.content
    assert client.post(f"/admin/audit/governanceevent/{events[0].pk}/delete/").status_code == 403


def test_verify_audit_detects_an_edited_a_deleted_and_a_relinked_event(user):
    auditors = Group.objects.get(name=AUDITORS)
    user.groups.add(auditors)
    user.groups.remove(auditors)
    user.is_staff = True
    user.save()
    checked, problems = verify_governance()
    assert checked >= 3 and problems == []
    out = StringIO()
    call_command("verify_audit", stdout=out)
    assert "verified the governance log" in out.getvalue() and ": ok" in out.getvalue()

    second = GovernanceEvent.objects.order_by("sequence_no")[1]
    GovernanceEvent.objects.filter(pk=second.pk).update(subject_user="someone-else")
    _, problems = verify_governance()
    assert problems == [f"governance event {second.sequence_no}: stored hash does not match its content"]
    out = StringIO()
    with pytest.raises(CommandError, match="the governance log has 1 problem"):
        call_command("verify_audit", stdout=out)
    assert f"governance INVALID governance event {second.sequence_no}" in out.getvalue()

    GovernanceEvent.objects.filter(pk=second.pk).delete()
    _, problems = verify_governance()
    assert f"governance sequence gap: {second.sequence_no}–{second.sequence_no} missing" in problems
    assert any("prev_hash does not match" in p for p in problems)


def test_legal_holds_and_purges_are_governance_events(superuser, traced_run):
    from audit.payloads import sha256_hex
    from audit.write.reasoning_changes import purge_reasoning
    from audit.write.retention import lift_hold, place_hold

    mark = _mark()
    hold = place_hold(user=superuser, scope="RUN", target_id=traced_run.run_id, reason="litigation")
    lift_hold(user=superuser, hold=hold, reason="settled")
    assert purge_reasoning(run_id=traced_run.run_id) == 2
    events = list(GovernanceEvent.objects.filter(sequence_no__gt=mark).order_by("sequence_no"))
    assert [(e.event_type, e.actor) for e in events] == [
        (T.LEGAL_HOLD_PLACED, "root"),
        (T.LEGAL_HOLD_LIFTED, "root"),
        (T.REASONING_ROWS_PURGED, "purge_reasoning"),
    ]
    assert events[0].details == {
        "holdId": hold.pk,
        "scope": "RUN",
        "targetId": traced_run.run_id,
        "reasonSha256": sha256_hex("litigation"),  # the reason itself stays off the chain
    }
    assert events[1].details["reasonSha256"] == sha256_hex("settled")
    assert events[2].details["rows"] == 2 and events[2].details["runIds"] == [traced_run.run_id]
    assert verify_governance()[1] == []


def test_a_save_of_other_fields_costs_no_flag_lookup(user, django_assert_num_queries):
    from django.utils import timezone

    user.last_login = timezone.now()
    with django_assert_num_queries(1):  # the UPDATE alone, as at every login
        user.save(update_fields=["last_login"])
    mark = _mark()
    user.is_staff = True
    user.save(update_fields=["is_staff"])
    assert _events_after(mark) == [(T.STAFF_GRANTED, "owner", "", "")]


def test_membership_of_the_approvers_group_is_governed(user):
    """ "Approvers" (created on migrate) holds `diagnosis.approve_tool_call`, a sensitive permission: who
    joins or leaves it is in the governance chain."""
    approvers = Group.objects.get(name="Approvers")
    assert sorted(f"{p.content_type.app_label}.{p.codename}" for p in approvers.permissions.all()) == [
        "diagnosis.approve_tool_call",
        "diagnosis.view_diagnosisrun",
    ]
    mark = _mark()
    user.groups.add(approvers)
    user.groups.remove(approvers)
    assert _events_after(mark) == [
        (T.GROUP_MEMBER_ADDED, "owner", "Approvers", ""),
        (T.GROUP_MEMBER_REMOVED, "owner", "Approvers", ""),
    ]
