"""B7 — AI Ops analyses: how many one queue worker sustains, and its own cost outside models and tools.

Analyses are queued as staff would queue them (`agent.aiops.intake`) and executed by the real queue
worker (`agent.runtime.worker.work`: claim under the lease with `SELECT … FOR UPDATE SKIP LOCKED`,
planner, executor with tools, evidence and semantic guards, release, self-evaluation, every decision
recorded durably) against the local fake provider, which takes exactly `call_seconds` (300 ms) per model
call: the planner's plan, the executor's parallel tool calls (`query_metrics` against a real Prometheus
when the Debian binary is installed, and `lookup_knowledge` over the shipped runbooks), its report citing
what the tools returned, and the semantic guard. Four model calls per analysis.

* **Throughput**: analyses per minute one worker completes with concurrency 1 and 2 (wall time from the
  first claim to the last outcome).
* **Overhead**: per analysis, wall time (claim to outcome, concurrency 1) − the model-call time the
  runtime measured itself (planner, executor steps, semantic guard) − the tool time it recorded (the
  longest tool of each parallel step: they overlap); the share of wall time it is. Target as B4: ≤ 3 %.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
import threading
import time
import traceback
from collections import Counter
from pathlib import Path

from django.test.utils import override_settings

from agent.runtime import prompts
from bench.provider import AGENT, BenchProvider
from bench.stats import Row, spread
from diagnosis.evidence import ID_RE
from tests.fakes.openai_server import FakeLLMServer, finish_chunk, text_chunks, tool_call_chunks

EVIDENCE = ID_RE
ALERT = {
    "labels": {"alertname": "PrometheusScrapeSlow", "severity": "warning", "job": "prometheus"},
    "annotations": {"summary": "Prometheus scrapes itself slowly", "description": "scrape duration high"},
}


class AiOpsBenchProvider(BenchProvider):
    """The bench provider, answering the AI Ops agents (recognised by their system prompts) too."""

    metrics: bool = True

    def __call__(self, request):
        if request.model != AGENT:
            return super().__call__(request)
        role = prompts.role_of(request.messages)
        if role == "planner":
            self.calls.append("planner")
            plan = {
                "steps": [
                    {
                        "check": "scrape health of the job",
                        "why": "the alert is about scrapes",
                        "tool": "query_metrics",
                    },
                    {"check": "runbook for slow scrapes", "why": "known causes", "tool": "lookup_knowledge"},
                ]
            }
            body = json.dumps(plan)
            return self._stream([*text_chunks(body, 2), finish_chunk("stop")], prompt=400, completion=60)
        if role != "executor":
            return super().__call__(request)
        messages = request.messages
        if not any(m.get("role") == "tool" for m in messages):
            self.calls.append("executor-tools")
            calls = [
                (
                    f"call_{len(self.calls)}k",
                    "lookup_knowledge",
                    json.dumps({"query": "prometheus scrape slow"}),
                )
            ]
            if self.metrics:
                calls.insert(
                    0,
                    (
                        f"call_{len(self.calls)}m",
                        "query_metrics",
                        json.dumps({"query": 'up{job="prometheus"}'}),
                    ),
                )
            chunks = [*tool_call_chunks(calls), finish_chunk("tool_calls")]
            return self._stream(chunks, prompt=900, completion=60)
        self.calls.append("executor-report")
        tool_text = " ".join(str(m.get("content") or "") for m in messages if m.get("role") == "tool")
        ids = list(dict.fromkeys(EVIDENCE.findall(tool_text)))[:2]
        cite = "".join(f" [{i}]" for i in ids)
        text = (
            f"## Summary\nThe scrape job is up and its runbook names the usual causes.{cite}\n"
            f"## Evidence\n- The target reports up.{cite}\n"
            f"## Likely cause\nA slow target or an overloaded Prometheus.{cite}\n"
            f"## Next steps\n- Check the scrape duration per target.{cite}\nConfidence: medium"
        )
        chunks = [*text_chunks(text, self.pieces), finish_chunk("stop")]
        return self._stream(chunks, prompt=1800, completion=120, interval=self.chunk_interval)


class RoundTrips:
    """Durable commits, connection pings and pool jobs the process paid while open (counted, not timed),
    so that the figure shows what changed independent of the machine's noise. Counted at the MySQL
    backend's cursor and connection, and at the driver cursor the recorder's writes use in production
    (`audit.write.cursor.DriverCursor`; no execute wrapper, so every write takes its usual path): a write
    statement in autocommit mode (the single-statement path, the MariaDB compound transaction) or a
    COMMIT is one commit; `is_usable` is one ping; a job handed to the runtime's pools
    (`agent.runtime.db`) is one job. With `B7_TRACE=1` each commit is also named by the recorder
    method (or runtime function) that paid it, and the jobs' CPU time is split by pool, printed per
    analysis."""

    WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE", "BEGIN NOT ATOMIC")

    def __init__(self) -> None:
        self.commits = 0
        self.pings = 0
        self.jobs = 0
        self.job_wall = self.job_cpu = 0.0
        self.names: Counter[str] = Counter()
        # (commits, pings, pool jobs, their wall and CPU seconds, names) when the last drain ended.
        self.frozen: tuple[int, int, int, float, float, Counter[str]] = (0, 0, 0, 0.0, 0.0, Counter())
        self.trace = bool(os.environ.get("B7_TRACE"))
        self._lock = threading.Lock()

    def reset(self) -> None:
        with self._lock:
            self.commits = self.pings = self.jobs = 0
            self.job_wall = self.job_cpu = 0.0
            self.names.clear()

    def _commit(self) -> None:
        with self._lock:
            self.commits += 1
            if self.trace:
                self.names[_payer()] += 1

    def _ping(self) -> None:
        with self._lock:
            self.pings += 1

    def _job(self, wall: float, cpu: float) -> None:
        with self._lock:
            self.jobs += 1
            self.job_wall += wall
            self.job_cpu += cpu
            if self.trace:
                pool = threading.current_thread().name.split("_")[0]
                self.names[f"{pool} CPU ms"] += cpu * 1e3

    @contextlib.contextmanager
    def installed(self):
        from django.db.backends.mysql import base

        from agent.runtime import db as runtime_db
        from audit.write import cursor

        execute, is_usable = base.CursorWrapper.execute, base.DatabaseWrapper.is_usable
        driver_execute = cursor.DriverCursor.execute
        commit = base.DatabaseWrapper._commit
        job = runtime_db._job
        counter = self

        def counted_job(fn, args, kwargs):
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return job(fn, args, kwargs)
            finally:
                counter._job(time.perf_counter() - wall, time.thread_time() - cpu)

        def count(query, autocommit: bool) -> None:
            # The recorder's compound writes may arrive bound, as bytes (`audit.write.cursor.bind_params`).
            head = (
                (query[:64].decode(errors="replace") if isinstance(query, bytes) else query)
                .lstrip()[:16]
                .upper()
            )
            if (autocommit and head.startswith(counter.WRITES)) or head.startswith("COMMIT"):
                counter._commit()

        def counted_execute(cursor, query, args=None):
            count(query, cursor.cursor.connection.get_autocommit())
            return execute(cursor, query, args)

        def counted_driver_execute(cursor, sql, params=None):
            count(sql, cursor._raw.get_autocommit())
            return driver_execute(cursor, sql, params)

        def counted_is_usable(conn):
            counter._ping()
            return is_usable(conn)

        def counted_commit(conn):
            if conn.connection is not None:
                counter._commit()
            return commit(conn)

        base.CursorWrapper.execute = counted_execute
        cursor.DriverCursor.execute = counted_driver_execute
        base.DatabaseWrapper.is_usable = counted_is_usable
        base.DatabaseWrapper._commit = counted_commit
        runtime_db._job = counted_job
        try:
            yield self
        finally:
            runtime_db._job = job
            base.CursorWrapper.execute = execute
            cursor.DriverCursor.execute = driver_execute
            base.DatabaseWrapper.is_usable = is_usable
            base.DatabaseWrapper._commit = commit


def _payer() -> str:
    """The outermost recorder method and the one it called (else the innermost runtime or service
    function) on the stack."""
    found, recorder = "", []
    for frame in traceback.extract_stack():
        path = frame.filename.replace(os.sep, "/")
        if "/audit/write/" in path:
            recorder.append(frame.name)
        elif not recorder and "/diagnosis/" in path and not path.endswith("runtime/db.py"):
            found = f"{Path(path).stem}.{frame.name}"
    if recorder:
        return "/".join(recorder[:2])
    return found or "?"


def model_and_tool_seconds(run_id: str) -> tuple[float, float]:
    """The run's model-call time as the runtime measured it (agent steps of every agent and the semantic
    guard), and its tool time (per declaring step, the longest of its tools: parallel calls overlap)."""
    from audit.models import AgentStep, EventType, ToolInvocation, TraceEvent

    model_ms = sum(
        d or 0 for d in AgentStep.objects.filter(run_id=run_id).values_list("duration_ms", flat=True)
    )
    for details in TraceEvent.objects.filter(
        run_id=run_id, event_type__in=[EventType.ROUTING_ATTEMPT, EventType.SEMANTIC_GUARD_DECISION]
    ).values_list("details", flat=True):
        model_ms += details.get("durationMs") or 0
    per_step: dict[tuple[str, int | None], int] = {}
    for agent, step, ms in ToolInvocation.objects.filter(run_id=run_id).values_list(
        "agent_name", "step_index", "duration_ms"
    ):
        per_step[(agent, step)] = max(per_step.get((agent, step), 0), ms or 0)
    return model_ms / 1000, sum(per_step.values()) / 1000


async def drain(
    user, n: int, *, concurrency: int, counts: RoundTrips | None = None
) -> tuple[float, list[str]]:
    """Queue `n` analyses, then run one worker until the queue is empty; (wall seconds, run ids). Runs in
    the caller's event loop, which stays up across repetitions as a server process's does. `counts` is
    reset when the worker starts and holds what it paid when it is done."""
    from agent.aiops import intake
    from agent.runtime import supervisor
    from agent.runtime.worker import work

    ids = [
        (await asyncio.to_thread(intake.start_staff_analysis, user=user, alert=ALERT)).run_id
        for _ in range(n)
    ]
    if counts is not None:
        counts.reset()
    start = time.perf_counter()
    launched = await work(
        launch=supervisor.launch, concurrency=concurrency, poll_interval=0.02, until_idle=True
    )
    wall = time.perf_counter() - start
    if counts is not None:
        counts.frozen = (
            counts.commits,
            counts.pings,
            counts.jobs,
            counts.job_wall,
            counts.job_cpu,
            Counter(counts.names),
        )
    if launched != n:
        raise RuntimeError(f"worker launched {launched} of {n} analyses")
    return wall, ids


def check(ids: list[str]) -> set[str]:
    from diagnosis.models import DiagnosisRun

    runs = list(DiagnosisRun.objects.filter(run_id__in=ids))
    bad = [(r.run_id, r.status) for r in runs if r.status != "SUCCESS"]
    if bad or len(runs) != len(ids):
        raise RuntimeError(f"bench analyses did not succeed: {bad}")
    return {r.release_decision or "" for r in runs}


@contextlib.contextmanager
def monitoring():
    """A real Prometheus (and Alertmanager) when the Debian binaries are installed, else None."""
    from tests.agent.aiops import servers

    if servers.missing_binaries():
        yield None
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "am").mkdir()
        (root / "prom").mkdir()
        with (
            servers.AlertmanagerServer(root / "am") as am,
            servers.PrometheusServer(root / "prom", alertmanager_url=am.url) as prom,
        ):
            prom.wait_for_samples()
            yield prom


def run_all(*, runs_per_rep: int, reps: int, call_seconds: float = 0.3, log=print) -> list[Row]:
    from bench.b1_recording import bench_user
    from bench.b4_loop import load_runbooks

    load_runbooks()
    user = bench_user()
    provider = AiOpsBenchProvider(call_seconds=call_seconds)
    rows: list[Row] = []
    with monitoring() as prom, FakeLLMServer(handler=provider) as server:
        provider.metrics = prom is not None
        extra = {"PROMETHEUS_URL": prom.url} if prom is not None else {}
        # The process's other periodic duties (sweep, checkpoint, purge) stay off, as in B4, so that
        # what is measured is the worker and the analyses.
        quiet = {
            "AIOPS_WORKER_CONCURRENCY": 0,
            "RUN_SWEEP_INTERVAL_SECONDS": 0,
            "AUDIT_CHECKPOINT_INTERVAL_SECONDS": 0,
            "AUDIT_PURGE_INTERVAL_SECONDS": 0,
            "OTEL_EXPORT_INTERVAL_SECONDS": 0,
        }
        with override_settings(**provider.settings(server.base_url), **extra, **quiet):
            shares, overheads, per_minute = [], [], {1: [], 2: []}
            commits, pings = [], []
            counts = RoundTrips()
            decisions: set[str] = set()

            async def measure() -> None:
                from agent.runtime import supervisor
                from agent.runtime.llm import aclose_clients

                supervisor.ensure_background(serve_queue=False)
                try:
                    await drain(user, 1, concurrency=1)  # warm-up: index, SDK client, connections
                    supervisor.settle()  # as `run_worker` after its warm-up
                    for rep in range(reps):
                        wall, ids = await drain(user, runs_per_rep, concurrency=1, counts=counts)
                        n_commits, n_pings, n_jobs, job_wall, job_cpu, names = counts.frozen
                        commits.append(n_commits / runs_per_rep)
                        pings.append(n_pings / runs_per_rep)
                        jobs = n_jobs / runs_per_rep
                        if counts.trace:
                            for name, k in sorted(names.items(), key=lambda kv: -kv[1]):
                                log(f"    {k / runs_per_rep:6.1f} per analysis: {name}")
                        decisions.update(await asyncio.to_thread(check, ids))
                        per_minute[1].append(runs_per_rep / wall * 60)
                        model = tools = 0.0
                        for run_id in ids:
                            m, t = await asyncio.to_thread(model_and_tool_seconds, run_id)
                            model, tools = model + m, tools + t
                        outside = wall - model - tools
                        shares.append(outside / wall * 100)
                        overheads.append(outside / runs_per_rep * 1e3)
                        wall2, ids2 = await drain(user, runs_per_rep * 2, concurrency=2)
                        decisions.update(await asyncio.to_thread(check, ids2))
                        per_minute[2].append(runs_per_rep * 2 / wall2 * 60)
                        log(
                            f"  B7 rep {rep + 1}/{reps}: {wall / runs_per_rep * 1e3:.0f} ms per analysis, "
                            f"model {model / runs_per_rep * 1e3:.0f} ms, "
                            f"tools {tools / runs_per_rep * 1e3:.1f} ms, "
                            f"outside {overheads[-1]:.1f} ms ({shares[-1]:.2f} %), "
                            f"{commits[-1]:.1f} commits, {pings[-1]:.1f} pings, "
                            f"{jobs:.1f} pool jobs ({job_wall / runs_per_rep * 1e3:.1f} ms, "
                            f"{job_cpu / runs_per_rep * 1e3:.1f} ms CPU) per analysis; "
                            f"{per_minute[1][-1]:.0f}/min at concurrency 1, {per_minute[2][-1]:.0f}/min at 2"
                        )
                finally:
                    await supervisor.stop_background()
                    await aclose_clients()

            with counts.installed():
                asyncio.run(measure())
        if server.errors:
            raise RuntimeError(f"fake provider errors: {server.errors}")
    tools_note = (
        "query_metrics on a real Prometheus + lookup_knowledge"
        if provider.metrics
        else "lookup_knowledge only (no Prometheus binary)"
    )
    for concurrency in (1, 2):
        rows.append(
            Row(
                "B7",
                f"analyses per minute, one worker, concurrency {concurrency} "
                f"({call_seconds * 1e3:.0f} ms per model call)",
                f"{spread(per_minute[concurrency]).median:.0f} per minute; {tools_note}",
                spread(per_minute[concurrency]),
                None,
                ratio_unit="/min",
            )
        )
    rows.append(
        Row(
            "B7",
            f"worker overhead outside model and tool time "
            f"({call_seconds * 1e3:.0f} ms per model call, 4 calls)",
            f"{spread(overheads).median:.1f} ms per analysis; {spread(commits).median:.1f} commits and "
            f"{spread(pings).median:.1f} pings per analysis; release {', '.join(sorted(decisions))}",
            spread(shares),
            3.0,
            ratio_unit=" %",
        )
    )
    return rows
