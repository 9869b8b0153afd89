"""B5 — `verify_audit` beside its floor, full and incremental, with its peak memory (issue 49).

A store of `runs` runs recorded through the real recorder (B1's workload: 23 events, 4 steps, 4 reasoning
rows and 3 tools each) and anchored lives in its own database (`<db>_tlog_verify`); on top of it `new`
more runs are recorded and anchored once, after a full verification wrote its state file (kept beside
the database under `.local/bench/`, so that later bench runs reuse both).

* **floor**: a raw SQL scan (MySQLdb, no ORM) of every column of the tables verification reads, and
  SHA-256 over the same bytes — what reading the rows and hashing them costs at the least;
* **full**: `verify_audit --all` with 1 and 2 worker processes, seconds per 1,000 runs and × the floor;
* **incremental**: `verify_audit --state` from the state written before the `new` runs, with 1 and 2
  workers, and again from the state it wrote (nothing new: the fixed cost): seconds;
* **at 1,000,000 runs** (not buildable here through the recorder): 10,000 new runs' incremental cost
  with 2 workers composed of measured parts — the fixed cost with 2 workers (nothing new) less its one
  part that grows with the store (each audited table's rows counted, `incremental._tallies`), that count
  timed per table on B2's 1,000,000-run store (`<db>_big`, when present), scaled to a 1,000,000-run store
  of this workload's rows per table and spread over 2 connections as `_tallies` spreads it, and 10,000 ×
  the measured cost per new run with 2 workers (beyond that fixed cost; the search for unanchored runs
  starts at the state's floor, so it grows with the new runs only). Twice: with the machine's buffer
  pool, and with the pool resized online to hold the counted indexes (`POOL_HOLDING`, then set back);
* **peak RSS**: of a `manage.py verify_audit --all` process and its workers, the largest (`VmHWM`).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from django.core.management import call_command

from bench.env import raw_connect
from bench.stats import Row, spread

ROOT = Path(__file__).resolve().parents[1]
# A buffer pool that holds the audited tables' counted indexes at 1,000,000 B1-sized runs (37 M rows).
POOL_HOLDING = 4 * 2**30
# The tables `verify_audit` reads for runs and the log (every column: the floor reads what it reads).
TABLES = (
    "diagnosis_run",
    "chat_session",
    "diagnosis_trace_event",
    "agent_step",
    "tool_invocation",
    "agent_reasoning_audit",
    "audit_run_review",
    "audit_log_leaf",
    "audit_log_node",
)


def floor_seconds(database: str) -> tuple[float, int]:
    """(seconds, bytes) of a raw scan of `TABLES` with SHA-256 over each row's values."""
    conn = raw_connect(database)
    try:
        cur = conn.cursor()
        cur.execute("SHOW TABLES")
        present = {row[0] for row in cur.fetchall()}
        started = time.perf_counter()
        total = 0
        for table in TABLES:
            if table not in present:
                continue
            cur.execute(f"SELECT * FROM `{table}`")
            while rows := cur.fetchmany(5000):
                for row in rows:
                    h = hashlib.sha256()
                    for value in row:
                        b = value if isinstance(value, bytes) else str(value).encode("utf-8")
                        h.update(b)
                        total += len(b)
                    h.digest()
        return time.perf_counter() - started, total
    finally:
        conn.close()


def tally_seconds(database: str, reps: int = 3, *, connections_n: int = 1) -> tuple[float, int]:
    """(seconds, rows counted) of the watermark count on `database` over `connections_n` connections, as
    `verify_audit --workers N` counts (best of `reps`)."""
    from audit.verify.incremental import watermarks
    from bench.b2_trace import use_database

    use_database(database)
    best = float("inf")
    for _ in range(reps):
        started = time.perf_counter()
        marks = watermarks(connections_n=connections_n)  # each audited table's highest id and rows
        best = min(best, time.perf_counter() - started)
    return best, sum(rows for _top, rows in marks.values())


def _timed(*args: str) -> tuple[float, str]:
    out = io.StringIO()
    started = time.perf_counter()
    call_command("verify_audit", *args, stdout=out)
    return time.perf_counter() - started, out.getvalue()


def _peak_rss_mb(database: str, *args: str) -> float:
    """Peak RSS (MB) of `manage.py verify_audit ARGS` on `database`: the largest high-water mark
    (`VmHWM`) of the process and of its forked workers, read from /proc while they run. Not the child's
    `ru_maxrss` from `wait4`: Linux carries the parent's high-water mark across exec into it (this bench
    process, several hundred MB after building the store), so it said nothing of `verify_audit`."""
    env = {**os.environ, "DATABASE_URL": f"mysql://root@127.0.0.1:3306/{database}", "CI": "1"}
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "verify_audit", "--skip-checks", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    peaks: dict[int, int] = {}
    while proc.poll() is None:
        for pid in _process_tree(proc.pid):
            peaks[pid] = max(peaks.get(pid, 0), _hwm_kib(pid))
        time.sleep(0.05)
    if proc.returncode:
        raise RuntimeError(f"verify_audit {' '.join(args)} exited {proc.returncode} in the bench")
    return max(peaks.values(), default=0) / 1024


def _process_tree(pid: int) -> list[int]:
    """`pid` and its descendants now (from /proc's children lists; empty once it has exited)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:  # gone meanwhile
            continue
    return out


def _hwm_kib(pid: int) -> int:
    """The process's peak resident set so far (`VmHWM`, KiB; 0 once it has exited)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _build(database: str, runs: int, new: int, state: Path, log) -> None:
    from django.db import transaction

    from audit.transparency.log import checkpoint
    from bench import b1_recording, workload
    from bench.b2_trace import migrate_database
    from bench.b5_tlog import _owner
    from diagnosis import services
    from diagnosis.models import DiagnosisRun

    migrate_database(database)
    have = DiagnosisRun.objects.count()
    if have == runs + new and state.exists():
        return
    if have:
        raise RuntimeError(f"{database} holds {have} runs, not {runs} + {new} with its state: drop it")
    session = services.create_session(owner=_owner(), title="bench B5 verify")
    inputs = workload.make_inputs()
    for at in range(0, runs, 500):
        # One transaction per 500 runs: set-up, not measured (a commit per decision, as the recorder
        # writes them, takes hours for a large store on a shared disk).
        with transaction.atomic():
            made = b1_recording.new_runs(session, min(500, runs - at), f"b5v{at}")
            b1_recording.run_recorder(made, inputs, group_commit=False)
        checkpoint(full_scan=True)
        log(f"  B5 verify: recorded and anchored {at + len(made):,} runs in {database}")
    state.parent.mkdir(parents=True, exist_ok=True)
    call_command("verify_audit", "--all", "--state", str(state), stdout=io.StringIO())
    with transaction.atomic():
        made = b1_recording.new_runs(session, new, "b5new")
        b1_recording.run_recorder(made, inputs, group_commit=False)
    checkpoint(full_scan=True)
    log(f"  B5 verify: {new:,} new runs recorded and anchored after the state was written")


def verify_costs(
    *, database: str, runs: int, new: int, reps: int, big: str | None = None, log=print
) -> list[Row]:
    from django.test import override_settings

    state = ROOT / ".local" / "bench" / f"{database}-verify-state.json"
    _build(database, runs, new, state, log)
    stored = runs + new
    floors, full1, full2, incr, incr2, incr0, incr0_2 = [], [], [], [], [], [], []
    scratch = state.with_name(state.name + ".copy")
    with override_settings(AUDIT_VERIFY_STATE_PATH=""):
        for _ in range(reps):
            seconds, nbytes = floor_seconds(database)
            floors.append(seconds)
            for times, workers in ((full1, "1"), (full2, "2")):
                seconds, out = _timed("--all", "--workers", workers)
                assert f"verified {stored} run(s): {stored} ok" in out, out[-2000:]
                times.append(seconds)
            for times, workers in ((incr, "1"), (incr2, "2")):
                shutil.copyfile(state, scratch)
                seconds, out = _timed("--state", str(scratch), "--workers", workers)
                assert f"verified {new} run(s)" in out, out
                times.append(seconds)
            # From the state that verification wrote: nothing new, the fixed cost (1 and 2 workers).
            for times, workers in ((incr0, "1"), (incr0_2, "2")):
                seconds, out = _timed("--state", str(scratch), "--workers", workers)
                assert "verified 0 run(s)" in out, out
                times.append(seconds)
            log(
                f"  B5 verify: floor {floors[-1]:.2f} s, --all {full1[-1]:.2f} s (1 worker) "
                f"{full2[-1]:.2f} s (2 workers), incremental {incr[-1]:.2f} s (1 worker) {incr2[-1]:.2f} s "
                f"(2 workers), {incr0[-1]:.3f} / {incr0_2[-1]:.3f} s with nothing new (1 / 2 workers)"
            )
    tally, counted = tally_seconds(database)
    tally2, _ = tally_seconds(database, connections_n=2)
    fixed2 = spread(incr0_2).median - tally2
    per_run2 = (spread(incr2).median - spread(incr0_2).median) / new
    at_scale = _at_million(big, database, stored, fixed2, per_run2, log) if big else []
    rss1 = _peak_rss_mb(database, "--all", "--workers", "1")
    rss2 = _peak_rss_mb(database, "--all", "--workers", "2")
    floor = spread([t * 1000 / stored for t in floors])
    per1 = spread([t * 1000 / stored for t in full1])
    per2 = spread([t * 1000 / stored for t in full2])
    ratio1 = spread([a / b for a, b in zip(full1, floors, strict=True)])
    ratio2 = spread([a / b for a, b in zip(full2, floors, strict=True)])
    log(
        f"  B5 verify: floor {floor.median:.3f} s/1k ({nbytes / 1e6:.0f} MB hashed), full {per1.median:.3f} "
        f"s/1k (1 worker), {per2.median:.3f} s/1k (2 workers); incremental {spread(incr).median:.2f} s for "
        f"{new} new runs; peak RSS {rss1:.0f} / {rss2:.0f} MB"
    )
    at_million = per2.median * 1000
    return [
        Row(
            "B5",
            f"floor: raw SQL scan + SHA-256 of the same columns, {stored:,} runs",
            f"{floor.median:.3f} s per 1,000 runs ({nbytes / stored / 1000:.1f} kB per run)",
            floor,
            None,
            ratio_unit=" s",
        ),
        Row(
            "B5",
            f"verify_audit --all, 1 worker, {stored:,} runs (× floor)",
            f"{per1.median:.3f} s per 1,000 runs; peak RSS {rss1:.0f} MB",
            ratio1,
            3.0,
        ),
        Row(
            "B5",
            f"verify_audit --all --workers 2, {stored:,} runs (× floor)",
            f"{per2.median:.3f} s per 1,000 runs ⇒ {at_million / 60:.1f} min at 1,000,000 if linear; "
            f"peak RSS {rss2:.0f} MB (all processes' largest)",
            ratio2,
            3.0,
        ),
        Row(
            "B5",
            f"verify_audit incremental: {new:,} new runs on a store of {stored:,}, 1 worker",
            f"{spread(incr).median:.2f} s; with nothing new {spread(incr0).median:.3f} s, of which "
            f"{tally * 1000:.0f} ms count the store's {counted:,} rows",
            spread(incr),
            None,
            ratio_unit=" s",
        ),
        Row(
            "B5",
            f"verify_audit incremental: {new:,} new runs on a store of {stored:,}, 2 workers",
            f"{spread(incr2).median:.2f} s; with nothing new {spread(incr0_2).median:.3f} s",
            spread(incr2),
            None,
            ratio_unit=" s",
        ),
        *at_scale,
    ]


def table_seconds(database: str, reps: int = 3) -> dict[str, tuple[float, int]]:
    """Per audited table: (seconds, rows) of its watermark statement alone on `database` (best of
    `reps`, after one pass that reads the indexes into the buffer pool as far as it holds them)."""
    from audit.verify import incremental
    from bench.b2_trace import use_database
    from core.db_router import read_alias

    use_database(database)
    marks = incremental.watermarks()
    out = {}
    for table, model in incremental._watermarked():
        statement = incremental._table_selects(model, table, marks)
        best = float("inf")
        for _ in range(reps + 1):
            started = time.perf_counter()
            incremental._select(read_alias(), *statement)
            best = min(best, time.perf_counter() - started)
        out[table] = (best, marks[table][1])
    return out


def parallel_wall(seconds: list[float], n: int) -> float:
    """The longest of `n` connections' work when each next-largest statement goes to the least loaded
    (`incremental._tallies`: a pool of `n` threads taking the tables largest first)."""
    loads = [0.0] * n
    for s in sorted(seconds, reverse=True):
        loads[loads.index(min(loads))] += s
    return max(loads)


@contextlib.contextmanager
def buffer_pool(size: int):
    """The server's InnoDB buffer pool resized to `size` bytes for the block (MariaDB resizes it online),
    then set back."""
    conn = raw_connect()
    cur = conn.cursor()
    cur.execute("SELECT @@innodb_buffer_pool_size")
    (before,) = cur.fetchone()
    try:
        cur.execute("SET GLOBAL innodb_buffer_pool_size = %s", (size,))
        _pool_settled(cur, size)
        yield
    finally:
        cur.execute("SET GLOBAL innodb_buffer_pool_size = %s", (int(before),))
        _pool_settled(cur, int(before))
        conn.close()


def _pool_settled(cur, size: int) -> None:
    """Wait (up to a minute) until the pool is `size` bytes and its resize has completed."""
    for _ in range(600):
        cur.execute("SELECT @@innodb_buffer_pool_size")
        now = int(cur.fetchone()[0])
        cur.execute("SHOW STATUS LIKE 'Innodb_buffer_pool_resize_status'")
        row = cur.fetchone()
        status = row[1] if row else ""
        if now == size and (not status or "Completed" in status):
            return
        time.sleep(0.1)


def _count_at_million(per_table: dict[str, tuple[float, int]], store: dict[str, int], stored: int) -> float:
    """The watermark count over 2 connections at 1,000,000 runs of the verify store's rows per run:
    each table's rows scaled from `store` (rows in a store of `stored` runs), at its own per-row time on
    B2's store (`per_table`), or at B2's mean where B2 holds under 100,000 of its rows."""
    seconds = sum(s for s, _ in per_table.values())
    rows = sum(r for _, r in per_table.values())
    mean = seconds / max(1, rows)
    scaled = []
    for table, count in store.items():
        s, r = per_table.get(table, (0.0, 0))
        per_row = s / r if r >= 100_000 else mean
        scaled.append(per_row * count * 1_000_000 / stored)
    return parallel_wall(scaled, 2)


def _at_million(big, database, stored, fixed, per_run, log) -> list[Row]:
    """10,000 new runs on a 1,000,000-run store, composed of the parts measured (module docstring):
    with the machine's buffer pool, and with one that holds the counted indexes."""
    from django.db import connections

    from audit.verify.incremental import watermarks
    from bench.b2_trace import use_database

    here = connections["default"].settings_dict["NAME"]
    conn = raw_connect()
    try:
        cur = conn.cursor()
        cur.execute("SHOW DATABASES LIKE %s", (big,))
        present = cur.fetchone() is not None
        cur.execute("SELECT @@innodb_buffer_pool_size")
        pool = int(cur.fetchone()[0])
    finally:
        conn.close()
    if not present:
        log(f"  B5 verify: no {big} (B2's 1,000,000-run store): the composed rows are left out")
        return []
    use_database(database)
    store = {table: rows for table, (_top, rows) in watermarks().items()}
    measured = {"pool": table_seconds(big)}
    with buffer_pool(POOL_HOLDING):
        measured["held"] = table_seconds(big)
    use_database(here)
    big_rows = sum(r for _, r in measured["pool"].values())
    rows = sum(store.values()) * 1_000_000 / stored
    out = []
    for key, label in (
        ("pool", f"the machine's buffer pool ({pool // 2**20} MiB)"),
        ("held", f"a buffer pool that holds the counted indexes ({POOL_HOLDING // 2**30} GiB)"),
    ):
        count = _count_at_million(measured[key], store, stored)
        per_row = sum(s for s, _ in measured[key].values()) / max(1, big_rows)
        total = fixed + count + 10_000 * per_run
        log(
            f"  B5 verify at 1,000,000 runs, {label}: count {count:.1f} s over 2 connections "
            f"({per_row * 1e9:.0f} ns a row on {big}, one connection); 10,000 new runs ≈ {total:.1f} s"
        )
        out.append(
            Row(
                "B5",
                "verify_audit incremental, 2 workers: 10,000 new runs on a store of 1,000,000 (composed of "
                f"the parts measured: not buildable here through the recorder), {label}",
                f"≈ {total:.1f} s = fixed {fixed:.2f} s + counting {rows / 1e6:.0f} M rows over 2 "
                f"connections {count:.1f} s (per table, as timed on B2's {big_rows:,} rows: "
                f"{per_row * 1e9:.0f} ns a row on one) + 10,000 × {per_run * 1000:.2f} ms",
                spread([total]),
                10.0,
                ratio_unit=" s",
            )
        )
    return out
