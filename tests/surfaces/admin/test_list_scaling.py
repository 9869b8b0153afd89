"""Staff lists and list APIs do not grow with the tables (`core.admin_lists`, stored list facts):
the same number of queries per page with 10 and with 1,000 runs; a capped count; sorting tied by the
primary key in the column's direction; on MariaDB, EXPLAIN of each main list query reads an index of
`diagnosis_run` (no full scan, no filesort). B6 (`bench/b6_lists.py`) times the same pages at a million
runs."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audit.models import AgentStep, ToolInvocation, TraceEvent
from core.admin_lists import CappedCountPaginator
from diagnosis.models import ChatSession, DiagnosisRun, ReleaseDecision, RunStatus

pytestmark = pytest.mark.django_db

RUNS = "/admin/diagnosis/diagnosisrun/"
PAGES = [
    RUNS,
    RUNS + "?p=2",
    RUNS + "?status__exact=FAILED",
    RUNS + "?release_decision__exact=BLOCKED",
    RUNS + "?intent__exact=KNOWLEDGE",
    RUNS + "?provider__exact=demo",
    RUNS + "?audit_complete=no",
    RUNS + "?audit_complete=yes",
    RUNS + "?unverified=yes",
    RUNS + "?o=7",
    RUNS + "?o=-10",
    RUNS + "?o=11",  # cost
    RUNS + "?o=-11",
    RUNS + "?cost=unavailable",
    RUNS + "?cost=not_priced",
    RUNS + "?q=bulk0000000005",
    RUNS + "?q=bulk000000000",
    RUNS + "?q=redis",
    RUNS + "?q=复制",
    "/admin/diagnosis/chatsession/",
    "/admin/audit/traceevent/",
    "/admin/audit/traceevent/?event_type__exact=ROUTING_ATTEMPT",
    "/admin/audit/agentstep/",
    "/admin/audit/toolinvocation/",
    "/admin/reasoning/agentreasoningaudit/",
    "/admin/reasoning/reasoningaccesslog/",
    "/admin/diagnosis/runfeedback/",
    "/api/diagnosis/sessions/",
]


def add_runs(owner, start: int, stop: int, *, audit_rows: bool = True) -> None:
    """Runs `start`..`stop - 1` (ten per session), each with one event, step and tool, and facts as the
    recorder stores them; bulk-inserted so that a thousand take a moment."""
    now = timezone.now()
    sessions = [
        ChatSession(
            session_id=f"bulkses{n:07d}",
            owner=owner,
            title="bulk",
            run_count=10,
            last_run_at=now - dt.timedelta(seconds=n * 10),
        )
        for n in range(start // 10, (stop + 9) // 10)
    ]
    ChatSession.objects.bulk_create(sessions, ignore_conflicts=True)
    runs = []
    for n in range(start, stop):
        failed = n % 10 == 7
        runs.append(
            DiagnosisRun(
                run_id=f"bulk{n:010d}",
                session_id=f"bulkses{n // 10:07d}",
                query="Redis latency on the cache" if n % 50 == 1 else "Why is replication lagging?",
                status=RunStatus.FAILED if failed else RunStatus.SUCCESS,
                intent="KNOWLEDGE" if n % 5 == 1 else "DIAGNOSIS",
                provider="demo" if n % 4 == 0 else "openai",
                release_decision=None if failed else ReleaseDecision.BLOCKED if n % 9 == 3 else "PUBLISHED",
                draft_chars=120 if n % 20 == 0 else 0,
                tokens_total=(n * 7919) % 5000,
                total_duration_ms=(n * 104729) % 60000,
                expected_events=1,
                expected_steps=1,
                expected_tools=1,
                persisted_events=1,
                persisted_steps=1,
                persisted_tools=1,
                audit_complete=n % 100 != 5,
            )
        )
    DiagnosisRun.objects.bulk_create(runs, batch_size=2000)
    if not audit_rows:
        return
    common = lambda run: {"run_id": run.run_id, "session_id": run.session_id, "created_at": now}  # noqa: E731
    TraceEvent.objects.bulk_create(
        TraceEvent(
            **common(r),
            sequence_no=1,
            phase="ROUTING",
            event_type="ROUTING_ATTEMPT",
            status="OK",
            summary="attempt 1",
            details={},
            prev_hash="0" * 64,
            hash="1" * 64,
        )
        for r in runs
    )
    AgentStep.objects.bulk_create(
        AgentStep(**common(r), step_index=1, agent_name="diagnosis_agent", model="m") for r in runs
    )
    ToolInvocation.objects.bulk_create(
        ToolInvocation(
            **common(r),
            step_index=1,
            tool_call_id="c1",
            tool_name="lookup_knowledge",
            status="SUCCEEDED",
            started_at=now,
            updated_at=now,
        )
        for r in runs
    )


def _queries(client, url: str) -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return len(ctx.captured_queries)


def _staff_client(client, superuser):
    client.force_login(superuser)
    client.get(RUNS)  # warm the session and permission caches
    return client


def test_every_list_page_sends_the_same_queries_at_10_and_at_1000_runs(client, superuser, user):
    add_runs(user, 0, 10)
    client = _staff_client(client, superuser)
    small = {url: _queries(client, url) for url in PAGES}
    add_runs(user, 10, 1000)
    big = {url: _queries(client, url) for url in PAGES}
    assert big == small


def test_rest_runs_of_a_session_send_the_same_queries_whatever_the_runs_stored(api_client, user):
    add_runs(user, 0, 10)
    api_client.force_login(user)
    url = "/api/diagnosis/bulkses0000000/runs/?status=SUCCESS"
    small = _queries(api_client, url)
    add_runs(user, 10, 1000)
    assert _queries(api_client, url) == small


def test_the_count_is_capped(client, superuser, user, monkeypatch):
    add_runs(user, 0, 60)
    monkeypatch.setattr(CappedCountPaginator, "cap", 25)
    response = _staff_client(client, superuser).get(RUNS)
    assert response.context["cl"].result_count == 25 and response.context["cl"].paginator.capped
    assert "more than 25 diagnosis runs" in response.content.decode()


def test_the_count_selects_only_the_key_not_the_lists_annotations(client, superuser, user):
    """The run list annotates each row with its evaluation scores (two correlated subqueries); the capped
    count must not compute them for every counted row, or reach past the filter's index for them (at a
    million runs that took the FAILED list from 0.08 to 0.8 s). A filter still narrows the count."""
    add_runs(user, 0, 60)
    client = _staff_client(client, superuser)
    for url in PAGES[:9]:
        with CaptureQueriesContext(connection) as ctx:
            response = client.get(url)
        counts = [
            q["sql"] for q in ctx.captured_queries if q["sql"].startswith("SELECT COUNT(*) FROM (SELECT")
        ]
        assert len(counts) == 1, (url, counts)
        assert "evaluations_score" not in counts[0], url
    response = client.get(RUNS + "?status__exact=FAILED")
    assert response.context["cl"].result_count == 6  # runs 7, 17, … 57


def test_a_sorted_list_is_tied_by_the_primary_key_in_its_direction(client, superuser, user):
    add_runs(user, 0, 30)
    client = _staff_client(client, superuser)
    up = client.get(RUNS + "?o=7")  # tokens, ascending
    down = client.get(RUNS + "?o=-7")
    assert up.context["cl"].get_ordering(up.wsgi_request, up.context["cl"].root_queryset) == [
        "tokens_total",
        "pk",
    ]
    assert down.context["cl"].get_ordering(down.wsgi_request, down.context["cl"].root_queryset) == [
        "-tokens_total",
        "-pk",
    ]
    tokens = [r.tokens_total for r in up.context["cl"].result_list]
    assert tokens == sorted(tokens)


@pytest.mark.django_db(transaction=True)  # InnoDB's FULLTEXT index sees committed rows only
def test_search_finds_runs_by_id_prefix_session_and_words(client, superuser, user):
    add_runs(user, 0, 100)
    client = _staff_client(client, superuser)

    def found(q):
        return {r.run_id for r in client.get(RUNS, {"q": q}).context["cl"].result_list}

    assert found("bulk0000000042") == {"bulk0000000042"}
    assert found("bulk000000004") == {f"bulk000000004{i}" for i in range(10)}
    assert found("bulkses0000003") == {f"bulk00000000{30 + i}" for i in range(10)}
    assert found("redis") == {f"bulk{n:010d}" for n in range(100) if n % 50 == 1}
    assert found("nothing-like-this") == set()


# --------------------------------------------------------------------------------------------------
# MariaDB: the plans
# --------------------------------------------------------------------------------------------------
EXPLAINED = [
    RUNS,
    RUNS + "?status__exact=FAILED",
    RUNS + "?audit_complete=no",
    RUNS + "?o=7",
    RUNS + "?o=-11",  # cost, descending
    RUNS + "?cost=unavailable",
    RUNS + "?q=bulk0000000042",
]
# Sessions and audit rows are too few here (3,000) for the optimizer to prefer the index over sorting
# them all; B6 checks their plans at 100,000 sessions and 3,000,000 events.


@pytest.mark.skipif(connection.vendor != "mysql", reason="needs MariaDB/MySQL (DATABASE_URL=mysql://…)")
@pytest.mark.django_db(transaction=True)
def test_the_main_list_queries_read_an_index_of_diagnosis_run(client, superuser, user):
    """Slow on MariaDB (≈ 36 s): the optimizer prefers reading an index to sorting only with tens of
    thousands of rows, so 33,000 runs are stored before the plans are read."""
    # Enough rows that the optimizer prefers reading an index up to the LIMIT to sorting the table
    # (with a few thousand rows, MariaDB rightly sorts them all).
    add_runs(user, 0, 3000)
    add_runs(user, 3000, 30_000, audit_rows=False)
    # The plan of an unfiltered ORDER BY … LIMIT follows the table's statistics, which InnoDB refreshes
    # in the background: left to that, a plan made from the statistics of an earlier test's nearly empty
    # table scans. ANALYZE TABLE makes them this table's (it commits, hence a transactional test).
    with connection.cursor() as cur:
        cur.execute("ANALYZE TABLE diagnosis_run")
        cur.fetchall()
    client = _staff_client(client, superuser)
    checked = 0
    for url in EXPLAINED:
        with CaptureQueriesContext(connection) as ctx:
            assert client.get(url).status_code == 200
        for query in ctx.captured_queries:
            sql = query["sql"]
            if not sql.startswith("SELECT") or "LIMIT 100" not in sql:
                continue  # the page query (the capped count is checked by B6 at a million runs)
            with connection.cursor() as cur:
                cur.execute("EXPLAIN " + sql)
                names = [c[0] for c in cur.description]
                plan = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
            for step in plan:
                if step["table"] == "diagnosis_run":
                    checked += 1
                    assert step["key"], (url, plan, sql[-200:])
                    assert step["type"] != "ALL", (url, step)
                    extra = step.get("Extra") or ""
                    assert "filesort" not in extra or int(step["rows"] or 0) < 50, (url, step)
    assert checked >= len(EXPLAINED)
