"""The role groups `migrate` makes (`access.groups`): each holds what its row of the one table grants."""

import pytest
from django.apps import apps
from django.conf import settings
from django.contrib.auth.models import Group

from access.groups import GRANTS, create_role_groups
from core.groups import GOVERNED

pytestmark = pytest.mark.django_db


def _held(name: str) -> set[str]:
    group = Group.objects.get(name=name)
    return {f"{p.content_type.app_label}.{p.codename}" for p in group.permissions.all()}


def test_each_role_group_holds_its_grants_and_a_second_run_changes_nothing():
    before = {name: _held(name) for name in GOVERNED}
    assert before["Approvers"] == {"diagnosis.approve_tool_call", "diagnosis.view_diagnosisrun"}
    assert before["Reviewers"] == {"audit.review_run"}
    assert before["Reasoning Auditors"] == {"audit.review_run", "reasoning.view_reasoning_content"}
    assert before["Staff viewers"] and all(".view_" in p for p in before["Staff viewers"])
    create_role_groups(sender=apps.get_app_config("access"))
    assert {name: _held(name) for name in GOVERNED} == before
    assert Group.objects.filter(name__in=GOVERNED).count() == len(GOVERNED)


def test_the_governed_groups_are_the_role_groups():
    assert {grant.name for grant in GRANTS} == set(GOVERNED)
    assert settings.GOVERNED_GROUPS == ["Reasoning Auditors", "Approvers", "Reviewers", "Staff viewers"]
