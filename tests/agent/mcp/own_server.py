"""A small MCP server of the tests' own (the official `mcp` SDK's `MCPServer`, over stdio), run as a real
subprocess: `python -m tests.agent.mcp.own_server`. It answers, on demand, what the servers nobody here
wrote never do: `fail` an error result (`isError`, a long text with a token in it), `big` a result of
`size` characters, `bad_image` an image whose data is not base64, `invalid` a result that is not valid MCP
(its content replaced on the wire by a block without text), and `grow` adds the tool `added` and
announces it (`notifications/tools/list_changed`: on the listen stream of a 2026-07-28 connection, on
the connection itself of an earlier one).
"""

from __future__ import annotations

from typing import Any

import anyio
import mcp_types as types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage

TOKEN = "ghp_" + "Q8r2Zk4mW9xT3vN7bL1pY6sD0fH5jC8gA2eK"
INVALID_MARK = "this result is replaced on the wire"

server = MCPServer("own")
READ_ONLY = types.ToolAnnotations(read_only_hint=True)


@server.tool(annotations=READ_ONLY)
def fail() -> types.CallToolResult:
    """Answers an error result."""
    text = f"backend refused: token {TOKEN} is not allowed here. " + "details " * 200
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


@server.tool(annotations=READ_ONLY)
def big(size: int) -> str:
    """Answers `size` characters."""
    return "y" * size


@server.tool(annotations=READ_ONLY)
def bad_image() -> types.CallToolResult:
    """Answers an image block whose data is not base64."""
    image = types.ImageContent(type="image", data="not base64 at all!", mime_type="image/png")
    return types.CallToolResult(content=[image])


@server.tool(annotations=READ_ONLY)
def invalid() -> str:
    """Answers a result that is not valid MCP."""
    return INVALID_MARK


def added() -> str:
    """A tool that exists once `grow` was called."""
    return "added"


@server.tool(annotations=READ_ONLY)
async def grow(ctx: Context) -> str:
    """Adds the tool `added` and announces the change."""
    if "added" not in {t.name for t in server._tool_manager.list_tools()}:
        server.add_tool(added, name="added", annotations=READ_ONLY)
    await ctx.notify_tools_changed()  # the 2026-07-28 listen stream
    if ctx.request_context.protocol_version < "2026":
        await ctx.session.send_tool_list_changed()  # earlier protocol versions: on the connection
    return "grown"


class _Rewriting:
    """The stdio write stream, with the answer to `invalid` made invalid MCP on its way out."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    async def send(self, item: SessionMessage) -> None:
        message = item.message
        if isinstance(message, types.JSONRPCResponse) and INVALID_MARK in str(message.result):
            result = {**message.result, "content": [{"type": "text"}]}
            item = SessionMessage(types.JSONRPCResponse(jsonrpc="2.0", id=message.id, result=result))
        await self.stream.send(item)

    async def aclose(self) -> None:
        await self.stream.aclose()

    async def __aenter__(self) -> _Rewriting:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


async def main() -> None:
    lowlevel = server._lowlevel_server
    async with stdio_server() as (read_stream, write_stream):
        await lowlevel.run(read_stream, _Rewriting(write_stream), lowlevel.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
