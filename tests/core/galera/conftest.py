"""The real three-node Galera cluster behind HAProxy (scripts/mariadb-galera.sh: nodes on
127.0.0.1:3311-3313, the proxy on :3310) for the Galera failover test: started once per session if it is
not running, one database created through the proxy per module. Without mariadbd, galera-4 or haproxy
these tests are skipped, saying why; with `GALERA_REQUIRE=1` (scripts/test.sh) they fail instead. The rest
of the suite never sees the cluster: `bench.galera_cluster.using_cluster` restores the alias it replaced."""

from __future__ import annotations

import os

import pytest

from bench import galera_cluster
from tests.local_servers import started_or_skipped


@pytest.fixture(scope="session")
def galera():
    return started_or_skipped(galera_cluster, require="GALERA_REQUIRE")


@pytest.fixture(scope="module")
def galera_db(galera, django_db_blocker):
    """This process's `default` alias on a fresh migrated database, through the proxy."""
    from agent.runtime import db as runtime_db

    name = f"diagnosis_galera_{os.getpid()}"
    with django_db_blocker.unblock():
        runtime_db.shutdown_pools()
        try:
            with galera_cluster.using_cluster(name):
                yield name
        finally:
            runtime_db.shutdown_pools()
