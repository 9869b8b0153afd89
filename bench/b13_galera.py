"""B13 — the Galera cluster behind HAProxy: what recording costs there against the single server, and the
time from the kill of the node the service writes to until its first successful commit (issue 48).

Recording: one worker process per configuration (`python -m bench.b13_galera record …`, production
settings), interleaved per repetition: a single server with the nodes' options and no Galera
(`scripts/mariadb-galera.sh start-single`, 127.0.0.1:3314: the shared 3306 carries other work's load) and
the cluster of scripts/mariadb-galera.sh through its proxy (127.0.0.1:3310, `DATABASE_WSREP_SYNC_WAIT=1`
as documented), database `diagnosis_bench_galera` on each. Each records its runs one at a time
through the recorder (direct path, B1's workload: 23 events, every decision durable before the next),
over PENDING runs created beforehand (not timed). Reported: ms per run on each, the ratio (cluster /
single) per repetition, median (min–max).

Failover: a worker on the cluster commits one small transaction after another (an UPDATE of its chat
session through the proxy, a new connection after each failure, 20 ms apart); the parent SIGKILLs the node
the proxy writes to and the worker reports the time from the kill to its first commit that succeeded
after it. Then the node is started again (it rejoins by IST) before the next repetition. What the figure
is made of: the group's failure detection (the script's `evs.suspect_timeout` of 2 s, checked every
0.5 s), the view change, and HAProxy marking the node down (at the first refused connection).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench import galera_cluster
from bench.env import spawn_worker, worker_result
from bench.stats import Row, spread

DATABASE = "diagnosis_bench_galera"
# The baseline: one server with the nodes' options and no Galera (scripts/mariadb-galera.sh start-single),
# not the shared 3306 whose load from other work would be measured with it.
SINGLE_PORT = 3314


def _env(target: str) -> dict[str, str]:
    environ = dict(os.environ)
    for key in ("DATABASE_URL", "DATABASE_REPLICA_URL", "REDIS_URL", "DEBUG", "DATABASE_WSREP_SYNC_WAIT"):
        environ.pop(key, None)
    if target == "galera":
        environ["B13_DATABASE_URL"] = galera_cluster.url(DATABASE)
        environ["B13_SYNC_WAIT"] = str(galera_cluster.SYNC_WAIT)
    else:
        environ["B13_DATABASE_URL"] = f"mysql://root@127.0.0.1:{SINGLE_PORT}/{DATABASE}"
    return environ


def _worker(target: str, *args: str) -> subprocess.Popen:
    return spawn_worker("bench.b13_galera", list(args), env=_env(target), cwd=galera_cluster.ROOT)


def _result(proc: subprocess.Popen, timeout: float) -> dict:
    return worker_result(proc, timeout, name="B13")


def _prepare() -> None:
    """The cluster up, both databases created afresh (migrated by their first worker)."""
    galera_cluster.start()
    galera_cluster.sql(galera_cluster.PROXY_PORT, f"DROP DATABASE IF EXISTS `{DATABASE}`")
    galera_cluster.sql(
        galera_cluster.PROXY_PORT,
        f"CREATE DATABASE `{DATABASE}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci",
    )
    galera_cluster.script("start-single")
    galera_cluster.sql(SINGLE_PORT, f"DROP DATABASE IF EXISTS `{DATABASE}`")
    galera_cluster.sql(
        SINGLE_PORT, f"CREATE DATABASE `{DATABASE}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"
    )
    for target in ("single", "galera"):
        _result(_worker(target, "migrate"), timeout=600)


def recording(*, runs: int, reps: int, log=print) -> list[Row]:
    single, galera = [], []
    for rep in range(reps):
        order = ["single", "galera"] if rep % 2 == 0 else ["galera", "single"]
        got = {t: _result(_worker(t, "record", str(runs)), timeout=600)["ms_per_run"] for t in order}
        single.append(got["single"])
        galera.append(got["galera"])
        log(f"  B13 rep {rep + 1}/{reps}: single {got['single']:.2f} ms/run, Galera {got['galera']:.2f}")
    return [
        Row(
            "B13",
            "one run at a time, recorder (direct path): Galera cluster through HAProxy vs the single server",
            f"{spread(galera).median:.2f} ms vs {spread(single).median:.2f} ms per run (23 events)",
            spread([g / s for g, s in zip(galera, single, strict=True)]),
            None,
            note="3 nodes on one 2-core machine, wsrep_sync_wait 1; context, no target",
        )
    ]


def failover(*, reps: int, log=print) -> list[Row]:
    gaps, failed = [], []
    for rep in range(reps):
        galera_cluster.start()
        node = galera_cluster.writer()
        pid = int(Path(f"{os.environ.get('GALERA_DIR', '/tmp/diagnosis-galera')}/node{node}.pid").read_text())
        proc = _worker("galera", "commits", "30")
        # The worker is committing (it says so on stderr) before the kill.
        line = proc.stderr.readline()
        if "committing" not in line:
            raise RuntimeError(f"B13 failover worker did not start: {line}{proc.stderr.read()[-2000:]}")
        time.sleep(0.5)
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
        result = _result(proc, timeout=120)
        gap = result["first_commit_after"] - killed_at
        gaps.append(gap)
        failed.append(result["failures"])
        log(
            f"  B13 failover rep {rep + 1}/{reps}: node {node} killed, first commit after {gap:.2f} s "
            f"({result['failures']} failed attempts)"
        )
        galera_cluster.start_node(node)
    return [
        Row(
            "B13",
            "node the service writes to SIGKILLed: time to the first successful commit through HAProxy",
            f"{spread(gaps).median:.2f} s (failed attempts meanwhile: {spread(failed).median:.0f})",
            spread(gaps),
            None,
            ratio_unit=" s",
            note="Galera evs.suspect_timeout 2 s (scripts/mariadb-galera.sh); context, no target",
        )
    ]


def run_all(*, quick: bool, log=print) -> list[Row]:
    _prepare()
    try:
        rows = recording(runs=10 if quick else 30, reps=3 if quick else 5, log=log)
        rows += failover(reps=2 if quick else 3, log=log)
        return rows
    finally:
        galera_cluster.start()
        galera_cluster.sql(galera_cluster.PROXY_PORT, f"DROP DATABASE IF EXISTS `{DATABASE}`")
        galera_cluster.script("stop-single")


# --------------------------------------------------------------------------------------------------
# The worker processes
# --------------------------------------------------------------------------------------------------
def _setup_worker() -> None:
    from bench import env

    env.prepare(DATABASE)
    os.environ["DATABASE_URL"] = os.environ["B13_DATABASE_URL"]
    if os.environ.get("B13_SYNC_WAIT"):
        os.environ["DATABASE_WSREP_SYNC_WAIT"] = os.environ["B13_SYNC_WAIT"]
    import django

    django.setup()


def _record_worker(runs: int) -> dict:
    from bench import workload
    from bench.b1_recording import bench_user, new_runs, run_recorder
    from diagnosis import services

    inputs = workload.make_inputs()
    session = services.create_session(owner=bench_user(), title="bench B13")
    run_recorder(new_runs(session, 3, "warm-up"), inputs, group_commit=False)
    pending = new_runs(session, runs, "b13")
    elapsed = run_recorder(pending, inputs, group_commit=False)
    return {"ms_per_run": elapsed / runs * 1e3}


def _commits_worker(seconds: float) -> dict:
    """Commit one UPDATE after another until `seconds` pass or a commit succeeds after a failure."""
    from django.db import connection

    from bench.b1_recording import bench_user
    from diagnosis import services
    from diagnosis.models import ChatSession

    session = services.create_session(owner=bench_user(), title="bench B13 failover")
    print("committing", file=sys.stderr, flush=True)
    failures, deadline, n = 0, time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        n += 1
        try:
            ChatSession.objects.filter(session_id=session.session_id).update(title=f"commit {n}")
        except Exception:
            failures += 1
            connection.close()
        else:
            if failures:
                return {"first_commit_after": time.time(), "failures": failures}
        time.sleep(0.02)
    raise RuntimeError(f"no commit succeeded after a failure within {seconds} s ({failures} failures)")


def main(argv: list[str]) -> int:
    _setup_worker()
    if argv[0] == "migrate":
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)
        result: dict = {"migrated": True}
    elif argv[0] == "record":
        result = _record_worker(int(argv[1]))
    elif argv[0] == "commits":
        result = _commits_worker(float(argv[1]))
    else:
        raise SystemExit(f"usage: python -m bench.b13_galera migrate | record RUNS | commits SECONDS: {argv}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
