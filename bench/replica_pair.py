"""The MariaDB primary/replica pair of scripts/mariadb-replica.sh, for the replica tests and the B9 bench:
start it, create a database on the primary and wait until the replica shows it, point this process's
Django connections at it (and back), stop and start the replica server.

The database is created on the primary and migrated there; the replica receives it by replication like
any other write (the replica alias connects as `reader`, SELECT only), so what the tests read on the
replica is really replicated data, never a second copy made by the test set-up.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "mariadb-replica.sh"
PRIMARY_PORT = int(os.environ.get("REPLICA_PRIMARY_PORT", "3307"))
REPLICA_PORT = int(os.environ.get("REPLICA_REPLICA_PORT", "3308"))
# The pair's SELECT-only account (scripts/mariadb-replica.sh): a local test server's, not a secret.
READER_PASSWORD = "reader"


def missing() -> str | None:
    """Why the pair cannot run here, or None."""
    if not Path("/usr/sbin/mariadbd").exists():
        return "mariadbd is not installed (/usr/sbin/mariadbd): the replica tests need a real MariaDB pair"
    if not shutil.which("mariadb-install-db"):
        return "mariadb-install-db is not installed"
    return None


def script(*args: str) -> None:
    subprocess.run([str(SCRIPT), *args], check=True, capture_output=True, timeout=120)


def start() -> None:
    """Both servers up and replicating (scripts/mariadb-replica.sh start; a no-op when they are)."""
    script("start")


def urls(name: str) -> tuple[str, str]:
    """DATABASE_URL and DATABASE_REPLICA_URL of database `name` on the pair."""
    return (
        f"mysql://root@127.0.0.1:{PRIMARY_PORT}/{name}",
        f"mysql://reader:{READER_PASSWORD}@127.0.0.1:{REPLICA_PORT}/{name}",
    )


def connect(port: int, database: str | None = None):
    import MySQLdb

    kwargs = {"host": "127.0.0.1", "port": port, "user": "root", "charset": "utf8mb4", "autocommit": True}
    if database:
        kwargs["database"] = database
    return MySQLdb.connect(**kwargs)


def sql(port: int, statement: str, params: tuple = ()) -> list:
    conn = connect(port)
    try:
        cur = conn.cursor()
        cur.execute(statement, params)
        return list(cur.fetchall()) if cur.description else []
    finally:
        conn.close()


def wait_replicated(timeout: float = 60.0) -> None:
    """Until the replica has applied everything the primary has written so far."""
    pos = sql(PRIMARY_PORT, "SELECT @@gtid_binlog_pos")[0][0]
    (waited,) = sql(REPLICA_PORT, "SELECT MASTER_GTID_WAIT(%s, %s)", (pos, timeout))[0]
    if waited != 0:
        raise TimeoutError(f"the replica did not apply {pos} within {timeout} s")


def mysql_config(url: str) -> dict:
    from config.settings import MYSQL_OPTIONS
    from core.env import env

    config = env.db_url_config(url)
    config.setdefault("OPTIONS", {}).update(MYSQL_OPTIONS)
    config["CONN_HEALTH_CHECKS"] = True
    return config


@contextlib.contextmanager
def using_pair(name: str, *, migrate: bool = True) -> Iterator[None]:
    """This process's `default` and `replica` aliases on database `name` of the pair, created (and
    migrated) on the primary and replicated; afterwards dropped and the previous aliases restored."""
    from django.core.management import call_command
    from django.db import connections

    from core.replica import monitor

    primary_url, replica_url = urls(name)
    sql(PRIMARY_PORT, f"DROP DATABASE IF EXISTS `{name}`")
    sql(PRIMARY_PORT, f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci")
    saved_settings = connections.settings
    saved = {a: getattr(connections._connections, a, None) for a in ("default", "replica")}
    for alias in saved:
        if hasattr(connections._connections, alias):
            delattr(connections._connections, alias)
    connections.settings = connections.configure_settings(
        {"default": mysql_config(primary_url), "replica": mysql_config(replica_url)}
    )
    monitor.reset()
    _forget_compiled_sql()
    try:
        if migrate:
            call_command("migrate", database="default", verbosity=0, interactive=False)
        wait_replicated()
        yield
    finally:
        monitor.reset()
        for alias in ("default", "replica"):
            if hasattr(connections._connections, alias):
                with contextlib.suppress(Exception):
                    getattr(connections._connections, alias).close()
                delattr(connections._connections, alias)
        connections.settings = saved_settings
        _forget_compiled_sql()
        for alias, wrapper in saved.items():
            if wrapper is not None:
                setattr(connections._connections, alias, wrapper)
        with contextlib.suppress(Exception):
            sql(PRIMARY_PORT, f"DROP DATABASE IF EXISTS `{name}`")


def _forget_compiled_sql() -> None:
    """The SQL the project compiles once per alias (`core.compiled.CompiledQuery`, the recorder's
    `audit.write.table.Table`) is the dialect of whatever `default` was: a suite on SQLite swapping
    `default` to the pair (and back) must compile it again."""
    import gc

    from audit.write.table import Table
    from core.compiled import CompiledQuery

    for obj in gc.get_objects():
        try:
            if isinstance(obj, CompiledQuery):
                obj._compiled.clear()
            elif isinstance(obj, Table):
                obj._sql.clear()
                obj._converters.clear()
        except ReferenceError:  # a weak proxy whose object is gone
            continue


def replica_port_of_alias(alias: str = "replica") -> int:
    """The port the alias's connection really reaches (`@@port`), to prove a read went to the replica."""
    from django.db import connections

    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT @@port")
        return int(cursor.fetchone()[0])


def stop_replica() -> None:
    script("stop-replica")


def start_replica() -> None:
    script("start-replica")


def wait_for(predicate, timeout: float = 30.0, step: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(step)
