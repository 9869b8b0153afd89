"""B8 — trace export throughput: finished runs per second into a real Phoenix over OTLP/HTTP.

Runs are recorded through the real recorder (`tests.factories.record_full_run`: router attempt, a step
with two tool calls, the answer step, both guards, release; 9 spans per run once projected). Each
repetition puts them back in the outbox and drains it with the server's own code path
(`telemetry.outbox.export_due`: claim, `get_trace` from the durable record, projection, one OTLP/HTTP
request per run) into `phoenix serve` from `.venv-phoenix` (started here on free 127.0.0.1 ports, as
in the tests). Reported beside it: the projection alone (trace read + span building, no network), so
the share of the exporter and Phoenix's ingest is visible. "Into Phoenix" means accepted by its OTLP
endpoint (HTTP 200); Phoenix writes the spans to its store asynchronously.

Not part of the default set (it needs `.venv-phoenix`, which `scripts/setup.sh dev` creates):
`python -m bench --only b8`.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from bench.stats import Row, spread


def run_all(*, runs: int, reps: int, log=print) -> list[Row]:
    from django.contrib.auth import get_user_model

    from audit.read import get_trace
    from diagnosis import services
    from diagnosis.models import DiagnosisRun
    from telemetry.outbox import export_due, make_exporter, requeue
    from telemetry.spans import project_trace, resource
    from tests.factories import record_full_run
    from tests.telemetry.phoenix import PhoenixServer, missing

    reason = missing()
    if reason:
        log(f"  B8 skipped: {reason}")
        return []
    user, _ = get_user_model().objects.get_or_create(username="bench-otel")
    session = services.create_session(owner=user)
    run_ids = []
    for _ in range(runs):
        run = services.create_run(session=session, query="Why is replication lagging?")
        record_full_run(run)
        run_ids.append(run.run_id)

    with tempfile.TemporaryDirectory(prefix="bench-phoenix-") as workdir:
        phoenix = PhoenixServer(Path(workdir))
        started = time.perf_counter()
        phoenix.start()
        startup = time.perf_counter() - started
        log(f"  B8 phoenix serve ready in {startup:.1f} s")
        exported_rates, projected_rates, spans_per_run = [], [], 0
        try:
            for rep in range(reps):
                t0 = time.perf_counter()
                total = 0
                for run in DiagnosisRun.objects.filter(run_id__in=run_ids).select_related("session"):
                    total += len(project_trace(get_trace(run=run), resource_=resource()))
                projected_rates.append(runs / (time.perf_counter() - t0))
                spans_per_run = total // runs

                requeue(run_ids=run_ids)
                exporter = make_exporter(phoenix.otlp_endpoint)
                t0 = time.perf_counter()
                done = 0
                try:
                    while done < runs:
                        result = export_due(exporter=exporter, limit=runs)
                        if result.failed:
                            raise RuntimeError(f"export failed:\n{phoenix.log_tail()}")
                        if not result.exported:
                            break
                        done += result.exported
                finally:
                    exporter.shutdown()
                exported_rates.append(done / (time.perf_counter() - t0))
                log(
                    f"  B8 rep {rep + 1}/{reps}: {exported_rates[-1]:.1f} runs/s into Phoenix, "
                    f"projection alone {projected_rates[-1]:.1f} runs/s"
                )
        finally:
            phoenix.close()
    into = spread(exported_rates)
    alone = spread(projected_rates)
    return [
        Row(
            "B8",
            "export finished runs into Phoenix (OTLP/HTTP, one request per run)",
            f"{into.median:.1f} runs/s ({spans_per_run} spans per run, {runs} runs)",
            into,
            None,
            ratio_unit=" runs/s",
            note=f"phoenix serve ready in {startup:.1f} s",
        ),
        Row(
            "B8",
            "projection alone (get_trace + span building, no network)",
            f"{alone.median:.1f} runs/s",
            alone,
            None,
            ratio_unit=" runs/s",
        ),
    ]
