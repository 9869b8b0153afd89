"""Where a pasted secret could land, scanned for the originals (issue 33's tests): every table of the
database (every column of every row, read with raw SQL), the provider's received requests, captured log
records, the run's canonical store and its OpenTelemetry spans."""

from __future__ import annotations

import json
from collections.abc import Iterable

from django.db import connection


def found_in_tables(originals: Iterable[str]) -> list[str]:
    """`table: original` for every original found in any column of any row (raw SQL, as a dump sees
    it)."""
    originals = list(originals)
    hits = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names(cursor):
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
            for row in cursor.fetchall():
                text = " ".join(_text(v) for v in row)
                hits += [f"{table}: {o[:12]}…" for o in originals if o in text]
    return sorted(set(hits))


def _text(value) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def found_in_requests(requests_by_model: dict, originals: Iterable[str]) -> list[str]:
    """`model: original` for every original in any request body the fake provider received."""
    originals = list(originals)
    hits = []
    for model, requests in requests_by_model.items():
        for request in requests:
            body = request.body.decode("utf-8", "replace")
            # JSON escapes ("\n", "/" as is, non-ASCII as \\u): compare with the decoded text too.
            text = body + json.dumps(request.json, ensure_ascii=False)
            hits += [f"{model}: {o[:12]}…" for o in originals if o in text or json.dumps(o)[1:-1] in body]
    return sorted(set(hits))


def found_in_logs(records, originals: Iterable[str]) -> list[str]:
    originals = list(originals)
    hits = []
    for record in records:
        text = record.getMessage() + " " + str(record.args) + " " + str(getattr(record, "exc_text", "") or "")
        hits += [f"{record.name}: {o[:12]}…" for o in originals if o in text]
    return sorted(set(hits))


def found_in_spans(spans, originals: Iterable[str]) -> list[str]:
    originals = list(originals)
    hits = []
    for span in spans:
        text = span.to_json()
        hits += [f"{span.name}: {o[:12]}…" for o in originals if o in text or json.dumps(o)[1:-1] in text]
    return sorted(set(hits))
