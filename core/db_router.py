"""Reads on a replica: explicit scopes at the read paths, a router whose default is the primary.

`ReplicaRouter` sends every read to the primary unless the code runs inside a replica scope, which only
the read-only surfaces open (`reads_from_replica` on selectors, `render_from_replica` on admin pages); a
scope decides once, when it opens, and falls back to the primary when the replica is missing, down,
lagging, the user is pinned or the read needs fresher data. Every write goes to the primary, and a read
that fails on the replica is run again there. See docs/reliability.md, *Reads on a replica*.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import functools
import inspect
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import DatabaseError, InterfaceError, OperationalError, ProgrammingError, connections

from core.middleware import StackMiddleware
from core.replica import PRIMARY, REPLICA, monitor
from core.request_context import current_request

LIVE = object()
"""`written_at` returns this for a read whose data is still being written (read the primary)."""

# What a read on the replica may meet that the primary would not: the server gone or refusing
# (OperationalError, InterfaceError), a table not replicated yet after a migration (ProgrammingError).
_REPLICA_ERRORS = (OperationalError, InterfaceError, ProgrammingError)
# A write's timestamp is taken before it commits: the replica must show a beat written this much later.
COMMIT_MARGIN_SECONDS = 1.0
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

_scope: contextvars.ContextVar[str | None] = contextvars.ContextVar("db_read_scope", default=None)

_counts: dict[tuple[str, str], int] = {}
_counts_lock = threading.Lock()


def _count(alias: str, reason: str) -> None:
    key = ("replica" if alias == REPLICA else "primary", reason)
    with _counts_lock:
        _counts[key] = _counts.get(key, 0) + 1


def read_counts() -> dict[tuple[str, str], int]:
    """Read scopes opened in this process by (database, reason), for /metrics."""
    with _counts_lock:
        return dict(_counts)


def replica_configured() -> bool:
    return REPLICA in connections.settings


def read_alias() -> str:
    """The alias the current code's reads go to (what the router answers for any model)."""
    alias = _scope.get()
    if alias is None or alias == PRIMARY or connections[PRIMARY].in_atomic_block:
        return PRIMARY
    return alias


# --------------------------------------------------------------------------------------------------
# Read your writes
# --------------------------------------------------------------------------------------------------
def _pin_key(user_pk: Any) -> str:
    return f"db-read-pin:{user_pk}"


def pin_reads_to_primary(user: Any) -> None:
    """`user` just wrote: their reads stay on the primary for `DATABASE_REPLICA_PIN_SECONDS` (shared by
    the processes through the default cache: Redis with `REDIS_URL`)."""
    seconds = float(settings.DATABASE_REPLICA_PIN_SECONDS)
    if seconds <= 0 or not replica_configured() or not getattr(user, "is_authenticated", False):
        return
    cache.set(_pin_key(user.pk), time.time() + seconds, timeout=max(1, round(seconds + 0.5)))


def _pinned() -> bool:
    request = current_request()
    if request is None:
        return False
    user = getattr(request, "user", None)
    if user is None or not getattr(user, "is_authenticated", False):
        return False
    until = cache.get(_pin_key(user.pk))
    return until is not None and until > time.time()


class ReplicaPinMiddleware(StackMiddleware):
    """Pins the request's user to the primary after a request that may have written (any method but GET,
    HEAD, OPTIONS), whatever its outcome. (The pin is read through `current_request()`, which
    `core.request_context.CurrentRequestMiddleware`, placed before this one, sets.)"""

    def __call__(self, request):
        if self.async_mode:
            return self.__acall__(request)
        try:
            return self.get_response(request)
        finally:
            self._pin(request)

    async def __acall__(self, request):
        try:
            return await self.get_response(request)
        finally:
            if request.method not in _SAFE_METHODS and replica_configured():
                from asgiref.sync import sync_to_async

                await sync_to_async(self._pin)(request)

    @staticmethod
    def _pin(request) -> None:
        if request.method in _SAFE_METHODS or not replica_configured():
            return
        user = getattr(request, "user", None)
        if user is not None:
            pin_reads_to_primary(user)


# --------------------------------------------------------------------------------------------------
# Scopes
# --------------------------------------------------------------------------------------------------
def _choose(written_at: Any) -> tuple[str, str]:
    if not replica_configured():
        return PRIMARY, "unconfigured"
    if connections[PRIMARY].in_atomic_block:
        return PRIMARY, "transaction"
    if written_at is LIVE:
        return PRIMARY, "fresh"
    if _pinned():
        return PRIMARY, "pinned"
    state = monitor.state()
    if not state.usable(float(settings.DATABASE_REPLICA_MAX_LAG_SECONDS)):
        return PRIMARY, "down" if state.state == "healthy" else state.state
    if written_at is not None:
        when = written_at.timestamp() if isinstance(written_at, dt.datetime) else float(written_at)
        if state.watermark is None or state.watermark < when + COMMIT_MARGIN_SECONDS:
            return PRIMARY, "fresh"
    return REPLICA, "replica"


@contextlib.contextmanager
def replica_reads(*, written_at: Any = None) -> Iterator[str]:
    """A replica scope around a block (no retry: prefer the decorator). Yields the alias chosen."""
    alias, reason = _choose(written_at)
    _count(alias, reason)
    token = _scope.set(alias)
    try:
        yield alias
    finally:
        _scope.reset(token)


@contextlib.contextmanager
def primary_reads() -> Iterator[None]:
    """Reads of the block go to the primary, even inside a replica scope."""
    token = _scope.set(PRIMARY)
    try:
        yield
    finally:
        _scope.reset(token)


def _failed_on_replica() -> None:
    monitor.failed()
    with contextlib.suppress(DatabaseError):
        connections[REPLICA].close()


def reads_from_replica(func: Callable | None = None, *, written_at: Callable[..., Any] | None = None):
    """Decorate a read-only function (or generator) so that its reads go to the replica when it is usable.

    `written_at(*args, **kwargs)`, given the call's arguments, returns what the read depends on: `None`,
    a time (the replica must show writes up to it) or `LIVE` (primary). An operational, interface or
    programming error on the replica before the function returned (a generator: before its first item)
    marks the replica down and runs the function again on the primary (reads only: no write repeats)."""

    def decorate(fn: Callable) -> Callable:
        if inspect.isgeneratorfunction(fn):

            @functools.wraps(fn)
            def generator(*args, **kwargs):
                when = written_at(*args, **kwargs) if written_at else None
                alias, reason = _choose(when)
                _count(alias, reason)
                gen, started = fn(*args, **kwargs), False
                while True:
                    token = _scope.set(alias)
                    try:
                        item = next(gen)
                    except StopIteration:
                        return
                    except _REPLICA_ERRORS:
                        if alias != REPLICA or started:
                            raise
                        _failed_on_replica()
                        _count(PRIMARY, "failover")
                        alias, gen = PRIMARY, fn(*args, **kwargs)
                        continue
                    finally:
                        _scope.reset(token)
                    started = True
                    yield item

            return generator

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with replica_reads(written_at=written_at(*args, **kwargs) if written_at else None) as alias:
                if alias != REPLICA:
                    return fn(*args, **kwargs)
                try:
                    return fn(*args, **kwargs)
                except _REPLICA_ERRORS:
                    _failed_on_replica()
            _count(PRIMARY, "failover")
            with primary_reads():
                return fn(*args, **kwargs)

        return wrapper

    return decorate(func) if func is not None else decorate


def render_from_replica(view: Callable[[], Any]) -> Any:
    """`view()` (an admin page: GET) inside a replica scope, its template response rendered inside it,
    again on the primary when the replica fails meanwhile."""

    def rendered():
        response = view()
        if hasattr(response, "render") and not getattr(response, "is_rendered", True):
            response.render()
        return response

    return reads_from_replica(rendered)()


# --------------------------------------------------------------------------------------------------
# The router
# --------------------------------------------------------------------------------------------------
class ReplicaRouter:
    """Reads: the current scope's alias (`read_alias`), the primary outside a scope or in a transaction.
    Writes and migrations: the primary only. Relations between the two aliases' objects are allowed (the
    same data)."""

    def db_for_read(self, model, **hints):
        return read_alias()

    def db_for_write(self, model, **hints):
        return PRIMARY

    def allow_relation(self, obj1, obj2, **hints):
        return True

    def allow_migrate(self, db, app_label, model_name=None, **hints):
        return db == PRIMARY
