"""Rows bound by an appended event whose table lives in a higher layer (evaluation scores): how the
verifier finds them without importing that layer.

An `APPENDED` event type that binds a row of another app declares in the registry (`audit.events`) the
details key naming the row and the key carrying its digest (`EventSpec.keys`); the app that owns the
table registers, when Django starts (its `AppConfig.ready`), a `RowSource`: for a batch of run ids,
each stored row's id and the digest recomputed from the stored columns (its form in
`audit.verify.row_digests`, registered with `rowdigest.register_form`). `audit.verify.rows.verify_rows` then
holds every stored row against the latest event binding it, as it does for reviews: a changed row, a row
without an event, and an event whose row is gone are each named by `verify_audit` and the trace summary.

The offline bundle verifier (`audit.transparency.bundle`) does not carry these rows: it checks the
events themselves (their chain and anchor), not the rows they bind.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from audit.events import BY_TYPE


@dataclass(frozen=True, slots=True)
class AppendedRow:
    """One stored row bound by an appended event: its event type, id, label for people (`evaluation
    score`) and the digest of its stored columns."""

    event_type: str
    row_id: str
    label: str
    digest: str


# run ids -> [(run id, row id, digest of the stored row)]
RowsOf = Callable[[Sequence[str]], list[tuple[str, str, str]]]


@dataclass(frozen=True, slots=True)
class RowSource:
    event_type: str
    label: str
    rows_of: RowsOf
    # Run ids whose rows exist without a run row (an orphan check, like `orphaned_run_ids`).
    run_ids: Callable[[], set[str]] | None = None
    # The model of the rows (with a `run_id` column) and its name in a purge's counts: the retention
    # purge deletes a purged run's rows with the record's own (`audit.write.retention`).
    model: Any = None
    purge_name: str = ""


_SOURCES: dict[str, RowSource] = {}


def register(source: RowSource) -> None:
    """Register the rows of `source.event_type` (declared with `keys` in `audit.events`)."""
    spec = BY_TYPE.get(source.event_type)
    if spec is None or not spec.keys:
        raise ValueError(f"{source.event_type}: not an event type that names its bound row (EventSpec.keys)")
    _SOURCES[source.event_type] = source


def sources() -> tuple[RowSource, ...]:
    return tuple(_SOURCES.values())


def rows_of(run_ids: Sequence[str]) -> Mapping[str, list[AppendedRow]]:
    """The registered rows of `run_ids`, by run id (one query per registered source)."""
    out: dict[str, list[AppendedRow]] = defaultdict(list)
    if not run_ids:
        return out
    for source in _SOURCES.values():
        for run_id, row_id, digest in source.rows_of(list(run_ids)):
            out[run_id].append(AppendedRow(source.event_type, row_id, source.label, digest))
    return out


def purge_tables() -> tuple[tuple[str, Any], ...]:
    """(name, model) of each registered source's table, for the retention purge."""
    return tuple((s.purge_name, s.model) for s in _SOURCES.values() if s.model is not None and s.purge_name)


def orphan_run_ids() -> set[str]:
    ids: set[str] = set()
    for source in _SOURCES.values():
        if source.run_ids is not None:
            ids |= source.run_ids()
    return ids
