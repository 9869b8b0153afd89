"""Traces of a period or of a filtered run list, streamed: the API's trace shape (`surfaces.api.trace_render`,
equal to `surfaces.api.audit_serializers.TraceSerializer`), never reasoning or assistant text, read
`iter_traces`' chunk at a time so memory does not grow with the number of runs.

* JSON Lines: one trace object per line (`jsonl_lines`), for `manage.py export_traces` and the admin's
  export action (a streaming response).
* Parquet (`write_parquet`): one row per run (run id, session id, created at, status, release decision,
  cost, the trace as JSON text), one row group per chunk; needs `pyarrow`, which is optional at run time
  (`ParquetUnavailable` says how to install it).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import IO, Any

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet

from audit.read import EXPORT_CHUNK, iter_traces
from diagnosis.models import DiagnosisRun
from surfaces.api.trace_render import trace_data

PARQUET_COLUMNS = ("run_id", "session_id", "created_at", "status", "release_decision", "cost", "trace")


class ParquetUnavailable(RuntimeError):
    pass


def trace_dicts(
    runs: QuerySet[DiagnosisRun], *, viewer: AbstractBaseUser | None = None, chunk: int = EXPORT_CHUNK
) -> Iterator[dict[str, Any]]:
    for trace in iter_traces(runs, viewer=viewer, chunk=chunk):
        yield trace_data(trace)


def jsonl_lines(
    runs: QuerySet[DiagnosisRun], *, viewer: AbstractBaseUser | None = None, chunk: int = EXPORT_CHUNK
) -> Iterator[str]:
    """Each run's trace as one line of JSON (UTF-8 text, `\\n`-terminated)."""
    for body in trace_dicts(runs, viewer=viewer, chunk=chunk):
        yield json.dumps(body, ensure_ascii=False, separators=(",", ":")) + "\n"


def _pyarrow():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:  # optional: JSON Lines needs nothing
        raise ParquetUnavailable(
            "Parquet export needs pyarrow: pip install pyarrow (requirements-dev.txt pins it), "
            "or use --format jsonl"
        ) from exc
    return pa, pq


def write_parquet(runs: QuerySet[DiagnosisRun], out: IO[bytes], *, chunk: int = EXPORT_CHUNK) -> int:
    """Write the runs' traces to `out` as Parquet; returns how many rows were written."""
    pa, pq = _pyarrow()
    schema = pa.schema([(name, pa.string()) for name in PARQUET_COLUMNS])
    written = 0
    with pq.ParquetWriter(out, schema) as writer:
        rows: list[dict[str, Any]] = []
        for body in trace_dicts(runs, chunk=chunk):
            run = body["run"]
            rows.append(
                {
                    "run_id": run["runId"],
                    "session_id": run["sessionId"],
                    "created_at": run["timing"]["createdAt"],
                    "status": run["status"],
                    "release_decision": run["releaseDecision"],
                    "cost": run["cost"]["amount"],
                    "trace": json.dumps(body, ensure_ascii=False, separators=(",", ":")),
                }
            )
            if len(rows) >= chunk:
                writer.write_table(pa.Table.from_pylist(rows, schema=schema))
                written += len(rows)
                rows = []
        if rows:
            writer.write_table(pa.Table.from_pylist(rows, schema=schema))
            written += len(rows)
    return written


__all__ = ["PARQUET_COLUMNS", "ParquetUnavailable", "jsonl_lines", "trace_dicts", "write_parquet"]
