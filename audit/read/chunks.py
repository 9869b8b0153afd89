"""Reading many runs a chunk at a time: the one paging rule of the trace export
(`audit.read.iter_traces`) and of verification (`audit.verify.runs.verify_all_runs`).

`run_chunks(runs, size)` yields the runs of `runs` in primary-key order, at most `size` at a time
(keyset paging on the primary key: memory holds one chunk whatever the number of runs, and no run is
read twice), each chunk with its runs' timeline events in chain order (one query per chunk; a run
without events is absent from the map). The caller reads the chunk's other rows itself.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from django.db.models import QuerySet

from audit.models import TraceEvent
from diagnosis.models import DiagnosisRun


def run_chunks(
    runs: QuerySet[DiagnosisRun], size: int
) -> Iterator[tuple[list[DiagnosisRun], dict[str, list[TraceEvent]]]]:
    """(runs, their events by run id) per chunk of at most `size` runs, in primary-key order (a chunk
    shorter than `size` is the last)."""
    last = 0
    while True:
        batch = list(runs.filter(pk__gt=last).order_by("pk")[:size])
        if not batch:
            return
        last = batch[-1].pk
        yield batch, events_of([r.run_id for r in batch])
        if len(batch) < size:
            return  # a short chunk was the last: no query for an empty one


def events_of(run_ids: list[str]) -> dict[str, list[TraceEvent]]:
    """The timeline events of `run_ids` in chain order, by run id (one query; a run without events is
    absent)."""
    events: dict[str, list[TraceEvent]] = defaultdict(list)
    for event in TraceEvent.objects.filter(run_id__in=run_ids).order_by("run_id", "sequence_no"):
        events[event.run_id].append(event)
    return events
