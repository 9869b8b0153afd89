"""`core.db_router` without a replica (the whole suite's case) and the settings that add one. The
routing itself, on a real replica, is tested in tests/core/replica/."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from django.db import connections

from core import db_router
from core.env import BASE_DIR


def _reads(reason: str) -> int:
    return db_router.read_counts().get(("primary", reason), 0)


@pytest.mark.django_db
def test_without_a_replica_every_read_is_on_the_primary(user):
    assert "replica" not in connections.settings and not db_router.replica_configured()

    @db_router.reads_from_replica
    def read():
        return db_router.read_alias(), type(user).objects.filter(pk=user.pk).exists()

    before = _reads("unconfigured")
    assert read() == ("default", True)
    assert _reads("unconfigured") == before + 1
    router = db_router.ReplicaRouter()
    assert router.db_for_read(type(user)) == "default" and router.db_for_write(type(user)) == "default"
    assert router.allow_migrate("default", "diagnosis") and not router.allow_migrate("replica", "diagnosis")
    # The pin is a no-op without a replica (nothing cached).
    db_router.pin_reads_to_primary(user)
    from django.core.cache import cache

    assert cache.get(f"db-read-pin:{user.pk}") is None


def test_database_replica_url_adds_a_replica_alias_that_mirrors_the_primary_in_tests():
    env = dict(os.environ)
    env.update(
        {
            "DEBUG": "true",
            "DATABASE_URL": "mysql://root@127.0.0.1:3307/diagnosis",
            "DATABASE_REPLICA_URL": "mysql://reader:{}@127.0.0.1:3308/diagnosis".format("pw"),
            "DATABASE_REPLICA_CONNECT_TIMEOUT": "3",
            "DJANGO_SETTINGS_MODULE": "config.settings",
        }
    )
    code = """
        import json
        from django.conf import settings
        r = settings.DATABASES["replica"]
        print(json.dumps({"port": r["PORT"], "user": r["USER"], "test": r["TEST"],
                          "timeout": r["OPTIONS"]["connect_timeout"], "charset": r["OPTIONS"]["charset"],
                          "routers": settings.DATABASE_ROUTERS,
                          "lag": settings.DATABASE_REPLICA_MAX_LAG_SECONDS}))
    """
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got == {
        "port": 3308,
        "user": "reader",
        "test": {"MIRROR": "default"},
        "timeout": 3,
        "charset": "utf8mb4",
        "routers": ["core.db_router.ReplicaRouter"],
        "lag": 5.0,
    }
