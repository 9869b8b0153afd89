"""B10 (issue 46 *Measure*): an MCP call through the runtime's toolset beside the bare `mcp` client, and a
run's CPU with an MCP tool beside the same run with a native tool.

* **Call overhead.** The same `get-sum` call of `mcp-server-everything` over stdio, N times each, in one
  event loop, alternating: (a) through a bare `mcp.client.Client`; (b) through the runtime's MCP tool as
  a serving process has it (its sessions on the serving loop, `agent.mcp.hub.serve_on`): the schema
  check, the session call, the result's conversion (keyed evidence id, bounded model text) and its
  redaction as the tool boundary does it. Not the recorder's database writes (the run row below has
  them). Ratio of medians; target 1.2×. The same tool called from another loop (a management command's
  hub thread) is measured too and reported in the note.
* **Run CPU.** Full chat runs executed by the real runtime in this process (`execute_run`: lease, router,
  agent step, the tool through the boundary, guards, release, every decision recorded), against the
  unpaced bench provider in its own process (so its CPU is not counted), once with the agent calling
  the MCP tool `ev__get-sum` and once calling the native `lookup_knowledge`: this process's CPU per run
  (`time.process_time`), median of repetitions, and the ratio MCP ÷ native (no target: reported).

Alone: `DEBUG=true .venv/bin/python -m bench.b10_mcp [N]` (the call overhead only); in the table,
`python -m bench --only b10` (needs scripts/setup.sh dev's tools/mcp).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET = 1.2
SERVER = "ev"
TOOL = f"{SERVER}__get-sum"


def _command() -> str:
    from django.conf import settings

    relative = "tools/mcp/node_modules/.bin/mcp-server-everything"
    command = str(Path(settings.BASE_DIR) / relative)
    if not Path(command).exists():
        raise SystemExit(f"B10 needs {relative} (scripts/setup.sh dev installs it)")
    return command


def _entry(command: str) -> dict:
    return {"name": SERVER, "command": command, "args": ["stdio"], "trusted": True, "allow": ["get-sum"]}


@contextlib.contextmanager
def _configured(command: str):
    """`MCP_SERVERS` holding the bench's server only, restored (and the hub closed) afterwards."""
    from django.conf import settings

    from agent.mcp.hub import close_hub

    configured = settings.MCP_SERVERS
    settings.MCP_SERVERS = [_entry(command)]
    try:
        yield
    finally:
        close_hub()
        settings.MCP_SERVERS = configured


async def _ready(hub, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while hub.states[SERVER].status != "ready":
        if time.monotonic() > deadline:
            raise RuntimeError(f"B10: MCP server not ready: {hub.states[SERVER].last_error}")
        await asyncio.sleep(0.05)


async def _tool_calls(spec, n: int) -> list[float]:
    from agent.redaction import Redactor
    from agent.runtime.tools.boundary import ToolBoundary

    redactor = Redactor()
    out = []
    for i in range(n):
        start = time.perf_counter()
        arguments = spec.validate({"a": i, "b": 1})
        result = await spec.func(**arguments)
        ToolBoundary._redact_result(redactor, result)
        redactor.take()
        out.append(time.perf_counter() - start)
    return out


async def _bare_calls(client, n: int) -> list[float]:
    out = []
    for i in range(n):
        start = time.perf_counter()
        await client.call_tool("get-sum", {"a": i, "b": 1})
        out.append(time.perf_counter() - start)
    return out


async def _paired(command: str, *, n: int, reps: int, log) -> dict:
    """Both paths in this loop, the hub served on it as a serving process's is; then the toolset from a
    second loop (the hub on this one) for the note."""
    from mcp.client import Client
    from mcp.client.stdio import StdioServerParameters, stdio_client

    from agent.mcp.hub import aclose_hub, current_hub, serve_on
    from agent.runtime.tools.registry import FLOW_CHAT, default_registry

    serve_on(asyncio.get_running_loop())
    try:
        hub = current_hub()
        await _ready(hub)
        spec = default_registry(flow=FLOW_CHAT).get(TOOL)
        bares, tools, ratios, hops = [], [], [], []
        with open(os.devnull, "w") as errlog:
            params = StdioServerParameters(command=command, args=["stdio"])
            async with Client(stdio_client(params, errlog=errlog), cache=None) as client:
                await client.list_tools()
                await _bare_calls(client, 20)  # warm-up, both
                await _tool_calls(spec, 20)
                for rep in range(reps):
                    bare = statistics.median(await _bare_calls(client, n)) * 1000
                    tool = statistics.median(await _tool_calls(spec, n)) * 1000
                    hop = (
                        statistics.median(await asyncio.to_thread(lambda: asyncio.run(_tool_calls(spec, n))))
                        * 1000
                    )
                    bares.append(bare)
                    tools.append(tool)
                    hops.append(hop)
                    ratios.append(tool / bare)
                    log(
                        f"  B10 rep {rep + 1}: bare {bare:.3f} ms, MCP tool {tool:.3f} ms "
                        f"({tool / bare:.2f}×); from another loop {hop:.3f} ms"
                    )
        return {"bare": bares, "tool": tools, "ratio": ratios, "hop": hops}
    finally:
        await aclose_hub()


def measure(*, n: int, reps: int, log=print) -> list:
    """`reps` repetitions of both paths, `n` calls each, alternating; the table's row (ratio of medians)."""
    from bench.stats import Row, spread

    command = _command()
    with _configured(command):
        m = asyncio.run(_paired(command, n=n, reps=reps, log=log))
    return [
        Row(
            "B10",
            "MCP call through the toolset vs the bare mcp client (stdio, no database)",
            f"{spread(m['tool']).median:.3f} ms vs {spread(m['bare']).median:.3f} ms per call",
            spread(m["ratio"]),
            TARGET,
            note=(
                "sessions on the serving loop; schema check, result conversion, keyed evidence id, "
                f"redaction; from another loop (hub thread): {spread(m['hop']).median:.3f} ms"
            ),
        )
    ]


# -------------------------------------------------------------------------------------------------
# A run's CPU: MCP tool vs native tool
# -------------------------------------------------------------------------------------------------
def _provider(tool: str, arguments: dict) -> tuple[subprocess.Popen, str]:
    """The unpaced bench provider in its own process (no waiting: CPU is what is measured)."""
    from django.conf import settings

    args = [sys.executable, "-m", "bench.provider", "0", "0", "4", tool, json.dumps(arguments)]
    proc = subprocess.Popen(
        args,
        cwd=settings.BASE_DIR,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"},
    )
    line = proc.stdout.readline()
    if not line.startswith("PORT "):
        proc.kill()
        raise RuntimeError(f"B10: the bench provider did not start ({line!r})")
    return proc, f"http://127.0.0.1:{int(line.split()[1])}/v1"


async def _runs(user, n: int) -> list[float]:
    """`n` runs one after the other on this loop (the hub served on it); CPU seconds of each."""
    from agent.mcp.hub import aclose_hub, current_hub, serve_on
    from agent.runtime.events import NullSink
    from agent.runtime.executor import execute_run, prepare_run
    from agent.runtime.llm import aclose_clients

    serve_on(asyncio.get_running_loop())
    try:
        await _ready(current_hub())
        out = []
        for _ in range(n + 1):  # the first warms the SDK client, the index and the session
            run = await asyncio.to_thread(prepare_run, user=user, query="What is the sum the runbook needs?")
            start = time.process_time()
            outcome = await execute_run(run_id=run.run_id, sink=NullSink())
            out.append(time.process_time() - start)
            if outcome.status != "SUCCESS":
                raise RuntimeError(f"B10: a bench run ended {outcome.status}")
        return out[1:]
    finally:
        await aclose_clients()
        await aclose_hub()


def run_cpu(*, runs: int, reps: int, log=print) -> list:
    """CPU per run with the MCP tool vs the native `lookup_knowledge` (see the module docstring)."""
    from django.test.utils import override_settings

    from bench.b1_recording import bench_user
    from bench.b4_loop import load_runbooks
    from bench.provider import BenchProvider
    from bench.stats import Row, spread

    command = _command()
    load_runbooks()
    user = bench_user()
    variants = {
        "mcp": (TOOL, {"a": 2, "b": 3}),
        "native": ("lookup_knowledge", {"query": "mysql replication lag long transaction"}),
    }
    cpu: dict[str, list[float]] = {"mcp": [], "native": []}
    with _configured(command):
        for rep in range(reps):
            for name, (tool, arguments) in variants.items():
                proc, base_url = _provider(tool, arguments)
                try:
                    with override_settings(**BenchProvider().settings(base_url)):
                        per_run = asyncio.run(_runs(user, runs))
                finally:
                    proc.stdin.close()
                    proc.wait(10)
                cpu[name].append(statistics.median(per_run) * 1000)
            log(
                f"  B10 run CPU rep {rep + 1}: MCP tool {cpu['mcp'][-1]:.1f} ms, "
                f"native tool {cpu['native'][-1]:.1f} ms per run"
            )
    ratios = [m / n for m, n in zip(cpu["mcp"], cpu["native"], strict=True)]
    return [
        Row(
            "B10",
            "a chat run's CPU with an MCP tool vs with a native tool (real runtime, recorded)",
            f"{spread(cpu['mcp']).median:.1f} ms vs {spread(cpu['native']).median:.1f} ms per run",
            spread(ratios),
            None,
            note="one tool call per run: ev__get-sum over stdio vs lookup_knowledge (BM25 over the runbooks)",
        )
    ]


def main(n: int = 300) -> None:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    (row,) = measure(n=n, reps=1)
    print(row.result, f"({row.ratio.median:.2f}×)", row.note)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
