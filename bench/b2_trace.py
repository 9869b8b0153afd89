"""B2 — reading a trace: the real endpoint against raw SQL fetching the same rows, and at scale.

*Endpoint*: `GET /api/diagnosis/{sessionId}/trace?runId=…` through Django's test client (the whole
middleware stack, URL routing, session authentication of a logged-in owner, the DRF view, the selector,
chain verification, the serializer and JSON rendering), for runs of 10, 100 and 500 timeline events
recorded through the real recorder. *Floor*: a raw `MySQLdb` connection fetching the same rows — the
session and user rows the request authenticates with, the run row, its events, steps and tools, and
what the endpoint reads besides to verify the run (its reasoning rows as stored, its transparency-log
leaf with the covering checkpoint), every column — with the same WHERE clauses and orders.

*Scale*: the same reads with 10 000 and with 1 000 000 background runs stored. Background runs are
bulk-generated server side (`INSERT … SELECT` from MariaDB's `seq_1_to_N` sequence tables, in chunks),
each with 1 run row, 3 timeline events, 1 model step and 1 tool row of realistic sizes (one session per 10
runs). The 1 000 000-run data set lives in its own database (`<db>_big`) and is kept between bench runs
(it takes minutes to build once); the 10 000-run one is rebuilt when its count differs. Reads alternate
between the two databases within each repetition.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.db import connection, connections
from django.test import Client
from django.test.utils import CaptureQueriesContext

from audit.write import DeclaredToolCall, RunRecorder
from bench import workload
from bench.env import create_database, raw_connect
from bench.stats import Row, spread
from diagnosis import services
from diagnosis.models import ChatSession, DiagnosisRun

SIZES = (10, 100, 500)
BG_EVENTS, BG_STEPS, BG_TOOLS = 3, 1, 1
RUNS_PER_SESSION = 10
CHUNK = 50_000
BG_PREFIX = "bg"
# One background run in AUDIT_FAILED_EVERY has a failed audit write (its stored `audit_complete` false):
# at 10 000 runs that is a full admin page (100 rows) for B6's "audit complete no" filter, as at 1 000 000.
AUDIT_FAILED_EVERY = 100
AUDIT_FAILED_AT = 5


# --------------------------------------------------------------------------------------------------
# Measured runs
# --------------------------------------------------------------------------------------------------
def record_sized_run(run: DiagnosisRun, events: int) -> DiagnosisRun:
    """A finished run of exactly `events` timeline events, recorded through the recorder: RUN_STARTED,
    cycles of a model step declaring two tools and their starts and terminals (6 events), evidence-guard
    events to pad, RELEASE_DECISION and RUN_FINISHED."""
    if events < 4:
        raise ValueError("a sized run has at least 4 events")
    inp = workload.make_inputs()
    rec = RunRecorder.for_run(run, group_commit=False)
    rec.run_started(agent_flow="DIAGNOSIS_AGENT")
    left = events - 3
    step = 0
    while left >= 6:
        step += 1
        calls = [
            DeclaredToolCall(
                tool_call_id=f"s{step}_c{i}", name="lookup_knowledge", arguments='{"query": "q"}'
            )
            for i in range(2)
        ]
        rec.model_step(
            step_index=step,
            agent_name="diagnosis_agent",
            model="agent-m",
            usage=workload.usage(800, 60),
            reasoning=inp.first_capture,
            tool_calls=calls,
            finish_reason="tool_calls",
            duration_ms=900,
        )
        for call in calls:
            rec.tool_started(tool_call_id=call.tool_call_id, tool_name=call.name, input_params={"query": "q"})
        for call in calls:
            rec.tool_finished(
                tool_call_id=call.tool_call_id,
                status="SUCCEEDED",
                output=inp.tool_output,
                retrieval=inp.retrieval,
            )
        left -= 6
    for _ in range(left):
        rec.evidence_guard(retry=False, passed=True, cited=["kb:mysql-replication-lag#1"])
    rec.release(decision="PUBLISHED", reason="guards passed")
    rec.finish(status="SUCCESS", content=workload.ANSWER)
    run.refresh_from_db()
    assert run.expected_events == events and rec.audit_write_failures == 0
    return run


@dataclass
class Target:
    """One measured run and how to read it both ways."""

    events: int
    session_id: str
    run_id: str
    url: str


def make_targets(user, sizes=SIZES) -> list[Target]:
    session = services.create_session(owner=user, title="bench B2")
    out = []
    for n in sizes:
        run = record_sized_run(services.create_run(session=session, query=f"trace of {n} events"), n)
        out.append(
            Target(
                n,
                session.session_id,
                run.run_id,
                f"/api/diagnosis/{session.session_id}/trace?runId={run.run_id}",
            )
        )
    return out


# --------------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------------
RAW_QUERIES = (
    # The rows the request needs to authenticate its user (the session cookie's row, the user's row).
    ("SELECT * FROM django_session WHERE session_key = %s", "session"),
    ("SELECT * FROM auth_user WHERE id = %s", "user"),
    ("SELECT * FROM diagnosis_run WHERE session_id = %s AND run_id = %s", "run"),
    ("SELECT * FROM diagnosis_trace_event WHERE run_id = %s ORDER BY sequence_no", "events"),
    ("SELECT * FROM agent_step WHERE run_id = %s ORDER BY step_index, id", "steps"),
    ("SELECT * FROM tool_invocation WHERE run_id = %s ORDER BY started_at, id", "tools"),
    # What the endpoint reads besides to verify the run (since row digests and the transparency log):
    # its reasoning rows as stored, and its log leaf with the first checkpoint covering it.
    ("SELECT * FROM agent_reasoning_audit WHERE run_id = %s ORDER BY run_id, step_index, id", "reasoning"),
    (
        "SELECT l.*, (SELECT c.checkpoint_hash FROM audit_checkpoint c WHERE c.tree_size > l.leaf_index "
        "ORDER BY c.tree_size LIMIT 1) FROM audit_log_leaf l WHERE l.run_id = %s",
        "leaf",
    ),
)


def raw_read(cur, target: Target, auth: tuple[str, int]) -> int:
    """The same rows with raw SQL; `auth` is (session key, user id) of the logged-in client."""
    rows = 0
    for sql, what in RAW_QUERIES:
        if what == "run":
            params = (target.session_id, target.run_id)
        elif what == "session":
            params = (auth[0],)
        elif what == "user":
            params = (auth[1],)
        else:
            params = (target.run_id,)
        cur.execute(sql, params)
        found = len(cur.fetchall())
        if not found and what in ("session", "user", "run"):
            raise RuntimeError(f"raw read found no {what} row")
        rows += found
    return rows


def endpoint_read(client: Client, target: Target) -> bytes:
    response = client.get(target.url)
    if response.status_code != 200:
        raise RuntimeError(f"trace endpoint answered {response.status_code}")
    return response.content


def timed_reads(fn, n: int) -> float:
    """Median seconds of `n` calls (after two warm-up calls)."""
    fn()
    fn()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2]


def paired_reads(raw, endpoint, n: int) -> tuple[float, float]:
    """Median seconds of `n` calls of each, interleaved call by call (after two warm-up calls each), so
    that both sides see the same load on a shared machine."""
    for _ in range(2):
        raw()
        endpoint()
    raws, ends = [], []
    for i in range(n):
        for fn, out in ((raw, raws), (endpoint, ends)) if i % 2 == 0 else ((endpoint, ends), (raw, raws)):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    raws.sort()
    ends.sort()
    return raws[n // 2], ends[n // 2]


def login_client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def query_count(client: Client, target: Target) -> tuple[int, list[str]]:
    with CaptureQueriesContext(connection) as ctx:
        endpoint_read(client, target)
    return len(ctx.captured_queries), [q["sql"] for q in ctx.captured_queries]


def explain(cur, sql: str) -> list[dict]:
    """EXPLAIN of a captured query (MariaDB), as dicts."""
    cur.execute("EXPLAIN " + sql)
    cols = [c[0] for c in cur.description]
    return [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]


def check_body(body: bytes, target: Target) -> None:
    data = json.loads(body)
    summary = data["summary"]
    assert summary["returned"]["events"] == target.events, summary
    assert summary["auditComplete"] and summary["chainValid"], summary


# --------------------------------------------------------------------------------------------------
# Background data
# --------------------------------------------------------------------------------------------------
def _columns(model) -> list:
    return [f for f in model._meta.concrete_fields if not f.primary_key]


def _literal(cur, value) -> str:
    return cur.connection.literal(value).decode() if not isinstance(value, bool) else ("1" if value else "0")


def _select_list(cur, model, exprs: dict[str, str]) -> tuple[str, str]:
    """Column list and SELECT expressions for `model`: `exprs` by attname, model defaults otherwise."""
    cols, sel = [], []
    for f in _columns(model):
        cols.append(f"`{f.column}`")
        if f.attname in exprs:
            sel.append(exprs[f.attname])
        else:
            default = f.get_default()
            if isinstance(default, (dict, list)):
                default = json.dumps(default)
            sel.append("NULL" if default is None else _literal(cur, default))
    return ", ".join(cols), ", ".join(sel)


def background_count(cur) -> int:
    cur.execute(f"SELECT COUNT(*) FROM diagnosis_run WHERE run_id LIKE '{BG_PREFIX}%%'")
    return int(cur.fetchone()[0])


def generate_background(database: str, total: int, owner_id: int, log=print) -> float:
    """Make `database` hold exactly… at least `total` background runs (adds the missing ones); seconds."""
    from audit.models import AgentStep, ToolInvocation, TraceEvent

    conn = raw_connect(database)
    cur = conn.cursor()
    have = background_count(cur)
    # Sessions generated before chat_session had its `purpose` column were given '' by INSERT IGNORE,
    # which no list shows (experiment replays and unknown purposes are not production): repair them.
    from diagnosis.models import RunPurpose

    cur.execute(
        f"UPDATE chat_session SET purpose = %s WHERE purpose = '' AND session_id LIKE '{BG_PREFIX}%%'",
        (RunPurpose.PRODUCTION,),
    )
    if have >= total:
        _audit_failures_as_generated(cur, have, log)
        conn.close()
        return 0.0
    start = time.perf_counter()
    details = json.dumps(
        {
            "attempt": 1,
            "model": "router-m",
            "ok": True,
            "intent": "DIAGNOSIS",
            "confidence": 0.92,
            "reason": "replication symptom " + "x" * 200,
            "providerAttempts": [{"attempt": 1, "status": 200, "durationMs": 310}],
        }
    )
    tool_input = json.dumps({"query": "replication lag cause", "top_k": 5})
    run_id = f"CONCAT('{BG_PREFIX}', LPAD(s.seq, 10, '0'))"
    session_id = f"CONCAT('{BG_PREFIX}ses', LPAD(s.seq DIV {RUNS_PER_SESSION}, 9, '0'))"
    created = "NOW(6) - INTERVAL s.seq SECOND"
    session_created = f"NOW(6) - INTERVAL ((s.seq DIV {RUNS_PER_SESSION}) * {RUNS_PER_SESSION} + 9) SECOND"
    # A mix the lists can filter on (B6): 1 % FAILED and 1 % CANCELLED (no release, no content), 5 % of
    # the successes BLOCKED, intents and providers in fixed shares, 1 % with a failed audit write
    # (their stored `audit_complete` is false), 2 % with draft text shown; 1 % of the questions name
    # Redis and 1 % are in Chinese (the search cases). Every stored list fact is what `audit.read.list_facts`
    # decides for such a row.
    status = "CASE s.seq % 100 WHEN 7 THEN 'FAILED' WHEN 13 THEN 'CANCELLED' ELSE 'SUCCESS' END"
    audit_failed = f"s.seq % {AUDIT_FAILED_EVERY} = {AUDIT_FAILED_AT}"
    ok = "s.seq % 100 NOT IN (7, 13)"
    query = (
        "CASE s.seq % 100 WHEN 42 THEN 'Redis latency spikes on the session cache cluster' "
        "WHEN 43 THEN '为什么报表副本的复制延迟这么高？' "
        "ELSE 'Why is replication lagging on the reporting replica?' END"
    )
    for lo in range(have + 1, total + 1, CHUNK):
        hi = min(total, lo + CHUNK - 1)
        seq = f"seq_{lo}_to_{hi}"
        # Sessions: one per RUNS_PER_SESSION runs (INSERT IGNORE: a session may span two chunks).
        # Every other column takes its model default (`_select_list`), so a column added later (as
        # `purpose` was) is never left to INSERT IGNORE's implicit ''.
        session_cols, session_sel = _select_list(
            cur,
            ChatSession,
            {
                "session_id": session_id,
                "owner_id": str(int(owner_id)),
                "title": "'background'",
                "created_at": session_created,
                "updated_at": "NOW(6)",
                "run_count": "0",
            },
        )
        cur.execute(
            f"INSERT IGNORE INTO chat_session ({session_cols}) SELECT DISTINCT {session_sel} FROM {seq} s"
        )
        cols, sel = _select_list(
            cur,
            DiagnosisRun,
            {
                "run_id": run_id,
                "session_id": session_id,
                "query": query,
                "status": status,
                "intent": (
                    "CASE s.seq % 10 WHEN 1 THEN 'KNOWLEDGE' WHEN 2 THEN 'CHITCHAT' ELSE 'DIAGNOSIS' END"
                ),
                "provider": "IF(s.seq % 4 = 0, 'demo', 'openai')",
                "release_decision": f"IF({ok}, IF(s.seq % 20 = 3, 'BLOCKED', 'PUBLISHED'), NULL)",
                "content": f"IF({ok} AND s.seq % 20 <> 3, '{workload.ANSWER}', '')",
                "created_at": created,
                "started_at": created,
                "finished_at": created,
                "updated_at": created,
                "total_duration_ms": "(s.seq * 104729) % 60000",
                "tokens_total": "(s.seq * 7919) % 5000",
                "tokens_reconciled": "1",
                "draft_chars": "IF(s.seq % 50 = 0, 120, 0)",
                "expected_events": str(BG_EVENTS),
                "expected_steps": str(BG_STEPS),
                "expected_tools": str(BG_TOOLS),
                "audit_write_failures": f"IF({audit_failed}, 1, 0)",
                "persisted_events": str(BG_EVENTS),
                "persisted_steps": str(BG_STEPS),
                "persisted_tools": str(BG_TOOLS),
                "audit_complete": f"IF({audit_failed}, 0, 1)",
            },
        )
        cur.execute(f"INSERT INTO diagnosis_run ({cols}) SELECT {sel} FROM {seq} s")
        cols, sel = _select_list(
            cur,
            TraceEvent,
            {
                "run_id": run_id,
                "session_id": session_id,
                "sequence_no": "e.seq",
                "phase": "'ROUTING'",
                "event_type": "'ROUTING_ATTEMPT'",
                "status": "'OK'",
                "summary": "'attempt 1: DIAGNOSIS (0.92)'",
                "details": _literal(cur, details),
                "prev_hash": "SHA2(CONCAT(s.seq, '-', e.seq - 1), 256)",
                "hash": "SHA2(CONCAT(s.seq, '-', e.seq), 256)",
                "created_at": created,
            },
        )
        cur.execute(
            f"INSERT INTO diagnosis_trace_event ({cols}) SELECT {sel} FROM {seq} s "
            f"JOIN seq_1_to_{BG_EVENTS} e ORDER BY s.seq, e.seq"
        )
        cols, sel = _select_list(
            cur,
            AgentStep,
            {
                "run_id": run_id,
                "session_id": session_id,
                "step_index": "1",
                "agent_name": "'diagnosis_agent'",
                "model": "'agent-m'",
                "finish_reason": "'tool_calls'",
                "tool_call_ids": "'[\"call_0\"]'",
                "has_tool_call": "1",
                "usage_available": "1",
                "prompt_tokens": "800",
                "completion_tokens": "60",
                "total_tokens": "860",
                "content_source": "'PROVIDER_REASONING'",
                "created_at": created,
            },
        )
        cur.execute(f"INSERT INTO agent_step ({cols}) SELECT {sel} FROM {seq} s")
        cols, sel = _select_list(
            cur,
            ToolInvocation,
            {
                "run_id": run_id,
                "session_id": session_id,
                "step_index": "1",
                "tool_call_id": "'call_0'",
                "tool_name": "'lookup_knowledge'",
                "status": "'SUCCEEDED'",
                "input_params": _literal(cur, tool_input),
                "output_preview": "REPEAT('x', 480)",
                "output_length": "980",
                "output_sha256": "SHA2(s.seq, 256)",
                "started_at": created,
                "finished_at": created,
                "duration_ms": "12",
                "created_at": created,
                "updated_at": created,
            },
        )
        cur.execute(f"INSERT INTO tool_invocation ({cols}) SELECT {sel} FROM {seq} s")
        if (hi - have) % 200_000 < CHUNK or hi == total:
            log(f"  B2 background: {hi:,} runs in {database} ({time.perf_counter() - start:.0f} s)")
    # The sessions' stored run counts and newest runs (`diagnosis.services.create_run` keeps them live).
    cur.execute(
        "UPDATE chat_session c JOIN (SELECT session_id, COUNT(*) n, MAX(created_at) m FROM diagnosis_run "
        f"WHERE run_id LIKE '{BG_PREFIX}%%' GROUP BY session_id) r ON r.session_id = c.session_id "
        "SET c.run_count = r.n, c.last_run_at = r.m"
    )
    cur.execute(
        "ANALYZE TABLE diagnosis_run, chat_session, diagnosis_trace_event, agent_step, tool_invocation"
    )
    cur.fetchall()
    conn.close()
    return time.perf_counter() - start


def _audit_failures_as_generated(cur, have: int, log=print) -> None:
    """A kept data set generated with an earlier share of failed audit writes (1 in 1 000) gets today's
    (`AUDIT_FAILED_EVERY`): one counting query when it already has it."""
    seq = f"CAST(SUBSTRING(run_id, {len(BG_PREFIX) + 1}) AS UNSIGNED)"
    failed = f"{seq} % {AUDIT_FAILED_EVERY} = {AUDIT_FAILED_AT}"
    cur.execute(
        f"SELECT COUNT(*) FROM diagnosis_run WHERE run_id LIKE '{BG_PREFIX}%%' AND audit_write_failures > 0"
    )
    expected = (have - AUDIT_FAILED_AT) // AUDIT_FAILED_EVERY + 1 if have >= AUDIT_FAILED_AT else 0
    if int(cur.fetchone()[0]) == expected:
        return
    start = time.perf_counter()
    cur.execute(
        f"UPDATE diagnosis_run SET audit_write_failures = IF({failed}, 1, 0), "
        f"audit_complete = IF({failed}, 0, 1) WHERE run_id LIKE '{BG_PREFIX}%%'"
    )
    took = time.perf_counter() - start
    log(f"  B2 background: failed audit writes set to 1 in {AUDIT_FAILED_EVERY} ({took:.0f} s)")


def use_database(name: str) -> None:
    """Point Django's default connection at another database of the same server (closes it)."""
    conn = connections["default"]
    conn.close()
    conn.settings_dict["NAME"] = name


def migrate_database(name: str) -> None:
    from django.core.management import call_command

    create_database(name)
    use_database(name)
    call_command("migrate", verbosity=0, interactive=False)


def _bench_owner():
    user, created = get_user_model().objects.get_or_create(username="bench-trace")
    if created:
        user.set_password("bench-trace-pw-1")
        user.save()
    return user


# --------------------------------------------------------------------------------------------------
# Scenarios
# --------------------------------------------------------------------------------------------------
def endpoint_vs_raw(*, reads: int, reps: int, database: str, log=print) -> tuple[list[Row], dict]:
    """Endpoint vs raw SQL for 10/100/500 events (in `database`), query counts and EXPLAINs."""
    use_database(database)
    user = _bench_owner()
    targets = make_targets(user)
    client = login_client(user)
    from django.conf import settings as dj_settings

    auth = (client.cookies[dj_settings.SESSION_COOKIE_NAME].value, user.pk)
    conn = raw_connect(database)
    cur = conn.cursor()
    evidence: dict = {"queries": {}, "explain": []}
    for t in targets:
        check_body(endpoint_read(client, t), t)
        count, sqls = query_count(client, t)
        evidence["queries"][t.events] = count
        if t.events == SIZES[-1]:
            evidence["sql"] = sqls
    ratios: dict[int, list[float]] = {t.events: [] for t in targets}
    ms: dict[int, tuple[list[float], list[float]]] = {t.events: ([], []) for t in targets}
    cpu: dict[int, list[float]] = {t.events: [] for t in targets}
    for rep in range(reps):
        for t in targets:
            r, e = paired_reads(
                lambda t=t: raw_read(cur, t, auth), lambda t=t: endpoint_read(client, t), reads
            )
            ratios[t.events].append(e / r)
            ms[t.events][0].append(e * 1e3)
            ms[t.events][1].append(r * 1e3)
            # The endpoint's own CPU per read (this process: the client, Django, the trace), beside
            # the floor's wall time: what bounds the ratio once the round trips are paid.
            start = time.process_time()
            for _ in range(reads):
                endpoint_read(client, t)
            cpu[t.events].append((time.process_time() - start) / reads * 1e3)
        log(
            f"  B2 rep {rep + 1}/{reps}: "
            + ", ".join(f"{n} ev {ms[n][0][-1]:.2f} ms vs raw {ms[n][1][-1]:.2f} ms" for n in ratios)
        )
    for sql in evidence.get("sql", []):
        if sql.lstrip().upper().startswith("SELECT"):
            evidence["explain"].append((sql, explain(cur, sql)))
    conn.close()
    counts = sorted(set(evidence["queries"].values()))
    rows = [
        Row(
            "B2",
            f"trace endpoint vs raw SQL, run of {n} events",
            f"{spread(ms[n][0]).median:.2f} ms vs {spread(ms[n][1]).median:.2f} ms; "
            f"{evidence['queries'][n]} queries; endpoint CPU {spread(cpu[n]).median:.2f} ms per read",
            spread(ratios[n]),
            2.0,
            extra={"cpu_ms": spread(cpu[n]), "floor_ms": spread(ms[n][1])},
        )
        for n in ratios
    ]
    rows.append(
        Row(
            "B2",
            "trace endpoint query count for 10 / 100 / 500 events",
            " / ".join(str(evidence["queries"][n]) for n in ratios),
            None,
            None,
            met_override=len(counts) == 1,
            note="constant" if len(counts) == 1 else "NOT constant",
        )
    )
    return rows, evidence


def growth(*, small: int, big: int, reads: int, reps: int, database: str, log=print) -> list[Row]:
    """Trace reads with `small` and with `big` background runs stored (two databases, alternated)."""
    big_db = f"{database}_big"
    dbs = {small: database, big: big_db}
    state = {}
    for n, name in dbs.items():
        migrate_database(name)
        user = _bench_owner()
        took = generate_background(name, n, user.pk, log=log)
        if took:
            log(f"  B2 background: {n:,} runs generated in {took:.0f} s")
        targets = make_targets(user)
        state[n] = (user, targets)
    results: dict[int, dict[int, list[float]]] = {n: {t: [] for t in SIZES} for n in dbs}
    for rep in range(reps):
        for n, name in dbs.items():
            use_database(name)
            user, targets = state[n]
            client = login_client(user)
            for t in targets:
                check_body(endpoint_read(client, t), t)
                results[n][t.events].append(timed_reads(lambda t=t, c=client: endpoint_read(c, t), reads))
        log(
            f"  B2 scale rep {rep + 1}/{reps}: "
            + ", ".join(
                f"{t} ev {results[small][t][-1] * 1e3:.2f} → {results[big][t][-1] * 1e3:.2f} ms"
                for t in SIZES
            )
        )
    use_database(database)
    rows = []
    for t in SIZES:
        ratio = spread([b / s for s, b in zip(results[small][t], results[big][t], strict=True)])
        rows.append(
            Row(
                "B2",
                f"trace read growth from {small:,} to {big:,} stored runs, run of {t} events",
                f"{spread(results[small][t]).median * 1e3:.2f} ms → "
                f"{spread(results[big][t]).median * 1e3:.2f} ms",
                ratio,
                1.2,
            )
        )
    return rows


def table_sizes(database: str) -> dict[str, int]:
    conn = raw_connect(database)
    cur = conn.cursor()
    out = {}
    for table in ("diagnosis_run", "diagnosis_trace_event", "agent_step", "tool_invocation"):
        cur.execute(f"SELECT COUNT(*) FROM {table}")
        out[table] = int(cur.fetchone()[0])
    cur.execute(
        "SELECT ROUND(SUM(data_length + index_length) / 1048576) FROM information_schema.tables "
        "WHERE table_schema = %s",
        (database,),
    )
    out["MiB"] = int(cur.fetchone()[0] or 0)
    conn.close()
    return out


__all__ = ["ChatSession", "endpoint_vs_raw", "growth", "table_sizes"]
