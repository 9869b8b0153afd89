"""The oversight dashboard: its numbers equal SQL computed here independently, its query count does not
depend on the number of runs (10 vs 10,000, bulk-inserted), and the page draws SVG with the tables."""

from __future__ import annotations

import datetime as dt
import math
import re
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from audit.read.dashboard import get_dashboard
from tests.bulk import DAY0, bulk_runs

pytestmark = pytest.mark.django_db
SINCE, UNTIL = DAY0, DAY0 + dt.timedelta(days=7)


def _sql(query: str, params=()) -> list[tuple]:
    with connection.cursor() as cur:
        cur.execute(query, params)
        return cur.fetchall()


def _day(value) -> dt.date:
    if isinstance(value, dt.datetime):
        return value.date()
    return value if isinstance(value, dt.date) else dt.date.fromisoformat(str(value)[:10])


def test_dashboard_numbers_equal_independent_sql(user):
    bulk_runs(user, 700, readers=("auditor", "lead"))
    board = get_dashboard(since=SINCE, until=UNTIL)
    window = (SINCE, UNTIL)

    # Runs per day by release decision, block rate, audit-incomplete and unreconciled runs.
    expected = {}
    for day, published, blocked, none, incomplete, unreconciled in _sql(
        "SELECT DATE(created_at), SUM(release_decision = 'PUBLISHED'), SUM(release_decision = 'BLOCKED'), "
        "SUM(release_decision IS NULL), SUM(audit_complete = 0), SUM(tokens_reconciled = 0) "
        "FROM diagnosis_run WHERE created_at >= %s AND created_at < %s GROUP BY DATE(created_at)",
        window,
    ):
        expected[_day(day)] = (int(published), int(blocked), int(none), int(incomplete), int(unreconciled))
    got = {
        d.day: (d.published, d.blocked, d.no_release, d.audit_incomplete, d.unreconciled) for d in board.days
    }
    assert got == expected and len(got) == 7
    assert sum(d.runs for d in board.days) == 700
    blocked, released = _sql(
        "SELECT SUM(release_decision = 'BLOCKED'), SUM(release_decision IS NOT NULL) FROM diagnosis_run"
    )[0]
    assert board.totals.block_rate == int(blocked) / int(released)

    # Cost per day of the priced runs (the stored fact), and the runs without a cost.
    for d in board.days:
        (cost,) = _sql(
            "SELECT SUM(cost) FROM diagnosis_run WHERE cost_status = 'priced' AND DATE(created_at) = %s",
            (d.day.isoformat(),),
        )[0]
        assert Decimal(str(cost)).quantize(Decimal("1e-6")) == d.cost.quantize(Decimal("1e-6"))

    # p50 / p95 nearest rank, computed here from every value.
    for metric, column in (("run", "total_duration_ms"), ("first_output", "first_output_latency_ms")):
        values = sorted(v for (v,) in _sql(f"SELECT {column} FROM diagnosis_run WHERE {column} IS NOT NULL"))
        for p in (50, 95):
            assert board.latency[metric][p] == values[math.ceil(p / 100 * len(values)) - 1]

    # Tokens per day by source and model from the usage records.
    rows = {}
    import json

    for event_day, details_status, details in _sql(
        "SELECT created_at, status, details FROM diagnosis_trace_event WHERE event_type = 'MODEL_TOKEN_USAGE'"
    ):
        d = json.loads(details) if isinstance(details, str) else details
        key = (_day(event_day), d["source"], d["model"])
        calls, without, total, cached = rows.get(key, (0, 0, 0, 0))
        ok = details_status == "REPORTED"
        rows[key] = (
            calls + 1,
            without + (not ok),
            total + (d["totalTokens"] or 0),
            cached + (d["cachedTokens"] or 0),
        )
    got_tokens: dict = {}
    for t in board.tokens:  # the board splits each (day, source, model) by the runs' provider
        before = got_tokens.get((t.day, t.source, t.model), (0, 0, 0, 0))
        now = (t.calls, t.without_usage, t.total, t.cached)
        got_tokens[(t.day, t.source, t.model)] = tuple(a + b for a, b in zip(before, now, strict=True))
    assert got_tokens == rows
    # Each row's cost is the pricing rule on its sums (deepseek-chat and gpt-4o-mini are in genai-prices).
    assert all(t.cost is not None and t.cost > 0 for t in board.tokens if t.provider == "openai")
    assert all(t.cost is None and t.cost_status == "demo" for t in board.tokens if t.provider == "demo")

    # Tool failure rate by tool; reasoning reads per day by reader.
    tools = {
        name: (int(n), int(failed))
        for name, n, failed in _sql(
            "SELECT tool_name, COUNT(*), SUM(status IN ('FAILED', 'INTERRUPTED', 'ABANDONED')) "
            "FROM tool_invocation GROUP BY tool_name"
        )
    }
    assert {t.tool: (t.calls, t.failed) for t in board.tools} == tools
    reads = {}
    for day, username, n in _sql(
        "SELECT DATE(accessed_at), username, COUNT(*) FROM reasoning_access_log "
        "GROUP BY DATE(accessed_at), username"
    ):
        reads.setdefault(_day(day), {})[username] = int(n)
    assert board.reads == reads and board.readers == ["auditor", "lead"]


def _queries(client) -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(
            reverse("admin:diagnosis_diagnosisrun_dashboard"), {"since": "2026-10-01", "until": "2026-10-07"}
        )
        assert response.status_code == 200
    return len(ctx.captured_queries)


def test_dashboard_query_count_is_the_same_at_10_and_10000_runs(client, superuser, user):
    client.force_login(superuser)
    bulk_runs(user, 10, prefix="few", readers=("auditor",))
    few = _queries(client)
    bulk_runs(user, 10_000, prefix="many", readers=("auditor", "lead"))
    assert _queries(client) == few


def test_dashboard_page_draws_svg_charts_with_their_tables_and_is_linked_from_the_index(
    client, superuser, user
):
    bulk_runs(user, 50, readers=("auditor",))
    client.force_login(superuser)
    assert (
        reverse("admin:diagnosis_diagnosisrun_dashboard")
        in client.get(reverse("admin:index")).content.decode()
    )
    body = client.get(
        reverse("admin:diagnosis_diagnosisrun_dashboard"), {"since": "2026-10-01", "until": "2026-10-07"}
    )
    html = body.content.decode()
    assert html.count('<svg class="dc-chart"') == 5 and "<script" not in html.split('id="content-main"')[1]
    for section in ("dc-runs", "dc-tokens", "dc-tools", "dc-reads", "dc-summary"):
        assert f'id="{section}"' in html
    assert "deepseek-chat" in html and "lookup_knowledge" in html
    # The incomplete-audit figure links the run list narrowed to the period and that filter, which agrees.
    link = html.split('id="dc-link-incomplete"')[0].rsplit('href="', 1)[1].split('"')[0].replace("&amp;", "&")
    shown = html.split('id="dc-link-incomplete">')[1].split("<")[0]
    assert "audit_complete=no" in link and "created_at__lt=2026-10-08" in link
    listed = client.get(link).content.decode()
    assert f"{shown} diagnosis run" in listed or f"{shown} result" in listed


def test_dashboard_needs_view_permission_on_runs(client, django_user_model):
    staff = django_user_model.objects.create_user("plainstaff", password="x", is_staff=True)
    client.force_login(staff)
    assert client.get(reverse("admin:diagnosis_diagnosisrun_dashboard")).status_code == 403


def test_days_without_runs_are_zeros_not_gaps(user):
    bulk_runs(user, 20)
    board = get_dashboard(since=SINCE - dt.timedelta(days=3), until=UNTIL + dt.timedelta(days=2))
    assert [d.day for d in board.days] == [
        (SINCE - dt.timedelta(days=3)).date() + dt.timedelta(days=i) for i in range(3 + 7 + 2)
    ]
    assert [d.runs for d in board.days[:3]] == [0, 0, 0] and [d.runs for d in board.days[-2:]] == [0, 0]
    assert sum(d.runs for d in board.days) == 20


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ({"since": "2026-10-07", "until": "2026-10-01"}, "ends (2026-10-01) before it starts (2026-10-07)"),
        ({"since": "2025-01-01", "until": "2026-10-01"}, "at most 366 days"),
        ({"since": "2026-10-01", "until": "soon"}, "Give both dates"),
        ({"days": "0"}, "days must be a whole number from 1 to 366"),
    ],
)
def test_a_period_that_cannot_be_shown_is_named_never_silently_replaced(client, superuser, query, says):
    client.force_login(superuser)
    html = client.get(reverse("admin:diagnosis_diagnosisrun_dashboard"), query).content.decode()
    error = html.split('id="dc-period-error"')[1].split("</p>")[0]
    assert says in error and "Showing the last 7 days instead." in error


def test_each_count_of_runs_without_a_cost_links_to_exactly_those_runs(client, superuser, user):
    bulk_runs(user, 60)
    client.force_login(superuser)
    html = client.get(
        reverse("admin:diagnosis_diagnosisrun_dashboard"), {"since": "2026-10-01", "until": "2026-10-07"}
    ).content.decode()
    cell = html.split('id="dc-no-cost">')[1].split("</td>")[0]
    links = re.findall(r'<a href="([^"]+)">(\d+) ', cell)
    assert len(links) == 3 and sum(int(shown) > 0 for _, shown in links) >= 2  # demo and unavailable runs
    for link, shown in links:
        listed = client.get(link.replace("&amp;", "&"))
        assert listed.context["cl"].result_count == int(shown), (link, shown)
