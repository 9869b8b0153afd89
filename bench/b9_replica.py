"""B9 — reads on a replica: the admin run list and trace reads from 2 processes, primary only vs primary
+ replica (issue 36 item 3).

On the MariaDB pair of scripts/mariadb-replica.sh (primary 127.0.0.1:3307, replica :3308, GTID
replication; the shared server on 3306 is not involved), one database `diagnosis_bench_replica` is
created on the primary and filled with finished runs recorded through the recorder (B2's sized runs);
the replica receives it by replication. Then, per repetition and for each configuration in turn, two
worker processes (`python -m bench.b9_replica load …`, production settings) loop for a fixed time over
one of the two read paths the replica serves, each path measured on its own: the admin's run list
(`GET /admin/diagnosis/diagnosisrun/` through Django's test client as a superuser: middleware, change
list, template) and a run's trace (`audit.read.trace.get_trace`, rows verified). The
configurations differ only in `DATABASE_REPLICA_URL` (unset / the replica, read as the SELECT-only
account).

Reported per path: operations per second of the two processes together in each configuration and the
ratio (with replica / primary only), plus the SELECTs the primary served per operation (the
workers' request connections' `Com_select`) and the share of read scopes that went to the replica. On
one 2-core machine the pair's servers and the workers share the same cores, so the throughput ratio shows
the cost of routing (≈ 1× expected); what the replica buys, reads taken off the primary, is the
primary's SELECTs per operation. No target in the issue: the rows report, they do not gate.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from bench import replica_pair
from bench.env import spawn_worker, worker_result
from bench.stats import Row, spread

DATABASE = "diagnosis_bench_replica"
EVENTS_PER_RUN = 50


def _env(name: str, *, replica: bool) -> dict[str, str]:
    primary_url, replica_url = replica_pair.urls(name)
    environ = dict(os.environ)
    for key in ("DATABASE_URL", "DATABASE_REPLICA_URL", "REDIS_URL", "DEBUG"):
        environ.pop(key, None)
    environ["B9_DATABASE_URL"] = primary_url
    if replica:
        environ["B9_REPLICA_URL"] = replica_url
    return environ


def _worker(args: list[str], *, name: str, replica: bool) -> subprocess.Popen:
    return spawn_worker("bench.b9_replica", args, env=_env(name, replica=replica), cwd=replica_pair.ROOT)


def _result(proc: subprocess.Popen, timeout: float) -> dict:
    return worker_result(proc, timeout, name="B9")


def seed(*, runs: int, name: str = DATABASE, log=print) -> None:
    """Create `name` on the primary, migrate it and record `runs` finished runs; wait until replicated."""
    replica_pair.start()
    replica_pair.sql(replica_pair.PRIMARY_PORT, f"DROP DATABASE IF EXISTS `{name}`")
    replica_pair.sql(
        replica_pair.PRIMARY_PORT,
        f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci",
    )
    started = time.perf_counter()
    _result(_worker(["seed", str(runs)], name=name, replica=False), timeout=1800)
    replica_pair.wait_replicated()
    log(
        f"  B9 data: {runs} runs of {EVENTS_PER_RUN} events on the primary, replicated "
        f"({time.perf_counter() - started:.0f} s)"
    )


def measure(
    *, seconds: float, reps: int, processes: int = 2, name: str = DATABASE, log=print
) -> tuple[list[Row], dict]:
    """Throughput of both paths with `processes` workers, primary only vs primary + replica."""
    per: dict[str, dict[str, dict[str, list[float]]]] = {
        path: {
            mode: {"ops": [], "primary_selects": [], "replica_share": [], "primary_reasons": {}}
            for mode in ("primary", "replica")
        }
        for path in ("list", "trace")
    }
    for rep in range(reps):
        for path in ("list", "trace"):
            for mode in ("primary", "replica"):
                procs = [
                    _worker(["load", str(seconds), path], name=name, replica=mode == "replica")
                    for _ in range(processes)
                ]
                results = [_result(p, timeout=seconds * 4 + 120) for p in procs]
                selects = sum(r["primary_selects"] for r in results)
                ops = sum(r["ops"] for r in results)
                figures = per[path][mode]
                figures["ops"].append(ops / max(r["elapsed"] for r in results))
                figures["primary_selects"].append(selects / max(ops, 1))
                scopes = sum(r["replica_scopes"] + r["primary_scopes"] for r in results)
                figures["replica_share"].append(sum(r["replica_scopes"] for r in results) / max(scopes, 1))
                for result in results:
                    for reason, n in result["primary_reasons"].items():
                        figures["primary_reasons"][reason] = figures["primary_reasons"].get(reason, 0) + n
                log(
                    f"  B9 rep {rep + 1} {path:5s} {mode:7s}: {figures['ops'][-1]:7.1f}/s, primary "
                    f"SELECTs/op {figures['primary_selects'][-1]:5.1f}, replica share "
                    f"{figures['replica_share'][-1]:.0%}"
                )
    rows = []
    labels = {"list": "admin run list", "trace": f"trace read ({EVENTS_PER_RUN} events)"}
    for path in ("list", "trace"):
        primary, replica = per[path]["primary"], per[path]["replica"]
        ratio = spread([r / p for r, p in zip(replica["ops"], primary["ops"], strict=True)])
        rows.append(
            Row(
                "B9",
                f"{labels[path]}, {processes} processes: primary + replica vs primary only",
                f"{spread(replica['ops']).median:.0f}/s vs {spread(primary['ops']).median:.0f}/s",
                ratio,
                None,
                goal="min",
                note=(
                    f"SELECTs on the primary per operation {spread(primary['primary_selects']).median:.1f} → "
                    f"{spread(replica['primary_selects']).median:.1f}; read scopes on the replica "
                    f"{spread(replica['replica_share']).median:.0%}"
                ),
            )
        )
    return rows, {"processes": processes, "seconds": seconds, "per": per}


def run(*, runs: int, seconds: float, reps: int, processes: int = 2, name: str = DATABASE, log=print):
    seed(runs=runs, name=name, log=log)
    try:
        return measure(seconds=seconds, reps=reps, processes=processes, name=name, log=log)
    finally:
        replica_pair.sql(replica_pair.PRIMARY_PORT, f"DROP DATABASE IF EXISTS `{name}`")


# --------------------------------------------------------------------------------------------------
# The worker processes
# --------------------------------------------------------------------------------------------------
def _setup_worker() -> None:
    from bench import env

    env.prepare(os.environ["B9_DATABASE_URL"].rsplit("/", 1)[1])
    os.environ["DATABASE_URL"] = os.environ["B9_DATABASE_URL"]
    if os.environ.get("B9_REPLICA_URL"):
        os.environ["DATABASE_REPLICA_URL"] = os.environ["B9_REPLICA_URL"]
    import django

    django.setup()


def _seed_worker(runs: int) -> dict:
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from bench.b2_trace import record_sized_run
    from diagnosis import services

    call_command("migrate", verbosity=0, interactive=False)
    user = get_user_model().objects.create_superuser("bench-replica", password="bench-replica-pw-1")
    session = services.create_session(owner=user, title="bench B9")
    for i in range(runs):
        record_sized_run(services.create_run(session=session, query=f"B9 run {i}"), EVENTS_PER_RUN)
    return {"runs": runs}


def _session_selects() -> int:
    """SELECTs this process's request connection has sent to the primary (its session's `Com_select`;
    the replica monitor's heartbeat, about one write and one replica read a second, is not in it)."""
    from django.db import connections

    with connections["default"].cursor() as cursor:
        cursor.execute("SHOW SESSION STATUS LIKE 'Com_select'")
        return int(cursor.fetchone()[1])


def _load_worker(seconds: float, path: str) -> dict:
    """`path` (`list`: the admin run list; `trace`: the runs' traces in turn) for `seconds`."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    from audit.read.trace import get_trace
    from core.db_router import read_counts
    from diagnosis.models import DiagnosisRun

    user = get_user_model().objects.get(username="bench-replica")
    client = Client()
    client.force_login(user)
    runs = list(DiagnosisRun.objects.order_by("id"))
    _wait_for_the_replica()
    before = read_counts()
    ops = 0
    selects_before = _session_selects()
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        if path == "list":
            response = client.get("/admin/diagnosis/diagnosisrun/")
            if response.status_code != 200:
                raise RuntimeError(f"the run list answered {response.status_code}")
        else:
            trace = get_trace(run=runs[ops % len(runs)])
            if not trace.summary.chain_valid:
                raise RuntimeError(f"trace of {trace.run.run_id} does not verify")
        ops += 1
    elapsed = time.perf_counter() - start
    counts = {key: n - before.get(key, 0) for key, n in read_counts().items()}
    return {
        "ops": ops,
        "primary_selects": _session_selects() - selects_before,
        "elapsed": elapsed,
        "replica_scopes": sum(n for (db, _), n in counts.items() if db == "replica"),
        "primary_scopes": sum(n for (db, _), n in counts.items() if db == "primary"),
        "primary_reasons": {reason: n for (db, reason), n in counts.items() if db == "primary"},
    }


def _wait_for_the_replica(limit: float = 30.0) -> None:
    """With a replica configured, wait (up to `limit` s) until this process's heartbeat finds it usable
    and has seen one of its own beats applied there (a watermark: until then every read of data with a
    write time goes to the primary as `fresh`, rightly), so the timed loop measures replica reads rather
    than the first heartbeats on a loaded machine."""
    from django.conf import settings

    from core import db_router
    from core.replica import monitor

    if not db_router.replica_configured():
        return
    deadline = time.monotonic() + limit
    while True:
        state = monitor.state()
        if state.usable(float(settings.DATABASE_REPLICA_MAX_LAG_SECONDS)) and state.watermark is not None:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"the replica was not usable within {limit:.0f} s: {monitor.peek()}")
        time.sleep(0.1)


def main(argv: list[str]) -> int:
    _setup_worker()
    if argv[0] == "seed":
        result = _seed_worker(int(argv[1]))
    elif argv[0] == "load":
        result = _load_worker(float(argv[1]), argv[2])
    else:
        raise SystemExit(
            f"usage: python -m bench.b9_replica seed RUNS | load SECONDS list|trace (got {argv})"
        )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
