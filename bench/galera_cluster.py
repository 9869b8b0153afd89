"""The three-node MariaDB Galera cluster behind HAProxy of scripts/mariadb-galera.sh, for the Galera
failover test and the B13 bench: start it, create a database through the proxy, point this process's
`default` alias at the proxy (and back), kill and restart the node the proxy writes to.

Everything the service does goes through the proxy (127.0.0.1:3310), as in production; the nodes are
reached directly only to ask which one the proxy writes to, to kill it and to compare their copies.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from bench import replica_pair

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "mariadb-galera.sh"
PROXY_PORT = int(os.environ.get("GALERA_PROXY_PORT", "3310"))
NODE_PORTS = {1: 3311, 2: 3312, 3: 3313}
# DATABASE_WSREP_SYNC_WAIT behind the cluster (docs/reliability.md, *A Galera cluster behind HAProxy*).
SYNC_WAIT = 1


def missing() -> str | None:
    """Why the cluster cannot run here, or None."""
    if not Path("/usr/sbin/mariadbd").exists():
        return "mariadbd is not installed (/usr/sbin/mariadbd): the Galera tests need real MariaDB nodes"
    if not Path("/usr/lib/galera/libgalera_smm.so").exists():
        return "galera-4 is not installed (/usr/lib/galera/libgalera_smm.so; scripts/setup.sh dev)"
    for command in ("haproxy", "socat", "rsync", "mariadb-install-db"):
        if not shutil.which(command) and not Path(f"/usr/sbin/{command}").exists():
            return f"{command} is not installed (scripts/setup.sh dev)"
    return None


def script(*args: str, timeout: float = 180) -> str:
    done = subprocess.run([str(SCRIPT), *args], check=True, capture_output=True, text=True, timeout=timeout)
    return done.stdout


def start() -> None:
    """Three nodes Synced, their checks and the proxy up (a no-op when they are)."""
    script("start")


def url(name: str) -> str:
    """DATABASE_URL of database `name` through the proxy."""
    return f"mysql://root@127.0.0.1:{PROXY_PORT}/{name}"


def sql(port: int, statement: str, params: tuple = ()) -> list:
    return replica_pair.sql(port, statement, params)


def writer() -> int:
    """The node (1..3) the proxy sends a new connection to: the one the service writes to."""
    (port,) = sql(PROXY_PORT, "SELECT @@port")[0]
    return next(n for n, p in NODE_PORTS.items() if p == int(port))


def state(node: int) -> int | None:
    """The node's `wsrep_local_state` (4: Synced), None when it does not answer."""
    try:
        rows = sql(NODE_PORTS[node], "SHOW GLOBAL STATUS LIKE 'wsrep_local_state'")
    except Exception:
        return None
    return int(rows[0][1]) if rows else None


def cluster_size(node: int) -> int:
    return int(sql(NODE_PORTS[node], "SHOW GLOBAL STATUS LIKE 'wsrep_cluster_size'")[0][1])


def kill_node(node: int) -> None:
    """SIGKILL the node's mariadbd (no shutdown, no flush: a crash)."""
    script("kill-node", str(node))


def start_node(node: int) -> None:
    """Start the node again; returns once it is Synced (it rejoins by IST)."""
    script("start-node", str(node))


def table_checksums(node: int, database: str, tables: list[str]) -> dict[str, int]:
    """`CHECKSUM TABLE` of each table on one node (the copies of a cluster must agree)."""
    rows = sql(NODE_PORTS[node], "CHECKSUM TABLE " + ", ".join(f"`{database}`.`{t}`" for t in tables))
    return {str(name).split(".", 1)[1]: value for name, value in rows}


def wait_synced(node: int, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if state(node) == 4:
            return True
        time.sleep(0.1)
    return False


def mysql_config(database_url: str, *, sync_wait: int = SYNC_WAIT) -> dict:
    """Django's settings of a connection through the proxy, as `config.settings` makes them with
    DATABASE_WSREP_SYNC_WAIT=`sync_wait` (the documented setting for Galera: 1)."""
    from config.settings import mysql_options
    from core.env import env

    config = env.db_url_config(database_url)
    config.setdefault("OPTIONS", {}).update(mysql_options(wsrep_sync_wait=sync_wait))
    config["CONN_HEALTH_CHECKS"] = True
    return config


@contextlib.contextmanager
def using_cluster(name: str, *, migrate: bool = True) -> Iterator[None]:
    """This process's `default` alias on database `name` through the proxy, created (and migrated)
    there; afterwards dropped and the previous alias restored."""
    from django.core.management import call_command
    from django.db import connections

    sql(PROXY_PORT, f"DROP DATABASE IF EXISTS `{name}`")
    sql(PROXY_PORT, f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci")
    saved_settings = connections.settings
    saved = getattr(connections._connections, "default", None)
    if hasattr(connections._connections, "default"):
        delattr(connections._connections, "default")
    connections.settings = connections.configure_settings({"default": mysql_config(url(name))})
    replica_pair._forget_compiled_sql()
    try:
        if migrate:
            call_command("migrate", database="default", verbosity=0, interactive=False)
        yield
    finally:
        if hasattr(connections._connections, "default"):
            with contextlib.suppress(Exception):
                connections._connections.default.close()
            delattr(connections._connections, "default")
        connections.settings = saved_settings
        replica_pair._forget_compiled_sql()
        if saved is not None:
            connections._connections.default = saved
        with contextlib.suppress(Exception):
            sql(PROXY_PORT, f"DROP DATABASE IF EXISTS `{name}`")
