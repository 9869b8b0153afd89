"""B10 (partial, issue 46 *Measure*): the MCP toolset's overhead per call beside the bare `mcp` client.

The same `get-sum` call of `mcp-server-everything` over stdio, N times each: (a) through a bare
`mcp.client.Client` in the caller's loop; (b) through the runtime's MCP tool — the hub thread hop, the
schema check, the result conversion and the result's redaction as the boundary does it. It does not
include the recorder's database writes nor the canonical store (a full boundary run is not measured
here). Prints median and p90 per call and the ratio of medians. Run:
`DEBUG=true .venv/bin/python -m bench.b10_mcp [N]` (needs scripts/setup.sh dev's tools/mcp).
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


def main(n: int = 300) -> None:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    from django.conf import settings

    from agent.mcp.hub import close_hub, current_hub

    relative = "tools/mcp/node_modules/.bin/mcp-server-everything"
    command = str(Path(settings.BASE_DIR) / relative)
    if not Path(command).exists():
        raise SystemExit(f"B10 needs {relative} (scripts/setup.sh dev installs it)")
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
