"""The canonical store: the current run's full tool results, the only ground the evidence guard accepts.

Backed by the Django cache alias `canonical` (local memory, or Redis with `REDIS_URL`), with keys per run
(each tool's full result, each citable evidence item, an interrupted run's encrypted executor state)
and the TTL `CANONICAL_TTL_SECONDS`. It is fail-closed (seed 001, section 7): every write is read back
and compared, and any failure raises `CanonicalUnavailable`, after which the run's store is degraded and
the evidence guard blocks what it cannot prove. Methods are synchronous; the runtime calls them on its
database pool via `db()`.
Details: docs/runtime.md, *Canonical store (`canonical.py`)*.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from django.conf import settings
from django.core.cache import caches

from audit.payloads import canonical_json

logger = logging.getLogger(__name__)

CACHE_ALIAS = "canonical"


class CanonicalUnavailable(Exception):
    """The canonical store could not store, read, or faithfully return a value."""


class CanonicalStore:
    """One run's view of the canonical store (see the module docstring)."""

    def __init__(self, run_id: str, *, alias: str = CACHE_ALIAS) -> None:
        self.run_id = run_id
        self.alias = alias

    def _cache(self):
        return caches[self.alias]

    def _timeout(self) -> int:
        return int(settings.CANONICAL_TTL_SECONDS)

    def tool_key(self, tool_call_id: str) -> str:
        return f"run:{self.run_id}:tool:{tool_call_id}"

    def evidence_key(self, evidence_id: str) -> str:
        return f"run:{self.run_id}:evidence:{evidence_id}"

    def put_result(self, *, tool_call_id: str, result_json: str, evidence: Mapping[str, Any]) -> None:
        """Store a tool's full result and its evidence items, then read everything back and compare."""
        items = {self.tool_key(tool_call_id): result_json}
        for evidence_id, payload in evidence.items():
            items[self.evidence_key(evidence_id)] = canonical_json(payload)
        try:
            cache = self._cache()
            failed = cache.set_many(items, timeout=self._timeout())
            back = cache.get_many(list(items))
        except Exception as exc:
            self._log("write", exc)
            raise CanonicalUnavailable(f"canonical store write failed ({type(exc).__name__})") from None
        if failed or back != items:
            logger.error("canonical store read-back mismatch run=%s keys=%d", self.run_id, len(items))
            raise CanonicalUnavailable("canonical store read-back did not match what was written")

    def get_evidence(self, evidence_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The stored payloads of the given ids that exist in this run's store (missing ids are absent)."""
        ids = list(dict.fromkeys(evidence_ids))
        if not ids:
            return {}
        keys = {self.evidence_key(i): i for i in ids}
        try:
            found = self._cache().get_many(list(keys))
        except Exception as exc:
            self._log("read", exc)
            raise CanonicalUnavailable(f"canonical store read failed ({type(exc).__name__})") from None
        try:
            return {keys[key]: json.loads(value) for key, value in found.items()}
        except (TypeError, ValueError):
            raise CanonicalUnavailable("canonical store returned an unreadable value") from None

    def get_result(self, tool_call_id: str) -> Any:
        """A tool call's full stored result, or None when absent."""
        try:
            value = self._cache().get(self.tool_key(tool_call_id))
        except Exception as exc:
            self._log("read", exc)
            raise CanonicalUnavailable(f"canonical store read failed ({type(exc).__name__})") from None
        return None if value is None else json.loads(value)

    def state_key(self, name: str) -> str:
        return f"run:{self.run_id}:state:{name}"

    def put_state(self, name: str, text: str, *, timeout: int | None = None) -> None:
        """Store a piece of the run's own working state (the executor's checkpoint at an interruption),
        read it back and compare; kept `timeout` seconds (default `CANONICAL_TTL_SECONDS`), no longer."""
        key = self.state_key(name)
        try:
            cache = self._cache()
            cache.set(key, text, timeout=int(timeout) if timeout else self._timeout())
            back = cache.get(key)
        except Exception as exc:
            self._log("write", exc)
            raise CanonicalUnavailable(f"canonical store write failed ({type(exc).__name__})") from None
        if back != text:
            raise CanonicalUnavailable("canonical store read-back did not match what was written")

    def get_state(self, name: str) -> str | None:
        try:
            return self._cache().get(self.state_key(name))
        except Exception as exc:
            self._log("read", exc)
            raise CanonicalUnavailable(f"canonical store read failed ({type(exc).__name__})") from None

    def _log(self, op: str, exc: Exception) -> None:
        logger.error("canonical store %s failed run=%s error=%s", op, self.run_id, type(exc).__name__)


DELETE_BATCH = 500


def delete_states(run_ids: Iterable[str], name: str, *, alias: str = CACHE_ALIAS) -> int:
    """Delete the state `name` of each run in `run_ids` (in batches of `DELETE_BATCH` keys); returns how
    many runs were named. A store that cannot be reached raises `CanonicalUnavailable`."""
    cache = caches[alias]
    named = 0
    batch: list[str] = []
    for run_id in run_ids:
        batch.append(CanonicalStore(str(run_id), alias=alias).state_key(name))
        if len(batch) >= DELETE_BATCH:
            named += _delete(cache, batch)
            batch = []
    if batch:
        named += _delete(cache, batch)
    return named


def _delete(cache: Any, keys: list[str]) -> int:
    try:
        cache.delete_many(keys)
    except Exception as exc:
        logger.error("canonical store delete failed keys=%d error=%s", len(keys), type(exc).__name__)
        raise CanonicalUnavailable(f"canonical store delete failed ({type(exc).__name__})") from None
    return len(keys)
