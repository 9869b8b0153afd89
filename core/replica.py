"""The read replica's health and lag, measured by a heartbeat (what `core.db_router` decides with).

Each process writes its own heartbeat row on the primary and reads it back from the replica, at most
every `DATABASE_REPLICA_CHECK_SECONDS`, on two connections of its own (never a request's). From them it
derives the replica's watermark and lag, both from this process's clock, so the servers' clocks never
enter the figure. `usable(max_lag)` is what the router asks.
Details: docs/reliability.md, *Reads on a replica* (lag, measured by a heartbeat).
"""

from __future__ import annotations

import collections
import contextlib
import os
import socket
import threading
import time
from dataclasses import dataclass

from django.conf import settings
from django.db import DatabaseError, connections
from django.db.utils import load_backend

PRIMARY = "default"
REPLICA = "replica"

_CREATE = (
    "CREATE TABLE IF NOT EXISTS replica_heartbeat ("
    "source VARCHAR(100) NOT NULL PRIMARY KEY, beat BIGINT NOT NULL)"
)
_WRITE = (
    "INSERT INTO replica_heartbeat (source, beat) VALUES (%s, %s) ON DUPLICATE KEY UPDATE beat = VALUES(beat)"
)
_READ = "SELECT beat FROM replica_heartbeat WHERE source = %s"
# Rows of processes gone for a day are removed by whichever process writes (one statement, rarely).
_PRUNE = "DELETE FROM replica_heartbeat WHERE beat < %s"
_PRUNE_AFTER_US = 86_400 * 1_000_000


@dataclass(frozen=True)
class ReplicaState:
    """One measurement. `state` is `healthy`, `lagging`, `down` or `unknown` (never measured, or the
    primary did not answer); `lag` in seconds (None when not measured); `watermark` the write time (Unix
    seconds) of the newest beat the replica has applied; `checked_at` a `time.monotonic()`."""

    state: str
    lag: float | None
    watermark: float | None
    checked_at: float

    def usable(self, max_lag: float) -> bool:
        return self.state in ("healthy", "lagging") and self.lag is not None and self.lag <= max_lag


UNCHECKED = ReplicaState("unknown", None, None, float("-inf"))


class ReplicaMonitor:
    """The heartbeat of one process (see the module docstring). Thread-safe: one thread measures at a
    time; the others meanwhile use the last measurement."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state = UNCHECKED
        self._beats: collections.deque[int] = collections.deque(maxlen=4096)
        self._source = f"{socket.gethostname()}:{os.getpid()}"[:100]
        self._conns: dict[str, object] = {}
        self._created = False
        self._pruned_at = 0.0

    # -- what the router asks ---------------------------------------------------------------------
    def state(self) -> ReplicaState:
        """The last measurement, measured again first when older than `DATABASE_REPLICA_CHECK_SECONDS`
        (unless another thread is measuring right now)."""
        current = self._state
        if time.monotonic() - current.checked_at < float(settings.DATABASE_REPLICA_CHECK_SECONDS):
            return current
        if not self._lock.acquire(blocking=False):
            return current
        try:
            self._state = self._measure()
            return self._state
        finally:
            self._lock.release()

    def peek(self) -> ReplicaState:
        """The last measurement, without measuring."""
        return self._state

    def failed(self) -> None:
        """A read on the replica failed with a database error: treat it as down until the next check."""
        self._state = ReplicaState("down", None, None, time.monotonic())

    def reset(self) -> None:
        """Forget the measurements and close the monitor's connections (tests, settings changes)."""
        with self._lock:
            self._state = UNCHECKED
            self._beats.clear()
            self._created = False
            for alias in list(self._conns):
                self._close(alias)

    # -- measuring --------------------------------------------------------------------------------
    def _connection(self, alias: str):
        conn = self._conns.get(alias)
        if conn is None:
            config = dict(connections.settings[alias])
            options = dict(config.get("OPTIONS") or {})
            timeout = max(1, round(float(settings.DATABASE_REPLICA_CONNECT_TIMEOUT)))
            options.setdefault("connect_timeout", timeout)
            options.setdefault("read_timeout", timeout)
            options.setdefault("write_timeout", timeout)
            config["OPTIONS"] = options
            config["CONN_MAX_AGE"] = None
            conn = load_backend(config["ENGINE"]).DatabaseWrapper(config, f"{alias}-heartbeat")
            # Used by whichever thread measures, one at a time (under the monitor's lock).
            conn.inc_thread_sharing()
            self._conns[alias] = conn
        return conn

    def _close(self, alias: str) -> None:
        conn = self._conns.pop(alias, None)
        if conn is not None:
            with contextlib.suppress(DatabaseError):
                conn.close()

    def _execute(self, alias: str, sql: str, params: tuple) -> list:
        conn = self._connection(alias)
        try:
            with conn.cursor() as cursor:
                cursor.execute(sql, params)
                return list(cursor.fetchall()) if cursor.description else []
        except DatabaseError:
            self._close(alias)
            raise

    def _measure(self) -> ReplicaState:
        now = time.time()
        beat = int(now * 1_000_000)
        try:
            if not self._created:
                self._execute(PRIMARY, _CREATE, ())
                self._created = True
            self._execute(PRIMARY, _WRITE, (self._source, beat))
            if now - self._pruned_at > 3600:
                self._execute(PRIMARY, _PRUNE, (beat - _PRUNE_AFTER_US,))
                self._pruned_at = now
        except DatabaseError:
            return ReplicaState("unknown", None, None, time.monotonic())
        self._beats.append(beat)
        try:
            rows = self._execute(REPLICA, _READ, (self._source,))
        except DatabaseError as exc:
            # 1146: the table has not reached the replica yet (it is behind, not down).
            if getattr(exc, "args", None) and exc.args[0] == 1146:
                return self._lagging(None, time.time())
            return ReplicaState("down", None, None, time.monotonic())
        applied = int(rows[0][0]) if rows else None
        return self._lagging(applied, time.time())

    def _lagging(self, applied: int | None, now: float) -> ReplicaState:
        pending = [b for b in self._beats if applied is None or b > applied]
        lag = 0.0 if not pending else max(0.0, now - pending[0] / 1_000_000)
        if applied is not None:  # the beats the replica has are no longer needed to measure
            while self._beats and self._beats[0] <= applied:
                self._beats.popleft()
        state = "healthy" if lag <= float(settings.DATABASE_REPLICA_MAX_LAG_SECONDS) else "lagging"
        watermark = applied / 1_000_000 if applied is not None else None
        return ReplicaState(state, lag, watermark, time.monotonic())


monitor = ReplicaMonitor()
