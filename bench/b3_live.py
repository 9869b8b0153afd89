"""B3 — live runs per process: N concurrent WebSocket chats against one daphne process.

Three processes on this machine: **one daphne** (`config.asgi:application`, production settings, on the
bench database, in-memory channel layer as for a single process), **the fake provider**
(`python -m bench.provider`, streaming every response a chunk every 20 ms; it writes the wall-clock
time at which it sends a chunk into the chunk's text) and **this process** with N WebSocket clients
(the `websockets` library, each an authenticated user with a DRF token in the handshake header). All
clients connect, then each sends one `chat` frame at the same moment and reads frames until its
`outcome`.

Two release policies, each on its own daphne (`CHAT_RELEASE`):

* **verified** (the default): no answer text before the release. *Release latency* = time the client
  received the `outcome` − time the provider sent the last chunk of the answer it releases (the latest
  stamp in the released content): evidence guard, the semantic guard's model call, the release and the
  record, the channel layer, daphne and the client. The server's own figure, recorded per run as
  `release_latency_ms` (answer's last token → release), is read back beside it.
* **draft**: *extra delay per chunk* = time the client received a `draft` frame − time the provider sent
  the chunk it carries (both clocks are this machine's): SDK parsing, the runtime, the channel layer,
  daphne and the client's own scheduling.

*Records lost*: after the runs ended, for every run the stored events, steps and tools are compared with
the counts the recorder expected, plus write failures and the hash chain.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings

from bench.stats import Row, percentile, spread

ROOT = Path(settings.BASE_DIR)
STAMP = re.compile(r"<(\d{16,20})>")


class Proc:
    """A child process whose first matching output line we wait for."""

    def __init__(self, args: list[str], env: dict[str, str], pattern: str, log: Path) -> None:
        self.log_path = log
        self.log = open(log, "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            args, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=self.log, stderr=subprocess.STDOUT
        )
        self.pattern = re.compile(pattern.encode())

    def wait_for(self, timeout: float = 60.0) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.pattern.search(self.log_path.read_bytes())
            if found:
                return found
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.log_path.name}: did not start:\n{self.log_path.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


def _child_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "LLM_"))}
    env.update({"PYTHONUNBUFFERED": "1", **extra})
    return env


def start_provider(chunk_interval: float, pieces: int, logs: Path) -> tuple[Proc, int]:
    proc = Proc(
        [sys.executable, "-m", "bench.provider", str(chunk_interval), str(chunk_interval), str(pieces)],
        _child_env({}),
        r"PORT (\d+)",
        logs / "bench-provider.log",
    )
    return proc, int(proc.wait_for().group(1))


def start_daphne(provider_port: int, logs: Path, extra: dict[str, str]) -> tuple[Proc, int]:
    from bench.provider import BenchProvider

    env = _child_env(
        {
            **BenchProvider().env(f"http://127.0.0.1:{provider_port}/v1"),
            "CHAT_MAX_ACTIVE_RUNS_PER_USER": "3",
            "RUN_SWEEP_INTERVAL_SECONDS": "0",
            # daphne announces its port at INFO.
            "LOG_LEVEL": "INFO",
            **extra,
        }
    )
    proc = Proc(
        [
            str(Path(sys.executable).with_name("daphne")),
            "-b",
            "127.0.0.1",
            "-p",
            "0",
            "config.asgi:application",
        ],
        env,
        r"Listening on TCP address 127\.0\.0\.1:(\d+)",
        logs / "bench-daphne.log",
    )
    return proc, int(proc.wait_for().group(1))


def users_with_tokens(n: int) -> list[str]:
    """`n` chat users (bench-chat-0 …), each issued a fresh API token for this run (tokens are stored
    hashed, so earlier ones cannot be read back); returns the tokens."""
    from django.contrib.auth import get_user_model

    from access.services import issue_token

    model = get_user_model()
    existing = set(
        model.objects.filter(username__startswith="bench-chat-").values_list("username", flat=True)
    )
    model.objects.bulk_create(
        [model(username=f"bench-chat-{i}") for i in range(n) if f"bench-chat-{i}" not in existing]
    )
    users = list(model.objects.filter(username__in=[f"bench-chat-{i}" for i in range(n)]).order_by("id"))
    return [issue_token(user=u, actor="bench", ttl_hours=2, name="bench").plaintext for u in users]


async def _chat(url: str, token: str, start: asyncio.Event, delays: list[float], out: dict) -> None:
    import websockets

    async with websockets.connect(
        url, additional_headers={"Authorization": f"Token {token}"}, max_size=2**20, open_timeout=60
    ) as ws:
        out["connected"] = True
        await start.wait()
        await ws.send(
            json.dumps({"type": "chat", "query": "Why is MySQL replication lagging on the replica?"})
        )
        while True:
            message = await asyncio.wait_for(ws.recv(), timeout=120)
            now = time.time_ns()
            frame = json.loads(message)
            kind = frame.get("type")
            if kind == "run":
                out["run_id"] = frame["runId"]
            elif kind == "draft":
                for sent in STAMP.findall(frame.get("text", "")):
                    delays.append((now - int(sent)) / 1e6)
            elif kind == "error":
                out["error"] = frame.get("code")
            elif kind == "outcome":
                out["status"] = frame.get("status")
                out["release"] = frame.get("releaseDecision")
                stamps = [int(s) for s in STAMP.findall(frame.get("content") or "")]
                if stamps:
                    out["release_ms"] = (now - max(stamps)) / 1e6
                return


async def _level(url: str, tokens: list[str]) -> tuple[list[float], list[dict], float]:
    start = asyncio.Event()
    delays: list[float] = []
    outs: list[dict] = [{} for _ in tokens]
    tasks = [asyncio.create_task(_chat(url, t, start, delays, o)) for t, o in zip(tokens, outs, strict=True)]
    deadline = time.monotonic() + 60
    while sum(1 for o in outs if o.get("connected")) < len(tokens):
        if time.monotonic() > deadline or any(t.done() for t in tasks):
            break
        await asyncio.sleep(0.05)
    began = time.perf_counter()
    start.set()
    await asyncio.gather(*tasks)
    return delays, outs, time.perf_counter() - began


def lost_records(run_ids: list[str]) -> tuple[int, int]:
    """(runs whose stored audit differs from what was expected, records missing in total)."""
    from django.db.models import Count

    from audit.integrity import verify_chain
    from audit.models import AgentStep, ToolInvocation, TraceEvent
    from diagnosis.models import DiagnosisRun

    runs = {r.run_id: r for r in DiagnosisRun.objects.filter(run_id__in=run_ids)}
    counts = {}
    for model, key in ((TraceEvent, "events"), (AgentStep, "steps"), (ToolInvocation, "tools")):
        for row in model.objects.filter(run_id__in=run_ids).values("run_id").annotate(n=Count("id")):
            counts[(row["run_id"], key)] = row["n"]
    bad, missing = 0, 0
    for run_id in run_ids:
        run = runs.get(run_id)
        if run is None:
            bad += 1
            continue
        gap = 0
        for key, expected in (
            ("events", run.expected_events),
            ("steps", run.expected_steps),
            ("tools", run.expected_tools),
        ):
            gap += max(0, expected - counts.get((run_id, key), 0))
        chain_ok = verify_chain(TraceEvent.objects.filter(run_id=run_id).order_by("sequence_no")).valid
        if gap or run.audit_write_failures or not chain_ok or run.status != "SUCCESS":
            bad += 1
        missing += gap + run.audit_write_failures
    return bad, missing


def recorded_release_ms(run_ids: list[str]) -> list[float]:
    """The runs' recorded `release_latency_ms` (answer's last token → release, server side)."""
    from diagnosis.models import DiagnosisRun

    return [
        float(v)
        for v in DiagnosisRun.objects.filter(
            run_id__in=run_ids, release_latency_ms__isnull=False
        ).values_list("release_latency_ms", flat=True)
    ]


def release_latency(
    *, levels: tuple[int, ...], chunk_interval: float = 0.02, pieces: int = 20, log=print
) -> tuple[list[Row], dict]:
    """Verified release at each level of concurrent chats: what waiting for the guards costs."""
    from bench.b4_loop import load_runbooks

    logs = ROOT / "test-artifacts"
    logs.mkdir(exist_ok=True)
    load_runbooks()
    tokens = users_with_tokens(max(levels))
    provider, pport = start_provider(chunk_interval, pieces, logs)
    daphne = None
    rows: list[Row] = []
    evidence: dict = {}
    try:
        daphne, dport = start_daphne(pport, logs, {"CHAT_RELEASE": "verified"})
        url = f"ws://127.0.0.1:{dport}/ws/chat/"
        asyncio.run(_level(url, tokens[:2]))  # warm-up
        for n in levels:
            delays, outs, wall = asyncio.run(_level(url, tokens[:n]))
            run_ids = [o["run_id"] for o in outs if "run_id" in o]
            client = [o["release_ms"] for o in outs if "release_ms" in o]
            server = recorded_release_ms(run_ids)
            bad, missing = lost_records(run_ids)
            finished = sum(1 for o in outs if o.get("status") == "SUCCESS")
            e = {
                "chats": n,
                "succeeded": finished,
                "drafts": len(delays),
                "client_p50": percentile(client, 50),
                "client_p99": percentile(client, 99),
                "server_p50": percentile(server, 50),
                "server_p99": percentile(server, 99),
                "wall": wall,
                "bad_runs": bad,
                "missing": missing,
            }
            evidence[n] = e
            log(
                f"  B3 verified {n} chats: {finished}/{n} succeeded in {wall:.1f} s; release latency at the "
                f"client p50 {e['client_p50']:.0f} ms p99 {e['client_p99']:.0f} ms (recorded p50 "
                f"{e['server_p50']:.0f} ms p99 {e['server_p99']:.0f} ms); draft frames {len(delays)}"
            )
            rows.append(
                Row(
                    "B3",
                    f"{n} concurrent chats, verified release: answer's last token → outcome at the client",
                    f"p50 {e['client_p50']:.0f} ms, p99 {e['client_p99']:.0f} ms (recorded per run: p50 "
                    f"{e['server_p50']:.0f} ms, p99 {e['server_p99']:.0f} ms); {finished}/{n} SUCCESS, "
                    f"{len(delays)} draft frames",
                    spread([e["client_p99"]]),
                    None,
                    ratio_unit=" ms",
                    met_override=None if not delays and finished == n else False,
                )
            )
    finally:
        if daphne is not None:
            daphne.stop()
        provider.stop()
    return rows, evidence


def live_runs(
    *,
    levels: tuple[int, ...],
    context_levels: tuple[int, ...] = (5,),
    chunk_interval: float = 0.02,
    pieces: int = 20,
    extra_env=None,
    log=print,
) -> tuple[list[Row], dict]:
    """Draft release (drafts stream): the target levels give table rows; `context_levels` only appear
    in the per-level evidence."""
    from bench.b4_loop import load_runbooks

    logs = ROOT / "test-artifacts"
    logs.mkdir(exist_ok=True)
    load_runbooks()
    tokens = users_with_tokens(max((*levels, *context_levels)))
    provider, pport = start_provider(chunk_interval, pieces, logs)
    daphne = None
    rows: list[Row] = []
    evidence: dict = {}
    try:
        daphne, dport = start_daphne(pport, logs, {"CHAT_RELEASE": "draft", **(extra_env or {})})
        url = f"ws://127.0.0.1:{dport}/ws/chat/"
        asyncio.run(_level(url, tokens[:2]))  # warm-up: connections, knowledge index, SDK client
        for n in (*context_levels, *levels):
            delays, outs, wall = asyncio.run(_level(url, tokens[:n]))
            run_ids = [o["run_id"] for o in outs if "run_id" in o]
            finished = sum(1 for o in outs if o.get("status") == "SUCCESS")
            bad, missing = lost_records(run_ids)
            p50, p99 = percentile(delays, 50), percentile(delays, 99)
            evidence[n] = {
                "chats": n,
                "runs": len(run_ids),
                "succeeded": finished,
                "deltas": len(delays),
                "p50": p50,
                "p99": p99,
                "max": max(delays) if delays else float("nan"),
                "wall": wall,
                "bad_runs": bad,
                "missing": missing,
                "errors": sorted({o["error"] for o in outs if o.get("error")}),
            }
            log(
                f"  B3 draft {n} chats: {finished}/{n} succeeded in {wall:.1f} s, "
                f"{len(delays)} draft chunks, extra delay p50 {p50:.1f} ms p99 {p99:.1f} ms, "
                f"runs with lost records {bad}"
            )
            if n not in levels:
                continue
            rows.append(
                Row(
                    "B3",
                    f"{n} concurrent WebSocket chats, one daphne, draft release: extra delay per chunk p99",
                    f"p50 {p50:.1f} ms, p99 {p99:.1f} ms over {len(delays)} chunks; "
                    f"{finished}/{n} runs SUCCESS in {wall:.1f} s",
                    spread([p99]),
                    5.0,
                    ratio_unit=" ms",
                )
            )
            rows.append(
                Row(
                    "B3",
                    f"{n} concurrent WebSocket chats: records lost",
                    f"{missing} records missing, {bad} of {len(run_ids)} runs incomplete",
                    spread([float(missing)]),
                    0.0,
                    ratio_unit="",
                    met_override=missing == 0 and bad == 0 and len(run_ids) == n,
                )
            )
    finally:
        if daphne is not None:
            daphne.stop()
        provider.stop()
    return rows, evidence
