"""B10 (partial, issue 46 *Measure*): the MCP toolset's overhead per call beside the bare `mcp` client.

The same `get-sum` call of `mcp-server-everything` over stdio, N times each: (a) through a bare
`mcp.client.Client` in the caller's loop; (b) through the runtime's MCP tool — the hub thread hop, the
schema check, the result conversion and the result's redaction as the boundary does it. It does not
include the recorder's database writes nor the canonical store (a full boundary run is not measured
here). Alone it prints median and p90 per call and the ratio of medians
(`DEBUG=true .venv/bin/python -m bench.b10_mcp [N]`); in the table, `python -m bench --only b10` (needs
scripts/setup.sh dev's tools/mcp; target 1.2×, issue 46).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from pathlib import Path


def _pcts(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) * 1000, ordered[int(len(ordered) * 0.9)] * 1000


async def _bare(command: str, n: int) -> list[float]:
    from mcp.client import Client
    from mcp.client.stdio import StdioServerParameters, stdio_client

    with open(os.devnull, "w") as errlog:
        async with Client(
            stdio_client(StdioServerParameters(command=command, args=["stdio"]), errlog=errlog), cache=None
        ) as client:
            await client.list_tools()
            out = []
            for i in range(n):
                start = time.perf_counter()
                await client.call_tool("get-sum", {"a": i, "b": 1})
                out.append(time.perf_counter() - start)
            return out


async def _toolset(n: int) -> list[float]:
    from agent.redaction import Redactor
    from agent.runtime.tools.boundary import ToolBoundary
    from agent.runtime.tools.registry import FLOW_CHAT, default_registry

    spec = default_registry(flow=FLOW_CHAT).get("ev__get-sum")
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


TARGET = 1.2


def _command() -> str:
    from django.conf import settings

    relative = "tools/mcp/node_modules/.bin/mcp-server-everything"
    command = str(Path(settings.BASE_DIR) / relative)
    if not Path(command).exists():
        raise SystemExit(f"B10 needs {relative} (scripts/setup.sh dev installs it)")
    return command


def measure(*, n: int, reps: int, log=print) -> list:
    """`reps` repetitions of both paths, `n` calls each, alternating; the table's row (ratio of medians)."""
    from django.conf import settings

    from agent.mcp.hub import close_hub, current_hub
    from bench.stats import Row, spread

    command = _command()
    configured = settings.MCP_SERVERS
    settings.MCP_SERVERS = [
        {"name": "ev", "command": command, "args": ["stdio"], "trusted": True, "allow": ["get-sum"]}
    ]
    bares, tools, ratios = [], [], []
    try:
        hub = current_hub()
        assert hub is not None and hub.wait_settled(30)
        asyncio.run(_toolset(20))  # warm-up
        for rep in range(reps):
            bare = statistics.median(asyncio.run(_bare(command, n))) * 1000
            tool = statistics.median(asyncio.run(_toolset(n))) * 1000
            bares.append(bare)
            tools.append(tool)
            ratios.append(tool / bare)
            log(f"  B10 rep {rep + 1}: bare {bare:.3f} ms, MCP tool {tool:.3f} ms ({tool / bare:.2f}×)")
    finally:
        close_hub()
        settings.MCP_SERVERS = configured
    return [
        Row(
            "B10",
            "MCP call through the toolset vs the bare mcp client (stdio, no database)",
            f"{spread(tools).median:.3f} ms vs {spread(bares).median:.3f} ms per call",
            spread(ratios),
            TARGET,
            note="hub thread hop, schema check, result conversion, keyed evidence id, redaction",
        )
    ]


def main(n: int = 300) -> None:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    from django.conf import settings

    from agent.mcp.hub import close_hub, current_hub

    command = _command()
    settings.MCP_SERVERS = [
        {"name": "ev", "command": command, "args": ["stdio"], "trusted": True, "allow": ["get-sum"]}
    ]
    hub = current_hub()
    assert hub is not None and hub.wait_settled(30)
    try:
        asyncio.run(_toolset(20))  # warm-up
        bare = asyncio.run(_bare(command, n))
        tool = asyncio.run(_toolset(n))
    finally:
        close_hub()
    (bm, b90), (tm, t90) = _pcts(bare), _pcts(tool)
    print(f"bare mcp client : median {bm:.3f} ms  p90 {b90:.3f} ms  (n={n})")
    print(f"MCP tool (no db): median {tm:.3f} ms  p90 {t90:.3f} ms  (n={n})")
    print(f"ratio of medians: {tm / bm:.2f}x")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
