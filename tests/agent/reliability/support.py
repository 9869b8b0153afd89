"""Support for the reliability tests: real database faults on MariaDB.

* `DatabaseOutageProxy`: a loopback TCP proxy in front of MariaDB whose `outage()` aborts every open
  connection and stops listening (clients get "Lost connection" / "Can't connect" from the real driver,
  exactly as when the database host drops off the network), and whose `restore()` listens again on the
  same port. `routed_through(proxy)` points Django's connection settings at it for new connections.
* `restart_mariadb()`: stops the local mariadbd (`mariadb-admin shutdown`) and starts it again the way
  `scripts/mariadb.sh` does, waiting until it answers; `mariadb_running()` is the fixture-side guarantee
  that the server is up again whatever happened in the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import threading
import time
from pathlib import Path

from django.db import connections

MARIADB_HOST = "127.0.0.1"
MARIADB_PORT = 3306
MARIADBD = "/usr/sbin/mariadbd"
# The shared server's pid file (Debian's my.cnf): it tells that server from the replica tests' pair.
PID_FILE = Path("/run/mysqld/mysqld.pid")


# -------------------------------------------------------------------------------------------------
# A proxy whose outage is real at the TCP level
# -------------------------------------------------------------------------------------------------
class DatabaseOutageProxy:
    """Forwards 127.0.0.1:<port> to the database; `outage()` aborts every connection and stops listening,
    `restore()` listens again on the same port."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port: int | None = None
        self.outages = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="db-proxy")
        self._server: asyncio.base_events.Server | None = None
        self._transports: set = set()

    def start(self) -> DatabaseOutageProxy:
        self._thread.start()
        self._listen()
        return self

    def _listen(self) -> None:
        async def listen():
            return await asyncio.start_server(self._handle, "127.0.0.1", self.port or 0, reuse_address=True)

        self._server = self._call(listen())
        self.port = self._server.sockets[0].getsockname()[1]

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    async def _handle(self, reader, writer) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()
            return
        pair = {writer.transport, up_writer.transport}
        self._transports |= pair

        async def pipe(src, dst) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._transports -= pair

    @property
    def open_connections(self) -> int:
        return len(self._transports) // 2

    def outage(self) -> None:
        """Abort every open connection (RST) and refuse new ones until `restore()`."""
        self._down()
        self.outages += 1

    def _down(self) -> None:
        async def down():
            self._server.close()
            for transport in list(self._transports):
                transport.abort()
            self._transports.clear()

        self._call(down())

    def restore(self) -> None:
        if self._server is not None and not self._server.is_serving():
            self._listen()

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._down()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@contextlib.contextmanager
def routed_through(proxy: DatabaseOutageProxy, alias: str = "default"):
    """New database connections (of every thread) go through `proxy` until the block ends.

    Django's per-thread connection wrappers share one settings dict per alias, so changing HOST/PORT
    there affects every connection opened afterwards; open connections are closed first.
    """
    settings_dict = connections[alias].settings_dict
    saved = settings_dict["HOST"], settings_dict["PORT"]
    connections[alias].close()
    settings_dict["HOST"], settings_dict["PORT"] = "127.0.0.1", str(proxy.port)
    try:
        yield proxy
    finally:
        settings_dict["HOST"], settings_dict["PORT"] = saved
        connections[alias].close()


# -------------------------------------------------------------------------------------------------
# Restarting the local MariaDB server
# -------------------------------------------------------------------------------------------------
def _admin(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["mariadb-admin", "--protocol=tcp", f"-h{MARIADB_HOST}", f"-P{MARIADB_PORT}", "-uroot", *args],
        capture_output=True,
        timeout=timeout,
        check=False,
    )


def mariadb_answers() -> bool:
    try:
        return _admin("ping", timeout=5).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _mariadbd_pids() -> list[int]:
    """The shared server's process (its pid file), if it is alive: never the replica tests' pair of
    `scripts/mariadb-replica.sh`, other `mariadbd` processes on 3307/3308 that this test must not wait for."""
    try:
        pid = int(PID_FILE.read_text().strip())
    except (OSError, ValueError):
        return []
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass
    return [pid]


def start_mariadb(timeout: float = 60) -> None:
    """Start mariadbd as `scripts/mariadb.sh` does and wait until it answers."""
    if mariadb_answers():
        return
    run_dir = Path("/run/mysqld")
    run_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(["chown", "mysql:mysql", str(run_dir)], check=False)
    # --pidfile: a `mariadbd` of the replica pair is not this server already running.
    start = ["start-stop-daemon", "--start", "--oknodo", "--background", "--pidfile", str(PID_FILE)]
    start += ["--exec", MARIADBD]
    subprocess.run([*start, "--", "--user=mysql"], check=True, timeout=30)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if mariadb_answers():
            return
        time.sleep(0.2)
    raise RuntimeError(f"mariadbd did not answer within {timeout:g} s")


def stop_mariadb(timeout: float = 60) -> None:
    """`mariadb-admin shutdown`, then wait until no mariadbd process is left."""
    _admin("shutdown", timeout=timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _mariadbd_pids():
            return
        time.sleep(0.1)
    raise RuntimeError(f"mariadbd did not stop within {timeout:g} s")


def restart_mariadb() -> float:
    """Stop and start the server; returns how long it was unavailable (seconds)."""
    began = time.monotonic()
    stop_mariadb()
    assert not mariadb_answers()
    start_mariadb()
    return time.monotonic() - began


def close_connections_of_this_process() -> None:
    """Close the database connections this test process keeps in the threads tests share: this thread,
    and asgiref's single thread for `sync_to_async` (channels' `database_sync_to_async` and async tests
    run ORM code there). After a server restart they are all dead, and later tests must not meet them."""
    connections.close_all()
    from asgiref.sync import SyncToAsync

    executor = getattr(SyncToAsync, "single_thread_executor", None)
    if executor is not None:
        executor.submit(connections.close_all).result(10)


@contextlib.contextmanager
def mariadb_running():
    """Whatever happens inside, MariaDB answers again afterwards, and no connection of this process
    opened before is left to later tests."""
    try:
        yield
    finally:
        start_mariadb()
        close_connections_of_this_process()
