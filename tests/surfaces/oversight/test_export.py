"""`manage.py export_traces`: the API's trace shape per line (no reasoning), the period's runs only,
Parquet when pyarrow is there, and memory that does not grow with the number of runs."""

from __future__ import annotations

import datetime as dt
import io
import json
import tracemalloc

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from audit.read import get_trace
from diagnosis.models import DiagnosisRun
from surfaces.api.trace_export import jsonl_lines
from surfaces.api.trace_render import trace_data
from tests.bulk import DAY0, bulk_runs
from tests.factories import REASONING_MARKER, make_recorded_run

pytestmark = pytest.mark.django_db


def _export(*args) -> list[dict]:
    out = io.StringIO()
    call_command("export_traces", *args, stdout=out, stderr=io.StringIO())
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_export_is_the_api_trace_of_each_run_of_the_period_without_reasoning(user):
    runs = [make_recorded_run(user), make_recorded_run(user)]
    DiagnosisRun.objects.filter(pk=runs[1].pk).update(created_at=DAY0)  # outside the period
    today = timezone.now().date()
    traces = _export(
        "--since", str(today - dt.timedelta(days=1)), "--until", str(today + dt.timedelta(days=1))
    )
    assert [t["run"]["runId"] for t in traces] == [runs[0].run_id]
    assert traces[0] == trace_data(get_trace(run=DiagnosisRun.objects.get(pk=runs[0].pk)))
    assert REASONING_MARKER not in json.dumps(traces)
    assert _export("--since", "2026-10-01", "--until", "2026-10-02")[0]["run"]["runId"] == runs[1].run_id


def test_export_rejects_a_bad_period():
    with pytest.raises(CommandError, match="--until must be after --since"):
        _export("--since", "2026-10-02", "--until", "2026-10-01")
    with pytest.raises(CommandError, match="not a date"):
        _export("--since", "yesterday", "--until", "2026-10-01")


def test_parquet_export_has_one_row_per_run(user, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    bulk_runs(user, 30, days=3)
    path = tmp_path / "traces.parquet"
    call_command(
        "export_traces", "--since", "2026-10-01", "--until", "2026-10-03", "--format", "parquet",
        "--output", str(path), "--chunk", "7", stderr=io.StringIO(),
    )  # fmt: skip
    table = pq.read_table(path)
    assert table.num_rows == 20  # days 0 and 1 of 3
    rows = table.to_pylist()
    assert {r["run_id"] for r in rows} == {f"bulk{i:09d}" for i in range(30) if i % 3 != 2}
    assert all(json.loads(r["trace"])["run"]["runId"] == r["run_id"] for r in rows)


def _peak(n: int) -> tuple[int, int]:
    """Peak traced memory while exporting the runs of `bulk_runs(…, n)` into a byte counter."""
    runs = DiagnosisRun.objects.filter(run_id__startswith=f"m{n}_")
    written = 0
    tracemalloc.start()
    try:
        for line in jsonl_lines(runs, chunk=200):
            written += len(line)
        return tracemalloc.get_traced_memory()[1], written
    finally:
        tracemalloc.stop()


# Once, on the production database: mysqlclient's fetching is what could hold a whole export in memory.
@pytest.mark.mariadb_half
def test_export_memory_does_not_grow_with_the_number_of_runs(user):
    """Over 30 s (about 130 s on 2 cores with MariaDB): it writes 5,500 runs in bulk and exports them
    twice under tracemalloc, because a streaming export only shows its flat memory against a tenfold
    larger export (a smaller ratio would be within the allocator's noise); 500 runs are still several of
    the export's 200-run chunks."""
    bulk_runs(user, 500, prefix="m500_")
    bulk_runs(user, 5_000, prefix="m5000_")
    small, small_bytes = _peak(500)
    large, large_bytes = _peak(5_000)
    assert large_bytes > 9 * small_bytes  # ten times the traces went through…
    # …in the memory of one chunk: the peak of 5,000 runs stays within 1.5 × that of 500 (a list of
    # the traces would take ten times as much).
    assert large < 1.5 * small, (small, large)
    assert large < 64 * 1024 * 1024
