"""`manage.py user_groups`: role groups and `is_staff` by command, each change a governance event naming
the command; an unknown group is refused and changes nothing."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from access.management.commands.user_groups import ACTOR
from audit.models import GovernanceEvent, GovernanceEventType

pytestmark = pytest.mark.django_db


def _run(*args: str) -> str:
    out = io.StringIO()
    call_command("user_groups", *args, stdout=out)
    return out.getvalue().strip()


def test_adds_and_removes_groups_sets_staff_and_records_who_did_it(django_user_model):
    user = django_user_model.objects.create_user("auditor1", password="pw-auditor-1")
    line = _run("auditor1", "--add", "Staff viewers", "--add", "Reasoning Auditors", "--staff")
    assert line == "auditor1: staff=yes groups=Reasoning Auditors, Staff viewers"
    user.refresh_from_db()
    assert user.is_staff
    events = GovernanceEvent.objects.filter(subject_user="auditor1")
    added = set(
        events.filter(event_type=GovernanceEventType.GROUP_MEMBER_ADDED).values_list("group", flat=True)
    )
    assert set(added) == {"Staff viewers", "Reasoning Auditors"}
    assert events.filter(event_type=GovernanceEventType.STAFF_GRANTED).exists()
    assert set(events.values_list("actor", flat=True)) == {ACTOR}

    assert _run("auditor1", "--remove", "Reasoning Auditors", "--no-staff") == (
        "auditor1: staff=no groups=Staff viewers"
    )
    assert events.filter(
        event_type=GovernanceEventType.GROUP_MEMBER_REMOVED, group="Reasoning Auditors"
    ).exists()


def test_an_unknown_group_or_user_is_refused_and_changes_nothing(django_user_model):
    user = django_user_model.objects.create_user("approver1", password="pw-approver-1")
    with pytest.raises(CommandError, match=r"no group 'Approver'.*existing groups: .*'Approvers'"):
        _run("approver1", "--add", "Approvers", "--add", "Approver", "--staff")
    user.refresh_from_db()
    assert not user.is_staff and not user.groups.exists()
    with pytest.raises(CommandError, match="no user 'nobody'"):
        _run("nobody", "--add", "Approvers")


def test_create_makes_the_user_with_the_password_from_the_environment_or_none(django_user_model, monkeypatch):
    monkeypatch.setenv("DJANGO_USER_PASSWORD", "approver-Pass-2")
    assert _run("approver2", "--create", "--add", "Approvers") == "approver2: staff=no groups=Approvers"
    assert django_user_model.objects.get(username="approver2").check_password("approver-Pass-2")
    monkeypatch.delenv("DJANGO_USER_PASSWORD")
    assert _run("script1", "--create") == "script1: staff=no groups=-"
    assert not django_user_model.objects.get(username="script1").has_usable_password()
    created = GovernanceEvent.objects.filter(subject_user="approver2", group="Approvers")
    assert list(created.values_list("actor", flat=True)) == [ACTOR]
