"""B0 — the same run shape recorded through peers, as a ratio to B1's floor, and what a burst loses.

*Floor*: B1's (a run's 44 rows as single-row autocommit statements on a raw `MySQLdb` connection, each
durable before the next). *Peers*, each recording the run shape of `bench.peer_shape` (12 spans with the
23 timeline events as span events and attributes of the recorder's sizes):

* **MLflow tracing** (`.venv-peers`, `make bench-peers`) with its SQLAlchemy tracking store on the same
  MariaDB (database `<bench db>_mlflow`), trace logging synchronous: durable when the run's root span
  ends (`bench.peers_mlflow`, driven over a pipe so that its repetitions interleave with the floor's);
* **Arize Phoenix over OTLP/HTTP** (`phoenix serve` from `.venv-phoenix`, the OpenTelemetry SDK and
  exporter of the app's dev requirements), with the SDK's **simple** span processor (one export request
  per span as it ends; accepted by Phoenix, which stores it asynchronously: not durable when the call
  returns) and its **batch** processor (queued, exported in the background: the call returns at once).

Per repetition the floor and each peer record the same number of runs one after another; the figure is
the peer's time per run / the floor's. *Records lost*: after a burst of 200 runs recorded at once (16
threads), the spans stored (MLflow: in its store; Phoenix: through its REST API, after a flush and once
its count is stable) against 200 × 12. Skipped, with the reason, when a peer is absent.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench import b1_recording, peer_shape, workload
from bench.env import HOST, PORT, ROOT, USER, create_database, raw_connect
from bench.stats import Row, spread

PEERS_PYTHON = ROOT / ".venv-peers" / "bin" / "python"
BURST = 200


def mlflow_missing() -> str | None:
    if not PEERS_PYTHON.exists():
        return ".venv-peers not installed (make bench-peers)"
    probe = subprocess.run([str(PEERS_PYTHON), "-c", "import mlflow"], capture_output=True)
    return None if probe.returncode == 0 else "mlflow not installed in .venv-peers (make bench-peers)"


def phoenix_missing() -> str | None:
    from tests.telemetry.phoenix import missing

    try:
        import opentelemetry.sdk.trace  # noqa: F401
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: F401
    except ImportError:
        return "opentelemetry-sdk / the OTLP exporter not installed"
    return missing()


class MLflowPeer:
    def __init__(self, database: str, log) -> None:
        name = f"{database}_mlflow"
        create_database(name)
        uri = f"mysql+mysqldb://{USER}@{HOST}:{PORT}/{name}"
        # Run in test-artifacts/, where MLflow puts its artifact store (./mlruns).
        self.proc = subprocess.Popen(
            [str(PEERS_PYTHON), "-m", "bench.peers_mlflow", uri, f"bench-b0-{int(time.time())}"],
            cwd=ROOT / "test-artifacts",
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(ROOT / "test-artifacts" / "bench-mlflow.log", "wb"),  # noqa: SIM115
            text=True,
        )
        ready = self._read()
        log(f"  B0 mlflow ready (experiment {ready.get('experiment_id')})")

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("bench.peers_mlflow ended; see test-artifacts/bench-mlflow.log")
        return json.loads(line)

    def ask(self, command: str) -> dict:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
            self.proc.wait(30)


class CountingExporter:
    """The OTLP exporter, counting the spans it was handed and those whose export failed (the SDK logs a
    failed export and carries on: the caller never learns of it)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.handed = 0
        self.failed = 0

    def export(self, spans):
        from opentelemetry.sdk.trace.export import SpanExportResult

        self.handed += len(spans)
        result = self.inner.export(spans)
        if result != SpanExportResult.SUCCESS:
            self.failed += len(spans)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class PhoenixPeer:
    """One tracer provider per processor kind, each on its own Phoenix project."""

    def __init__(self, server, kind: str) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        self.server = server
        self.project = f"bench-b0-{kind}-{int(time.time())}"
        self.provider = TracerProvider(resource=Resource.create({"openinference.project.name": self.project}))
        exporter = CountingExporter(OTLPSpanExporter(endpoint=server.otlp_endpoint))
        self.exporter = exporter
        processor = SimpleSpanProcessor(exporter) if kind == "simple" else BatchSpanProcessor(exporter)
        self.provider.add_span_processor(processor)
        self.tracer = self.provider.get_tracer("bench.b0")
        self.runs = 0  # runs recorded so far

    def record_run(self, run_no: int) -> None:
        from opentelemetry import trace

        shape = peer_shape.spans(run_no)
        children: dict[int | None, list[int]] = {}
        for i, s in enumerate(shape):
            children.setdefault(s["parent"], []).append(i)

        def open_span(i: int, context=None) -> None:
            s = shape[i]
            with self.tracer.start_as_current_span(s["name"], context=context) as span:
                span.set_attribute("openinference.span.kind", s["kind"])
                span.set_attributes(s["attributes"])
                for name, attributes in s["events"]:
                    span.add_event(name, attributes)
                for child in children.get(i, []):
                    open_span(child)

        open_span(children[None][0], context=trace.set_span_in_context(trace.INVALID_SPAN))

    def seq(self, n: int, first: int) -> float:
        start = time.perf_counter()
        for i in range(n):
            self.record_run(first + i)
        self.runs += n
        return time.perf_counter() - start

    def burst(self, n: int, first: int) -> float:
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=16) as pool:
            list(pool.map(self.record_run, range(first, first + n)))
        self.runs += n
        return time.perf_counter() - start

    def stored_spans(self) -> int:
        import httpx

        total, cursor = 0, None
        while True:
            params = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
            response = httpx.get(
                f"{self.server.url}/v1/projects/{self.project}/spans", params=params, timeout=30
            )
            if response.status_code == 404:
                return 0
            response.raise_for_status()
            body = response.json()
            total += len(body.get("data", []))
            cursor = body.get("next_cursor")
            if not cursor:
                return total

    def settled_count(self, expected: int, timeout: float = 120.0, quiet: float = 15.0) -> int:
        """The project's stored spans once the count reaches `expected` or stops growing for `quiet`
        seconds (Phoenix stores what it accepted asynchronously, slowly on a loaded machine)."""
        self.provider.force_flush()
        deadline = time.monotonic() + timeout
        last, since = -1, time.monotonic()
        while time.monotonic() < deadline:
            n = self.stored_spans()
            if n >= expected:
                return n
            if n != last:
                last, since = n, time.monotonic()
            elif time.monotonic() - since > quiet:
                return n
            time.sleep(0.5)
        return last

    def close(self) -> None:
        self.provider.shutdown()


def run_all(*, runs_per_rep: int, reps: int, database: str, log=print) -> list[Row]:
    import logging

    from tests.telemetry.phoenix import PhoenixServer

    # The OTLP exporter's HTTP pool (10 connections) is smaller than the burst's 16 threads.
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    (ROOT / "test-artifacts").mkdir(exist_ok=True)
    reasons = {"mlflow": mlflow_missing(), "phoenix": phoenix_missing()}
    for name, reason in reasons.items():
        if reason:
            log(f"  B0 {name} skipped: {reason}")
    if all(reasons.values()):
        return []
    inputs = workload.make_inputs()
    session = b1_recording.services.create_session(owner=b1_recording.bench_user(), title="bench B0")
    template, template_run = b1_recording.capture_floor(session, inputs)
    conn = raw_connect(database)
    mlflow = MLflowPeer(database, log) if not reasons["mlflow"] else None
    workdir = tempfile.TemporaryDirectory(prefix="bench-b0-phoenix-")
    server = None
    peers: dict[str, PhoenixPeer] = {}
    if not reasons["phoenix"]:
        server = PhoenixServer(Path(workdir.name))
        server.start()
        peers = {kind: PhoenixPeer(server, kind) for kind in ("simple", "batch")}
    ratios: dict[str, list[float]] = {"mlflow": [], "simple": [], "batch": []}
    per_run: dict[str, list[float]] = {"floor": [], **{k: [] for k in ratios}}
    rows: list[Row] = []
    try:
        counter = 0
        for peer in peers.values():  # warm-up: connections, Phoenix's project
            peer.seq(2, counter)
            counter += 2
        for rep in range(reps):
            floor_runs = b1_recording.new_runs(session, runs_per_rep, "b0 floor")
            plans = b1_recording.floor_plan(template, template_run, [r.run_id for r in floor_runs])
            floor = b1_recording.run_floor(conn, plans) / runs_per_rep
            per_run["floor"].append(floor)
            if mlflow is not None:
                t = mlflow.ask(f"seq {runs_per_rep}")["seconds"] / runs_per_rep
                per_run["mlflow"].append(t)
                ratios["mlflow"].append(t / floor)
            for kind, peer in peers.items():
                t = peer.seq(runs_per_rep, counter) / runs_per_rep
                counter += runs_per_rep
                per_run[kind].append(t)
                ratios[kind].append(t / floor)
            log(
                f"  B0 rep {rep + 1}/{reps}: floor {floor * 1e3:.1f} ms per run; "
                + ", ".join(f"{k} {per_run[k][-1] * 1e3:.1f} ms" for k in ratios if per_run[k])
            )
        floor_ms = spread(per_run["floor"]).median * 1e3
        labels = {
            "mlflow": "MLflow tracing, SQL store on the same MariaDB, synchronous export (durable at return)",
            "simple": "Phoenix over OTLP/HTTP, simple span processor (accepted at return, stored later)",
            "batch": "Phoenix over OTLP/HTTP, batch span processor (queued at return)",
        }
        lost: dict[str, str] = {}
        if mlflow is not None:
            before = mlflow.ask("count")
            burst = mlflow.ask(f"burst {BURST}")
            after = mlflow.ask("count")
            stored = after["spans"] - before["spans"]
            lost["mlflow"] = (
                f"{BURST * peer_shape.SPANS_PER_RUN - stored} of {BURST * peer_shape.SPANS_PER_RUN} spans "
                f"lost ({after['traces'] - before['traces']} of {BURST} traces stored, {burst['errors']} "
                f"calls raised) after {burst['seconds']:.1f} s"
            )
        for kind, peer in peers.items():
            before = peer.settled_count(peer.runs * peer_shape.SPANS_PER_RUN)
            handed, failed = peer.exporter.handed, peer.exporter.failed
            took = peer.burst(BURST, counter)
            counter += BURST
            expected = before + BURST * peer_shape.SPANS_PER_RUN
            stored = peer.settled_count(expected) - before
            handed, failed = peer.exporter.handed - handed, peer.exporter.failed - failed
            lost[kind] = (
                f"{BURST * peer_shape.SPANS_PER_RUN - stored} of {BURST * peer_shape.SPANS_PER_RUN} spans "
                f"lost after {took:.1f} s ({BURST * peer_shape.SPANS_PER_RUN - handed} never handed to the "
                f"exporter, {failed} in failed exports; {before} stored before the burst)"
            )
        for kind, values in ratios.items():
            if not values:
                continue
            rows.append(
                Row(
                    "B0",
                    f"{labels[kind]} vs B1's autocommit floor, per run",
                    f"{spread(per_run[kind]).median * 1e3:.1f} ms vs {floor_ms:.1f} ms per run "
                    f"({peer_shape.SPANS_PER_RUN} spans, {peer_shape.EVENTS_PER_RUN} events); "
                    f"burst of {BURST}: {lost[kind]}",
                    spread(values),
                    None,
                )
            )
            log(f"  B0 {kind}: {rows[-1].result}")
    finally:
        for peer in peers.values():
            peer.close()
        if server is not None:
            server.close()
        workdir.cleanup()
        if mlflow is not None:
            mlflow.close()
        conn.close()
    return rows
