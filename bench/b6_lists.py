"""B6 — the staff screens and list APIs at 10 000 and at 1 000 000 runs.

Every list page of the admin (runs: default, deep page, every filter, the date range, each sortable
column, each kind of search; sessions, trace events, steps, tools, reasoning rows, the access log,
feedback) and the REST lists (sessions as staff and as an owner, a second cursor page, a session's runs,
filtered) are requested through Django's test client as a logged-in superuser (the whole middleware
stack, the admin's change list or the DRF view, template rendering), in two databases of the same server
built by B2's generator: `<db>` with 10 000 background runs and `<db>_big` with 1 000 000 (kept between
bench runs). Requests alternate between the two databases within every repetition.

For each page: its median time at both sizes, the growth (big / small, per repetition), its query count
(the same at both sizes: constant per page), and the EXPLAIN of every SELECT it sends on the big
database, summarised per table (access type, key, estimated rows, filesort); a plan that reads a big
table whole (`type=ALL`, or `index` without a LIMIT, or a filesort of more than `BIG_ROWS` estimated
rows) is flagged. Targets: ≤ 300 ms per page at 1 000 000 runs (search ≤ 1 s), growth ≤ 1.5×.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from bench.b2_trace import (
    BG_PREFIX,
    RUNS_PER_SESSION,
    _bench_owner,
    background_count,
    generate_background,
    migrate_database,
)
from bench.b2_trace import use_database as _use
from bench.env import raw_connect
from bench.stats import Row, spread

PAGE_MS = 300.0
SEARCH_MS = 1000.0
GROWTH = 1.5
BIG_ROWS = 100_000  # an estimated row count above this (10 % of the big table) counts as reading it whole
BIG_TABLES = {
    "diagnosis_run",
    "chat_session",
    "diagnosis_trace_event",
    "agent_step",
    "tool_invocation",
    "agent_reasoning_audit",
    "reasoning_access_log",
    "run_feedback",
}


@dataclass(frozen=True)
class Page:
    name: str
    url: str
    search: bool = False
    as_owner: bool = False
    follow_next: bool = False  # time the second cursor page of `url`


def _run_id(n: int) -> str:
    return f"{BG_PREFIX}{n:010d}"


def _session_id(n: int) -> str:
    return f"{BG_PREFIX}ses{n // RUNS_PER_SESSION:09d}"


def pages() -> list[Page]:
    from django.contrib import admin

    from diagnosis.models import DiagnosisRun

    runs = "/admin/diagnosis/diagnosisrun/"
    display = ["action_checkbox", *admin.site._registry[DiagnosisRun].list_display]
    col = {name: display.index(name) for name in display}
    today = timezone.localdate()
    week = (
        f"created_at__gte={today - dt.timedelta(days=7)}T00:00:00%2B00:00"
        f"&created_at__lt={today + dt.timedelta(days=1)}T00:00:00%2B00:00"
    )
    return [
        Page("admin runs: default (newest first)", runs),
        Page("admin runs: page 50", runs + "?p=49"),
        Page("admin runs: status FAILED", runs + "?status__exact=FAILED"),
        Page("admin runs: release BLOCKED", runs + "?release_decision__exact=BLOCKED"),
        Page("admin runs: intent KNOWLEDGE", runs + "?intent__exact=KNOWLEDGE"),
        Page("admin runs: provider demo", runs + "?provider__exact=demo"),
        Page("admin runs: reconciled no", runs + "?tokens_reconciled__exact=0"),
        Page("admin runs: audit complete no", runs + "?audit_complete=no"),
        Page("admin runs: audit complete yes", runs + "?audit_complete=yes"),
        Page("admin runs: draft shown", runs + "?unverified=yes"),
        Page("admin runs: draft shown and blocked", runs + "?unverified=blocked"),
        Page("admin runs: created in the past 7 days", runs + "?" + week),
        Page("admin runs: FAILED + past 7 days", runs + "?status__exact=FAILED&" + week),
        Page("admin runs: sort by run id", runs + f"?o={col['run_and_session']}"),
        Page("admin runs: sort by tokens (desc)", runs + f"?o=-{col['tokens']}"),
        Page("admin runs: sort by duration", runs + f"?o={col['duration']}"),
        Page("admin runs: sort by created (oldest first)", runs + f"?o={col['created']}"),
        Page("admin runs: search exact run id", runs + f"?q={_run_id(4321)}", search=True),
        Page("admin runs: search run id prefix", runs + f"?q={_run_id(4321)[:-1]}", search=True),
        Page("admin runs: search session id", runs + f"?q={_session_id(4321)}", search=True),
        Page("admin runs: search a rare word (redis, 1 %)", runs + "?q=redis", search=True),
        Page("admin runs: search a common word (replication, 97 %)", runs + "?q=replication", search=True),
        Page("admin runs: search Chinese (复制延迟, 1 %)", runs + "?q=复制延迟", search=True),
        Page("admin sessions: default", "/admin/diagnosis/chatsession/"),
        Page("admin sessions: search id prefix", f"/admin/diagnosis/chatsession/?q={_session_id(4321)[:-1]}"),
        Page("admin trace events: default", "/admin/audit/traceevent/"),
        Page("admin trace events: event type", "/admin/audit/traceevent/?event_type__exact=ROUTING_ATTEMPT"),
        Page("admin trace events: search run id", f"/admin/audit/traceevent/?q={_run_id(4321)}"),
        Page("admin steps: default", "/admin/audit/agentstep/"),
        Page("admin tools: default", "/admin/audit/toolinvocation/"),
        Page("admin tools: status", "/admin/audit/toolinvocation/?status__exact=SUCCEEDED"),
        Page("admin reasoning rows: default", "/admin/reasoning/agentreasoningaudit/"),
        Page("admin access log: default", "/admin/reasoning/reasoningaccesslog/"),
        Page("admin feedback: default", "/admin/diagnosis/runfeedback/"),
        Page("REST sessions (staff)", "/api/diagnosis/sessions/"),
        Page("REST sessions (staff), second page", "/api/diagnosis/sessions/", follow_next=True),
        Page("REST sessions (owner of every session)", "/api/diagnosis/sessions/", as_owner=True),
        Page("REST runs of a session", f"/api/diagnosis/{_session_id(4321)}/runs/"),
        Page(
            "REST runs of a session, status SUCCESS",
            f"/api/diagnosis/{_session_id(4321)}/runs/?status=SUCCESS",
        ),
    ]


def _staff():
    user, created = get_user_model().objects.get_or_create(
        username="bench-lists", defaults={"is_staff": True, "is_superuser": True}
    )
    if created:
        user.set_password("bench-lists-pw-1")
        user.save()
    return user


def _clients() -> tuple[Client, Client]:
    staff, owner = Client(), Client()
    staff.force_login(_staff())
    owner.force_login(_bench_owner())
    return staff, owner


def _url(client: Client, page: Page) -> str:
    if not page.follow_next:
        return page.url
    response = client.get(page.url)
    return response.json()["next"]


def _get(client: Client, url: str) -> None:
    response = client.get(url)
    if response.status_code != 200:
        raise RuntimeError(f"B6: {url} answered {response.status_code}")


def explain(cur, sql: str) -> list[dict]:
    cur.execute("EXPLAIN " + sql)
    names = [c[0] for c in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def _plan_problems(plan: list[dict]) -> list[str]:
    problems = []
    for step in plan:
        table = str(step.get("table") or "")
        if table not in BIG_TABLES:
            continue
        rows = int(step.get("rows") or 0)
        extra = str(step.get("Extra") or "")
        if step.get("type") == "ALL" and rows > BIG_ROWS:
            problems.append(f"{table}: full scan of ~{rows:,} rows")
        if "filesort" in extra and rows > BIG_ROWS:
            problems.append(f"{table}: filesort of ~{rows:,} rows")
    return problems


def _summary(plan: list[dict]) -> str:
    return "; ".join(
        f"{p.get('table')}: {p.get('type')}"
        + (f" {p.get('key')}" if p.get("key") else "")
        + f" ~{int(p.get('rows') or 0):,}"
        + (" filesort" if "filesort" in str(p.get("Extra") or "") else "")
        for p in plan
        if p.get("table") in BIG_TABLES
    )


def _queries(client: Client, url: str) -> list[str]:
    with CaptureQueriesContext(connection) as ctx:
        _get(client, url)
    return [q["sql"] for q in ctx.captured_queries]


def prepare(database: str, sizes: dict[int, str], log=print) -> dict[int, str]:
    """Both databases migrated and holding at least their sizes of background runs; returns them keyed
    by the number of background runs they actually hold (a kept big database may hold more)."""
    held = {}
    for n, name in sizes.items():
        migrate_database(name)
        owner = _bench_owner()
        took = generate_background(name, n, owner.pk, log=log)
        if took:
            log(f"  B6 background: {n:,} runs generated in {took:.0f} s")
        _staff()
        conn = raw_connect(name)
        held[background_count(conn.cursor())] = name
        conn.close()
    _use(database)
    return held


def run_all(*, database: str, quick: bool, big: int | None = None, log=print) -> tuple[list[Row], dict]:
    sizes = prepare(database, {10_000: database, big or 1_000_000: f"{database}_big"}, log=log)
    small_n, big_n = sorted(sizes)
    reps, reads = (3, 2) if quick else (5, 3)
    todo = pages()
    times: dict[str, dict[int, list[float]]] = {p.name: {n: [] for n in sizes} for p in todo}
    counts: dict[str, dict[int, int]] = {p.name: {} for p in todo}
    plans: dict[str, tuple[str, list[str]]] = {}
    for n, name in sizes.items():
        _use(name)
        staff, owner = _clients()
        conn = raw_connect(name)
        cur = conn.cursor()
        for page in todo:
            client = owner if page.as_owner else staff
            url = _url(client, page)
            _get(client, url)  # warm
            sqls = _queries(client, url)
            counts[page.name][n] = len(sqls)
            if n == big_n:
                summaries, problems = [], []
                for sql in sqls:
                    if not sql.lstrip().upper().startswith("SELECT"):
                        continue
                    plan = explain(cur, sql)
                    problems += _plan_problems(plan)
                    if s := _summary(plan):
                        summaries.append(s)
                plans[page.name] = (" | ".join(dict.fromkeys(summaries)), problems)
        conn.close()
    for rep in range(reps):
        for n, name in sizes.items():
            _use(name)
            staff, owner = _clients()
            for page in todo:
                client = owner if page.as_owner else staff
                url = _url(client, page)
                start = time.perf_counter()
                for _ in range(reads):
                    _get(client, url)
                times[page.name][n].append((time.perf_counter() - start) / reads * 1e3)
        log(f"  B6 rep {rep + 1}/{reps} done")
    _use(database)
    rows, evidence = [], {"pages": [], "sizes": (small_n, big_n)}
    for page in todo:
        t = times[page.name]
        small_ms, big_ms = spread(t[small_n]).median, spread(t[big_n]).median
        ratio = spread([b / s for s, b in zip(t[small_n], t[big_n], strict=True)])
        plan, problems = plans.get(page.name, ("", []))
        same = len(set(counts[page.name].values())) == 1
        limit = SEARCH_MS if page.search else PAGE_MS
        met = ratio.median <= GROWTH and big_ms <= limit and same and not problems
        note = []
        if big_ms > limit:
            note.append(f"over {limit:g} ms")
        if not same:
            note.append("query count differs")
        if problems:
            note.append("; ".join(problems))
        rows.append(
            Row(
                "B6",
                page.name,
                f"{small_ms:.1f} ms → {big_ms:.1f} ms; {counts[page.name][big_n]} queries",
                ratio,
                GROWTH,
                met_override=met,
                note=", ".join(note),
            )
        )
        evidence["pages"].append(
            {
                "name": page.name,
                "small_ms": small_ms,
                "big_ms": big_ms,
                "growth": ratio.median,
                "queries": counts[page.name],
                "plan": plan,
                "problems": problems,
                "limit": limit,
                "met": met,
            }
        )
    return rows, evidence
