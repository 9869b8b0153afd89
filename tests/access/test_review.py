"""The access review's numbers equal what plain SQL over the same tables says: who holds each sensitive
permission now (users, groups, superusers), whose hold ended in the period (governance log), who read
reasoning in the period and how often (access log), and the grants never used; the command, its CSV
and the admin page show the same."""

from __future__ import annotations

import csv
import datetime as dt
import io

import pytest
from django.contrib.auth.models import Group, Permission
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from access.reasoning_reads import record_reasoning_read
from access.review import access_review
from reasoning.models import ReasoningAccessLog

pytestmark = pytest.mark.django_db

PERMISSION = ("reasoning", "view_reasoning_content")
LOSSES = ("GROUP_MEMBER_REMOVED", "PERMISSION_REVOKED", "SUPERUSER_REVOKED", "USER_DEACTIVATED")


def _read(user, n: int, *, when: dt.datetime | None = None) -> None:
    for _ in range(n):
        entry = record_reasoning_read(
            user=user, session_id="s", run_id="r", records_returned=1, client_address=None, user_agent=""
        )
        if when is not None:
            ReasoningAccessLog.objects.filter(pk=entry.pk).update(accessed_at=when)


@pytest.fixture
def world(django_user_model):
    auditors = Group.objects.get(name="Reasoning Auditors")
    make = django_user_model.objects.create_user
    reader, idle, former, direct = (
        make(n, password="pw-x-1") for n in ("reader", "idle", "former", "direct")
    )
    make("plain", password="pw-x-1")  # holds nothing, reads nothing
    django_user_model.objects.create_superuser("root", password="pw-root-1")
    for u in (reader, idle, former):
        u.groups.add(auditors)
    direct.user_permissions.add(
        Permission.objects.get(content_type__app_label=PERMISSION[0], codename=PERMISSION[1])
    )
    _read(reader, 3)
    _read(reader, 2, when=timezone.now() - dt.timedelta(days=30))  # before the period: not counted
    _read(former, 1)
    former.groups.remove(auditors)  # lost it during the period
    _read(direct, 1)
    return timezone.now() - dt.timedelta(days=1)


def _sql(query: str, params=()) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchall()


def _expected(since) -> tuple[set[str], set[str], dict[str, int]]:
    perm = (
        "SELECT p.id FROM auth_permission p JOIN django_content_type c ON c.id = p.content_type_id "
        "WHERE c.app_label = %s AND p.codename = %s"
    )
    group_column = connection.ops.quote_name("group")
    losses = ", ".join(["%s"] * len(LOSSES))
    holders = {
        r[0]
        for r in _sql(
            f"""SELECT u.username FROM auth_user u WHERE u.is_active AND (u.is_superuser
                OR u.id IN (SELECT user_id FROM auth_user_user_permissions WHERE permission_id IN ({perm}))
                OR u.id IN (SELECT ug.user_id FROM auth_user_groups ug JOIN auth_group_permissions gp
                            ON gp.group_id = ug.group_id WHERE gp.permission_id IN ({perm})))""",
            [*PERMISSION, *PERMISSION],
        )
    }
    lost = {
        r[0]
        for r in _sql(
            f"""SELECT e.subject_user FROM audit_governance_event e WHERE e.created_at >= %s
                AND e.event_type IN ({losses}) AND (e.event_type != 'GROUP_MEMBER_REMOVED'
                OR e.{group_column} IN (SELECT g.name FROM auth_group g JOIN auth_group_permissions gp
                   ON gp.group_id = g.id WHERE gp.permission_id IN ({perm})))""",
            [since, *LOSSES, *PERMISSION],
        )
    }
    uses = dict(
        _sql(
            "SELECT username, COUNT(*) FROM reasoning_access_log WHERE accessed_at >= %s GROUP BY username",
            [since],
        )
    )
    return holders, holders | lost, uses


def test_the_review_equals_independent_sql(world):
    since = world
    review = access_review(since=since)
    (reasoning,) = [p for p in review.permissions if p.permission == "reasoning.view_reasoning_content"]
    held_now, held_during, uses = _expected(since)
    assert reasoning.held_now == held_now == {"reader", "idle", "direct", "root"}
    assert reasoning.held_during == held_during == {"reader", "idle", "direct", "root", "former"}
    assert (
        {u: use.count for u, use in reasoning.uses.items()} == uses == {"reader": 3, "former": 1, "direct": 1}
    )
    assert reasoning.unused == held_during - set(uses) == {"idle", "root"}


def test_the_command_csv_and_admin_page_show_the_same_numbers(world, client, django_user_model):
    since = world
    out = io.StringIO()
    call_command("access_review", "--since", since.isoformat(), "--csv", stdout=out)
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    mine = {r["username"]: r for r in rows if r["permission"] == "reasoning.view_reasoning_content"}
    _, held_during, uses = _expected(since)
    assert set(mine) == held_during
    assert {u: int(r["uses"]) for u, r in mine.items() if int(r["uses"])} == uses
    assert mine["former"]["held_now"] == "False" and mine["former"]["held_during_period"] == "True"

    text = io.StringIO()
    call_command("access_review", "--since", since.isoformat(), stdout=text)
    assert (
        "reasoning.view_reasoning_content: held during the period by 5, used by 3, 2 grant(s) never used"
        in text.getvalue()
    )

    client.force_login(django_user_model.objects.get(username="root"))
    page = client.get("/admin/access/apitoken/access-review/", {"since": since.isoformat()})
    assert page.status_code == 200
    html = page.content.decode()
    assert '<span class="held-count">5</span>' in html and '<span class="unused-count">2</span>' in html
    exported = client.get(
        "/admin/access/apitoken/access-review/", {"since": since.isoformat(), "format": "csv"}
    )
    assert exported["Content-Type"].startswith("text/csv")
    assert exported.content.decode().replace("\r\n", "\n") == out.getvalue().replace("\r\n", "\n")
