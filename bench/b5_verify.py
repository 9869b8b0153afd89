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
  composed of measured parts — the fixed cost less its one part that grows with the store (each
  audited table's rows counted, `incremental._tallies`), that count timed per row on B2's
  1,000,000-run store (`<db>_big`, when present) over 2 connections as 2 workers count, scaled to a
  1,000,000-run store of this workload's rows, and 10,000 × the measured cost per new run with 2 workers
  (the search for unanchored runs starts at the state's floor, so it grows with the new runs only);
* **peak RSS**: of a `manage.py verify_audit --all` process and its workers, the largest (`VmHWM`).
"""

from __future__ import annotations

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
    floors, full1, full2, incr, incr2, incr0 = [], [], [], [], [], []
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
            # From the state that verification wrote: nothing new, the fixed cost.
            seconds, out = _timed("--state", str(scratch))
            assert "verified 0 run(s)" in out, out
            incr0.append(seconds)
            log(
                f"  B5 verify: floor {floors[-1]:.2f} s, --all {full1[-1]:.2f} s (1 worker) "
                f"{full2[-1]:.2f} s (2 workers), incremental {incr[-1]:.2f} s (1 worker) {incr2[-1]:.2f} s "
                f"(2 workers), {incr0[-1]:.3f} s with nothing new"
            )
    tally, counted = tally_seconds(database)
    at_scale = _at_million(big, stored, counted, tally, new, incr2, incr0, log) if big else None
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
            f"{spread(incr2).median:.2f} s",
            spread(incr2),
            None,
            ratio_unit=" s",
        ),
        *([at_scale] if at_scale else []),
    ]


def _at_million(big, stored, counted, tally, new, incr2, incr0, log) -> Row | None:
    """10,000 new runs on a 1,000,000-run store, composed of the parts measured (module docstring)."""
    from django.db import connections

    from bench.b2_trace import use_database

    here = connections["default"].settings_dict["NAME"]
    conn = raw_connect()
    try:
        cur = conn.cursor()
        cur.execute("SHOW DATABASES LIKE %s", (big,))
        present = cur.fetchone() is not None
    finally:
        conn.close()
    if not present:
        log(f"  B5 verify: no {big} (B2's 1,000,000-run store): the composed row is left out")
        return None
    big_tally, big_rows = tally_seconds(big, connections_n=2)  # as 2 workers count
    use_database(here)
    per_row = big_tally / max(1, big_rows)
    rows_at_million = counted / stored * 1_000_000
    tally_at_million = per_row * rows_at_million
    fixed = spread(incr0).median - tally
    per_run = (spread(incr2).median - spread(incr0).median) / new
    total = fixed + tally_at_million + 10_000 * per_run
    log(
        f"  B5 verify: watermark statement {big_tally:.2f} s over {big_rows:,} rows of {big} "
        f"({per_row * 1e9:.0f} ns a row); at 1,000,000 runs of this workload ({rows_at_million / 1e6:.0f} M "
        f"rows) {tally_at_million:.1f} s; 10,000 new runs ≈ {total:.1f} s"
    )
    return Row(
        "B5",
        "verify_audit incremental, 2 workers: 10,000 new runs on a store of 1,000,000 (composed of the parts "
        "measured: not buildable here through the recorder)",
        f"≈ {total:.1f} s = fixed {fixed:.2f} s + counting {rows_at_million / 1e6:.0f} M rows "
        f"{tally_at_million:.1f} s ({per_row * 1e9:.0f} ns a row over {big_rows:,} rows of B2's store, "
        "2 connections) + "
        f"10,000 × {per_run * 1000:.2f} ms",
        spread([total]),
        10.0,
        ratio_unit=" s",
    )
