"""The ASGI application for chat tests that run daphne subprocesses: the real `config.asgi` application
plus one real extra tool, `slow_probe`, that waits (a stand-in for a slow diagnostic command), so that a
test can kill the process or cancel the run while a tool is RUNNING. Only daphne subprocesses import this
module; the pytest process never registers the tool."""

import asyncio

# isort: off
from config.asgi import application  # first: it sets Django up before the runtime's models are imported
from agent.runtime.tools.registry import register_tool

# isort: on

__all__ = ["application"]


@register_tool(
    name="slow_probe",
    description="Run a slow diagnostic probe on a host and report when it finished.",
    parameters={
        "type": "object",
        "properties": {"seconds": {"type": "number", "minimum": 0, "maximum": 120, "default": 30}},
    },
    timeout=120,
)
async def slow_probe(seconds: float = 30) -> dict:
    await asyncio.sleep(seconds)
    return {"slept": seconds}
