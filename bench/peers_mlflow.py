"""B0's MLflow side, run by `.venv-peers/bin/python -m bench.peers_mlflow TRACKING_URI EXPERIMENT` (bench B0
drives it; MLflow is not installed in the app's venv).

MLflow tracing with its SQLAlchemy tracking store on the bench's MariaDB, trace logging synchronous
(`MLFLOW_ENABLE_ASYNC_TRACE_LOGGING=false`: a run's trace is written when its root span ends, before the
call returns). Commands on standard input, one JSON answer per line on standard output:

    seq N      record N runs one after another; {"seconds": …}
    burst N    record N runs at once from 16 threads; {"seconds": …, "errors": …}
    count      {"traces": …, "spans": …} stored in the experiment
"""

from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

os.environ["MLFLOW_ENABLE_ASYNC_TRACE_LOGGING"] = "false"

import mlflow
from mlflow.entities import SpanEvent

from bench.peer_shape import spans


def record_run(run_no: int) -> None:
    shape = spans(run_no)
    children: dict[int | None, list[int]] = {}
    for i, s in enumerate(shape):
        children.setdefault(s["parent"], []).append(i)

    def open_span(i: int) -> None:
        s = shape[i]
        with mlflow.start_span(name=s["name"], span_type=s["kind"]) as span:
            span.set_attributes(s["attributes"])
            for name, attributes in s["events"]:
                span.add_event(SpanEvent(name=name, attributes=attributes))
            for child in children.get(i, []):
                open_span(child)

    open_span(children[None][0])


def count(experiment_id: str) -> dict:
    traces = mlflow.search_traces(experiment_ids=[experiment_id], return_type="list", max_results=100_000)
    return {"traces": len(traces), "spans": sum(len(t.data.spans) for t in traces)}


def main() -> int:
    uri, experiment = sys.argv[1], sys.argv[2]
    mlflow.set_tracking_uri(uri)
    experiment_id = mlflow.set_experiment(experiment).experiment_id
    record_run(-1)  # warm-up: schema, connections
    print(json.dumps({"ready": True, "experiment_id": experiment_id}), flush=True)
    counter = 0
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "seq":
            n = int(arg)
            start = time.perf_counter()
            for _ in range(n):
                record_run(counter)
                counter += 1
            print(json.dumps({"seconds": time.perf_counter() - start}), flush=True)
        elif cmd == "burst":
            n = int(arg)
            first, counter = counter, counter + n
            errors = 0
            start = time.perf_counter()
            with ThreadPoolExecutor(max_workers=16) as pool:
                for future in [pool.submit(record_run, first + i) for i in range(n)]:
                    try:
                        future.result()
                    except Exception:
                        errors += 1
            print(json.dumps({"seconds": time.perf_counter() - start, "errors": errors}), flush=True)
        elif cmd == "count":
            print(json.dumps(count(experiment_id)), flush=True)
        elif cmd == "quit":
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
