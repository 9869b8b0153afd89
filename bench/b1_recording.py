"""B1 — what recording a run costs, against raw autocommit statements in the same process.

The floor is derived from the recorder itself: one run is recorded through the recorder while an
`execute_wrapper` captures every INSERT and UPDATE it sends (the exact column values, ciphertexts
included); each row becomes one single-row autocommit statement on a raw `MySQLdb` connection (a
multi-row INSERT is split into one INSERT per row, `RETURNING` dropped). Replaying that list for a fresh
run id writes the same rows with the same values and sizes, every row durable before the next, with no
Python-side work but the driver's — the floor. Its statement count is the number of records per run.

Both sides run in one process against one database, interleaved per repetition, each over fresh runs
whose `diagnosis_run` rows are created beforehand (not timed).
"""

from __future__ import annotations

import asyncio
import re
import resource
import time
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.db import connection, transaction

from agent.runtime.supervisor import settle
from audit.write import RunRecorder
from bench import workload
from bench.env import raw_connect
from bench.stats import Row, spread
from diagnosis import services
from diagnosis.models import ChatSession, DiagnosisRun

_INSERT = re.compile(r"^\s*INSERT INTO (\S+) \((.*?)\) VALUES (.*?)(?:\s+RETURNING .*)?$", re.S)
# The recorder's fenced INSERT: each row a `SELECT %s, … WHERE EXISTS (lease epoch check)`, UNION ALL.
_GUARDED_INSERT = re.compile(r"^\s*INSERT INTO (\S+) \((.*?)\) (SELECT .*?)(?:\s+RETURNING .*)?$", re.S)


@dataclass(frozen=True)
class Statement:
    sql: str
    params: tuple


class _Capture:
    """Execute wrapper keeping every INSERT/UPDATE with its final database parameters."""

    def __init__(self) -> None:
        self.statements: list[tuple[str, tuple, bool]] = []

    def __call__(self, execute, sql, params, many, context):
        head = sql.lstrip()[:6].upper()
        if head in ("INSERT", "UPDATE"):
            self.statements.append((sql, tuple(params or ()), many))
        return execute(sql, params, many, context)


def _single_rows(sql: str, params: tuple) -> list[Statement]:
    """One single-row INSERT per row of a (multi-row) INSERT; UPDATEs as they are."""
    if not sql.lstrip().upper().startswith("INSERT"):
        return [Statement(sql, params)]
    match = _INSERT.match(sql)
    guarded = None if match is not None else _GUARDED_INSERT.match(sql)
    if match is None and guarded is None:
        raise ValueError("unrecognised INSERT shape")
    table, columns = (match or guarded).group(1), (match or guarded).group(2)
    width = columns.count(",") + 1
    if guarded is not None:
        # The floor writes the rows alone: each row's values without its fence parameters.
        per_row = guarded.group(3).split(" UNION ALL ")[0].count("%s")
        params = tuple(p for i in range(0, len(params), per_row) for p in params[i : i + width])
    row_sql = f"INSERT INTO {table} ({columns}) VALUES ({', '.join(['%s'] * width)})"
    if len(params) % width:
        raise ValueError("parameter count is not a multiple of the column count")
    return [Statement(row_sql, params[i : i + width]) for i in range(0, len(params), width)]


def bench_user():
    user, _ = get_user_model().objects.get_or_create(
        username="bench", defaults={"is_staff": True, "is_superuser": True}
    )
    return user


def new_runs(session: ChatSession, n: int, label: str) -> list[DiagnosisRun]:
    """`n` PENDING runs (untimed set-up; the recorder's work starts with RUN_STARTED)."""
    return [
        services.create_run(session=session, query=f"{label} {i}: why is replication lagging?")
        for i in range(n)
    ]


def capture_floor(session: ChatSession, inputs: workload.RunInputs) -> tuple[list[Statement], str]:
    """Record one run through the recorder (direct path) and return its rows as single-row statements,
    with the template run id to substitute."""
    run = new_runs(session, 1, "floor-template")[0]
    cap = _Capture()
    # Inside an atomic block the recorder sends one statement per table and update (savepoints around
    # each decision), which is what the capture needs; the savepoint statements are not kept.
    with transaction.atomic(), connection.execute_wrapper(cap):
        workload.record_run(RunRecorder.for_run(run, group_commit=False), inputs)
    statements: list[Statement] = []
    for sql, params, many in cap.statements:
        if many:
            raise ValueError("executemany is not expected from the recorder")
        statements.extend(_single_rows(sql, params))
    return statements, run.run_id


def floor_plan(template: list[Statement], template_run: str, run_ids: list[str]) -> list[list[Statement]]:
    """The template's statements for each run id (built before timing)."""
    plans = []
    for run_id in run_ids:
        plans.append(
            [Statement(s.sql, tuple(run_id if p == template_run else p for p in s.params)) for s in template]
        )
    return plans


def run_floor(conn, plans: list[list[Statement]]) -> float:
    """Execute each run's statements in autocommit; seconds."""
    cur = conn.cursor()
    start = time.perf_counter()
    for plan in plans:
        for s in plan:
            cur.execute(s.sql, s.params)
    elapsed = time.perf_counter() - start
    cur.close()
    return elapsed


def run_recorder(runs: list[DiagnosisRun], inputs: workload.RunInputs, *, group_commit: bool) -> float:
    recorders = [RunRecorder.for_run(r, group_commit=group_commit) for r in runs]
    start = time.perf_counter()
    for rec in recorders:
        workload.record_run(rec, inputs)
    elapsed = time.perf_counter() - start
    assert all(r.audit_write_failures == 0 for r in recorders), "audit write failed during the bench"
    return elapsed


def run_concurrent(runs: list[DiagnosisRun], inputs: workload.RunInputs, *, group_commit: bool) -> float:
    """All runs at once from one event loop, each decision awaited through the runtime's DB pool."""
    return run_concurrent_timed(runs, inputs, group_commit=group_commit)[0]


def run_concurrent_timed(
    runs: list[DiagnosisRun], inputs: workload.RunInputs, *, group_commit: bool
) -> tuple[float, float]:
    """`run_concurrent`, and the process's CPU seconds (user + system, every thread) over the same span."""
    from agent.runtime.db import db, shutdown_pools

    recorders = [RunRecorder.for_run(r, group_commit=group_commit) for r in runs]

    async def main() -> tuple[float, float]:
        # Warm the pool's threads and connections so that connecting is not part of the figure.
        await asyncio.gather(*(db(_connect) for _ in range(32)))
        cpu, start = _process_cpu(), time.perf_counter()
        await asyncio.gather(*(workload.record_run_async(rec, inputs, db) for rec in recorders))
        return time.perf_counter() - start, _process_cpu() - cpu

    try:
        elapsed, cpu = asyncio.run(main())
    finally:
        shutdown_pools()
    assert all(r.audit_write_failures == 0 for r in recorders), "audit write failed during the bench"
    return elapsed, cpu


def _process_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def _connect() -> None:
    connection.ensure_connection()  # the calling pool thread's own connection


def check_complete(runs: list[DiagnosisRun]) -> None:
    """Every recorded run stored exactly what it expected (nothing lost), chain valid."""
    from audit.models import AgentStep, ToolInvocation, TraceEvent
    from audit.verify.hash_chain import verify_chain

    for run in runs:
        run.refresh_from_db()
        events = list(TraceEvent.objects.filter(run_id=run.run_id).order_by("sequence_no"))
        assert len(events) == run.expected_events == workload.EVENTS_PER_RUN, run.run_id
        assert AgentStep.objects.filter(run_id=run.run_id).count() == run.expected_steps
        assert ToolInvocation.objects.filter(run_id=run.run_id).count() == run.expected_tools
        assert run.audit_write_failures == 0 and run.status == "SUCCESS"
        assert verify_chain(events).valid


def sequential(*, runs_per_rep: int, reps: int, database: str, log=print) -> list[Row]:
    """One run at a time: recorder (direct and group commit) vs the autocommit floor."""
    inputs = workload.make_inputs()
    session = services.create_session(owner=bench_user(), title="bench B1")
    template, template_run = capture_floor(session, inputs)
    records = len(template)
    conn = raw_connect(database)
    floor_s, direct_s, grouped_s = [], [], []
    try:
        # Warm-up: one batch of each, not counted.
        run_floor(conn, floor_plan(template, template_run, [r.run_id for r in new_runs(session, 5, "w")]))
        run_recorder(new_runs(session, 5, "w"), inputs, group_commit=False)
        run_recorder(new_runs(session, 5, "w"), inputs, group_commit=True)
        for rep in range(reps):
            floor_runs = new_runs(session, runs_per_rep, "floor")
            plans = floor_plan(template, template_run, [r.run_id for r in floor_runs])
            direct_runs = new_runs(session, runs_per_rep, "direct")
            grouped_runs = new_runs(session, runs_per_rep, "grouped")
            order = [("floor", lambda p=plans: run_floor(conn, p))]
            order.append(("direct", lambda r=direct_runs: run_recorder(r, inputs, group_commit=False)))
            order.append(("grouped", lambda r=grouped_runs: run_recorder(r, inputs, group_commit=True)))
            if rep % 2:
                order.reverse()
            results = {name: fn() / runs_per_rep for name, fn in order}
            floor_s.append(results["floor"])
            direct_s.append(results["direct"])
            grouped_s.append(results["grouped"])
            log(
                f"  B1 rep {rep + 1}/{reps}: floor {results['floor'] * 1e3:.2f} ms/run, "
                f"recorder {results['direct'] * 1e3:.2f}, group commit {results['grouped'] * 1e3:.2f}"
            )
        check_complete(direct_runs + grouped_runs)
    finally:
        conn.close()

    direct_ratio = spread([d / f for d, f in zip(direct_s, floor_s, strict=True)])
    grouped_ratio = spread([g / f for g, f in zip(grouped_s, floor_s, strict=True)])
    floor = spread([f * 1e3 for f in floor_s])
    common = {"records": records, "floor_ms": floor}
    tags = tag_cost(reps=reps)
    tag_share = spread([100 * t * workload.EVENTS_PER_RUN / d for t, d in zip(tags, direct_s, strict=False)])
    return [
        Row(
            "B1",
            "write tag per event (HMAC-SHA-256 over the link hash, as the recorder makes it)",
            f"{spread([t * 1e6 for t in tags]).median:.2f} µs per event, "
            f"{spread([t * 1e6 * workload.EVENTS_PER_RUN for t in tags]).median:.0f} µs per run of "
            f"{workload.EVENTS_PER_RUN} events",
            tag_share,
            None,
            ratio_unit=" %",
            note="context: the share of the direct path's time per run; included in it",
        ),
        Row(
            "B1",
            "one run at a time, recorder (direct path) vs autocommit floor",
            f"{spread([d * 1e3 for d in direct_s]).median:.2f} ms vs {floor.median:.2f} ms per run "
            f"({records} records)",
            direct_ratio,
            1.3,
            extra={**common, "ms": spread([d * 1e3 for d in direct_s])},
        ),
        Row(
            "B1",
            "one run at a time, recorder (group commit) vs autocommit floor",
            f"{spread([g * 1e3 for g in grouped_s]).median:.2f} ms vs {floor.median:.2f} ms per run",
            grouped_ratio,
            1.3,
            extra={**common, "ms": spread([g * 1e3 for g in grouped_s])},
        ),
    ]


def tag_cost(*, reps: int, links: int = 20000) -> list[float]:
    """Seconds per write tag (`core.writeauth`: the key id, the domain, HMAC-SHA-256 over a link hash),
    one figure per repetition over `links` distinct hashes."""
    import hashlib

    from core import writeauth

    verifier = writeauth.verifier()
    hashes = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(links)]
    figures = []
    for _ in range(max(reps, 3)):
        start = time.perf_counter()
        for link in hashes:
            verifier.tag(writeauth.RUN, link)
        figures.append((time.perf_counter() - start) / links)
    return figures


def concurrent(*, runs: int, reps: int, database: str, log=print) -> list[Row]:
    """`runs` runs at once from one asyncio process, vs the sequential autocommit floor per record."""
    inputs = workload.make_inputs()
    session = services.create_session(owner=bench_user(), title="bench B1 concurrent")
    template, template_run = capture_floor(session, inputs)
    records = len(template)
    conn = raw_connect(database)
    floor_s, grouped_s, direct_s, grouped_cpu = [], [], [], []
    floor_runs_n = min(runs, 100)
    try:
        run_concurrent(new_runs(session, 20, "w"), inputs, group_commit=True)
        settle()  # as a serving process after start-up (`config.asgi`): its heap out of the full passes
        for rep in range(reps):
            floor_runs = new_runs(session, floor_runs_n, "floor")
            plans = floor_plan(template, template_run, [r.run_id for r in floor_runs])
            grouped_runs = new_runs(session, runs, "cgrouped")
            direct_runs = new_runs(session, runs, "cdirect")
            f = run_floor(conn, plans) / floor_runs_n
            g, g_cpu = (x / runs for x in run_concurrent_timed(grouped_runs, inputs, group_commit=True))
            d = run_concurrent(direct_runs, inputs, group_commit=False) / runs
            floor_s.append(f)
            grouped_s.append(g)
            grouped_cpu.append(g_cpu)
            direct_s.append(d)
            log(
                f"  B1c rep {rep + 1}/{reps}: floor {f * 1e3:.2f} ms/run, {runs} concurrent: "
                f"group commit {g * 1e3:.2f} ms/run ({g_cpu * 1e3:.2f} ms CPU), direct {d * 1e3:.2f} ms/run"
            )
        check_complete(grouped_runs + direct_runs)
    finally:
        conn.close()
    per_record_floor = spread([f * 1e6 / records for f in floor_s])
    cpu = spread([c * 1e3 for c in grouped_cpu])
    # The process is bound by its CPU under the GIL: the speed-up cannot exceed floor time / CPU time.
    bound = spread([f / c for f, c in zip(floor_s, grouped_cpu, strict=True)])
    return [
        Row(
            "B1",
            f"{runs} concurrent runs, one asyncio process, group commit: speed-up per record vs floor",
            f"{spread([g * 1e6 / records for g in grouped_s]).median:.0f} µs vs "
            f"{per_record_floor.median:.0f} µs per record; process CPU {cpu.median:.2f} ms per run "
            f"(floor / CPU {bound.median:.2f}×)",
            spread([f / g for f, g in zip(floor_s, grouped_s, strict=True)]),
            3.0,
            goal="min",
            extra={
                "cpu_ms_per_run": cpu,
                "floor_ms_per_run": spread([f * 1e3 for f in floor_s]),
                "bound": bound,
            },
        ),
        Row(
            "B1",
            f"{runs} concurrent runs, one asyncio process, direct path: speed-up per record vs floor",
            f"{spread([d * 1e6 / records for d in direct_s]).median:.0f} µs vs "
            f"{per_record_floor.median:.0f} µs per record",
            spread([f / d for f, d in zip(floor_s, direct_s, strict=True)]),
            None,
            goal="min",
            note="context: without group commit",
        ),
    ]
