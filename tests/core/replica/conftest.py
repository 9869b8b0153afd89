"""The real primary/replica pair (scripts/mariadb-replica.sh: 127.0.0.1:3307 and :3308) for the replica
tests: started once per session if it is not running, one database created on the primary and replicated
per module. Without mariadbd these tests are skipped, saying why; with `REPLICA_REQUIRE=1`
(scripts/test.sh) they fail instead. The rest of the suite never sees the pair: `bench.replica_pair.
using_pair` restores the aliases it replaced."""

from __future__ import annotations

import os

import pytest

from bench import replica_pair
from tests.local_servers import started_or_skipped


@pytest.fixture(scope="session")
def mariadb_pair():
    return started_or_skipped(replica_pair, require="REPLICA_REQUIRE")


@pytest.fixture(scope="module")
def pair_db(mariadb_pair, django_db_blocker):
    """This process's `default` and `replica` aliases on a fresh migrated database of the pair."""
    from agent.runtime import db as runtime_db

    name = f"diagnosis_replica_{os.getpid()}"
    with django_db_blocker.unblock():
        runtime_db.shutdown_pools()
        try:
            with replica_pair.using_pair(name):
                yield name
        finally:
            runtime_db.shutdown_pools()


@pytest.fixture
def replica_settings(settings):
    """Quick checks and a short lag limit, so the tests see state changes within a second or two."""
    settings.DATABASE_REPLICA_CHECK_SECONDS = 0.1
    settings.DATABASE_REPLICA_MAX_LAG_SECONDS = 1.5
    settings.DATABASE_REPLICA_PIN_SECONDS = 2.0
    return settings


@pytest.fixture
def replica_up(pair_db, replica_settings):
    """The replica running and replicating (a test that stopped it and failed is repaired here)."""
    from core.replica import monitor

    replica_pair.start()
    replica_pair.sql(replica_pair.REPLICA_PORT, "START SLAVE")
    replica_pair.wait_replicated()
    monitor.reset()
    yield
    replica_pair.start()
    replica_pair.sql(replica_pair.REPLICA_PORT, "START SLAVE")
