"""B9 (bench/b9_replica.py) cannot rot: its smallest scenario runs here on the real MariaDB pair of
scripts/mariadb-replica.sh (skipped without mariadbd, required with `REPLICA_REQUIRE=1`). It asserts only
what the scenario recorded (where the reads went), never a wall time."""

import os

import pytest

from bench import b9_replica, replica_pair
from tests.local_servers import started_or_skipped

pytestmark = pytest.mark.replica


@pytest.fixture(scope="module")
def pair():
    started_or_skipped(replica_pair, require="REPLICA_REQUIRE")


def test_b9_measures_both_paths_with_and_without_the_replica(pair):
    """About 40 s: one worker process migrates the pair's database (≈ 20 s of it) and eight short worker
    processes start Django, for the two paths, both configurations, two processes each."""
    log = []
    rows, evidence = b9_replica.run(
        runs=2, seconds=0.5, reps=1, name=f"diagnosis_bench_replica_smoke_{os.getpid()}", log=log.append
    )
    assert [r.name.split(",")[0] for r in rows] == ["admin run list", "trace read (50 events)"]
    assert all(r.ratio.median > 0 and r.bench == "B9" for r in rows)
    for path in ("list", "trace"):
        primary, replica = evidence["per"][path]["primary"], evidence["per"][path]["replica"]
        assert primary["ops"][0] > 0 and replica["ops"][0] > 0
        # Without a replica every read scope reads the primary; with it (the workers wait for a usable
        # heartbeat with a watermark), every one reads the replica unless the router's own rules send it
        # to the primary on a loaded machine: the heartbeat found the replica lagging or down meanwhile,
        # or it has not yet proven it holds the data read (`fresh`); never pinned, never in a
        # transaction. The primary serves fewer SELECTs per operation.
        assert primary["replica_share"] == [0.0] and set(primary["primary_reasons"]) == {"unconfigured"}
        assert replica["replica_share"][0] > 0
        fallbacks = {"lagging", "down", "unknown", "fresh"}
        assert set(replica["primary_reasons"]) <= fallbacks, replica["primary_reasons"]
        assert replica["primary_selects"][0] < primary["primary_selects"][0]
    assert "B9 data: 2 runs" in log[0]
