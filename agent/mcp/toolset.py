"""The configured MCP servers' tools as `ToolSpec`s of a flow, and an MCP result as a `ToolResult`.

`mcp_tools(flow)` gives the specs of every discovered tool a server serving `flow` allows, named
`<server>__<tool>`, bounded (name, description, schema size, tools per server) and checked with the
server's own JSON schema; and `{name: why}` of what is left out (a server not connected: `mcp:<server>`).
A spec's `available` says why its server cannot run it now; `requires_approval` follows the server's
approval policy. `to_result` keeps the full result (images and blobs as size and digest) under the
citable id `mcp:<server>/<hex>`; the model sees at most the server's `outputChars`. Details: docs/mcp.md.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from typing import Any

import jsonschema
import mcp_types as types
from django.utils.crypto import salted_hmac

from agent.mcp.config import ServerConfig
from agent.mcp.hub import DiscoveredTool, Hub, McpCallError, current_hub
from agent.runtime.tools.registry import EvidenceRecord, ToolArgumentsError, ToolResult, ToolSpec
from audit.payloads import canonical_json, clip
from diagnosis.evidence import MCP_RESULT

SEPARATOR = "__"
EVIDENCE_SALT = "diagnosis.mcp.evidence-id"
NAME_CHARS = 64  # what OpenAI-compatible providers accept as a function name
DESCRIPTION_CHARS = 2000
SCHEMA_BYTES = 16 * 1024
TOOLS_PER_SERVER = 64
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


class McpToolError(McpCallError):
    """The tool answered with `isError`: its text, bounded, is the error the model reads."""


class McpOversized(McpCallError):
    pass


class McpMalformed(McpCallError):
    """Content valid in form that cannot be what it claims (binary data that is not base64)."""


def tool_name(server: str, tool: str) -> str:
    return f"{server}{SEPARATOR}{_UNSAFE.sub('_', tool)}"


def origin_of(name: str) -> tuple[str, str] | None:
    """`(server, tool part)` of an MCP tool's name, or None for a native tool."""
    server, sep, rest = name.partition(SEPARATOR)
    return (server, rest) if sep else None


def _decoded(data: str, what: str) -> bytes:
    try:
        return base64.b64decode("".join(data.split()), validate=True)  # line breaks allowed, nothing else
    except (binascii.Error, ValueError):
        raise McpMalformed(f"the result holds malformed content: {what} data that is not base64") from None


def _block(block: Any) -> dict[str, Any]:
    """One content block as stored: text as is; binary data as its type, size and digest only."""
    if isinstance(block, types.TextContent):
        return {"type": "text", "text": block.text}
    if isinstance(block, (types.ImageContent, types.AudioContent)):
        raw = _decoded(block.data, f"{block.type} block")
        digest = hashlib.sha256(raw).hexdigest()
        return {"type": block.type, "mimeType": block.mime_type, "bytes": len(raw), "sha256": digest}
    if isinstance(block, types.EmbeddedResource):
        res = block.resource
        if isinstance(res, types.TextResourceContents):
            return {"type": "resource", "uri": str(res.uri), "text": res.text}
        size = len(_decoded(res.blob, "a resource blob"))
        return {"type": "resource", "uri": str(res.uri), "bytes": size}
    if isinstance(block, types.ResourceLink):
        return {"type": "resource_link", "uri": str(block.uri), "name": block.name}
    raise McpMalformed(f"the result holds malformed content: a {type(block).__name__} block")


def _text_of(blocks: list[dict[str, Any]], structured: Any) -> str:
    parts = [b["text"] for b in blocks if "text" in b]
    parts += [
        f"[{b['type']} {b.get('mimeType') or b.get('uri')}: {b.get('bytes')} bytes]"
        for b in blocks
        if "bytes" in b
    ]
    parts += [f"[resource link {b['uri']}]" for b in blocks if b["type"] == "resource_link"]
    if not parts and structured is not None:
        parts.append(canonical_json(structured))
    return "\n".join(parts)


def to_result(config: ServerConfig, tool: str, result: types.CallToolResult) -> ToolResult:
    """The call's `ToolResult` (see the module docstring); an error result or an oversized one raises."""
    blocks = [_block(b) for b in result.content]
    text = _text_of(blocks, result.structured_content)
    if result.is_error:
        raise McpToolError(clip(f"the tool answered an error: {text}", 280))
    data: dict[str, Any] = {"server": config.name, "tool": tool, "content": blocks}
    if result.structured_content is not None:
        data["structuredContent"] = result.structured_content
    stored = canonical_json(data)
    size = len(stored.encode("utf-8"))
    if size > config.max_result_bytes:
        raise McpOversized(f"the result has {size} bytes, more than this server's {config.max_result_bytes}")
    # The id is public (cited, stored) and the result may hold a secret: its digest is keyed (Django's
    # salted HMAC under SECRET_KEY, set wherever the service runs), so a reader of the stored, redacted
    # result cannot test guesses against it.
    digest = salted_hmac(EVIDENCE_SALT, stored, algorithm="sha256").hexdigest()
    evidence_id = MCP_RESULT.format(server=config.name, digest=digest[:16])
    shown = (
        text
        if len(text) <= config.output_chars
        else (text[: config.output_chars] + f"\n[cut: {config.output_chars} of {len(text)} characters shown]")
    )
    payload = {"title": f"{config.name}/{tool}", "heading": "MCP tool result", "text": shown}
    model = f"Result of `{tool}` from MCP server {config.name}; cite it as [{evidence_id}].\n{shown}"
    return ToolResult(data=data, evidence=[EvidenceRecord(evidence_id, payload)], model_content=model)


def _checker(schema: dict[str, Any]):
    validator = jsonschema.Draft202012Validator(schema)

    def check(arguments: dict[str, Any]) -> None:
        error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "arguments"
            raise ToolArgumentsError(clip(f"{where}: {error.message}", 200))

    return check


def _spec(hub: Hub, config: ServerConfig, tool: DiscoveredTool) -> ToolSpec | str:
    """The tool's spec, or why it is left out."""
    name = tool_name(config.name, tool.name)
    if len(name) > NAME_CHARS:
        return f"TooLarge: the name is longer than {NAME_CHARS} characters"
    schema = tool.input_schema
    if schema.get("type") != "object" or len(canonical_json(schema).encode()) > SCHEMA_BYTES:
        return f"BadSchema: the input schema is not an object of at most {SCHEMA_BYTES} bytes"
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.exceptions.SchemaError:
        return "BadSchema: the input schema is not valid JSON Schema"
    needs_approval = config.needs_approval(tool.name, tool.read_only_hint)

    async def call(**arguments: Any) -> ToolResult:
        return to_result(config, tool.name, await hub.call(config.name, tool.name, arguments))

    return ToolSpec(
        name=name,
        description=clip(tool.description, DESCRIPTION_CHARS) or f"{tool.name} (MCP server {config.name})",
        parameters=schema,
        func=call,
        timeout=config.timeout + 5,  # the hub's own deadline ends the call first (McpTimeout)
        is_async=True,
        flows=config.flows,
        requires_approval=needs_approval,
        check=_checker(schema),
        available=lambda: hub.reason(config.name),
        action=(
            lambda _args: {
                "executedBy": "diagnosis agent (approved MCP tool call)",
                "where": config.where,
                "lastsMinutes": None,
            }
        )
        if needs_approval
        else None,
        origin=f"mcp:{config.name}",
    )


def mcp_tools(flow: str) -> tuple[list[ToolSpec], dict[str, str]]:
    """The MCP tools offered to `flow` now, and `{name: why}` of those left out (non-blocking)."""
    hub = current_hub()
    if hub is None:
        return [], {}
    hub.poke()
    specs: list[ToolSpec] = []
    left_out: dict[str, str] = {}
    for state in hub.states.values():
        config = state.config
        if flow not in config.flows:
            continue
        if not state.tools:
            left_out[f"mcp:{config.name}"] = state.reason() or "NoTools: the server lists no tool"
            continue
        allowed = sorted((t for t in state.tools if config.offers(t.name)), key=lambda t: t.name)
        for index, tool in enumerate(allowed):
            spec = (
                _spec(hub, config, tool) if index < TOOLS_PER_SERVER else f"TooMany: over {TOOLS_PER_SERVER}"
            )
            if isinstance(spec, str):
                left_out[clip(tool_name(config.name, tool.name), 100)] = spec
            else:
                specs.append(spec)
    return specs, left_out


def overview() -> list[dict[str, Any]]:
    """Each configured server as this process sees it, for the admin page: where, status, last error,
    its last stderr lines (redacted) and each listed tool with whether it is offered and needs approval."""
    hub = current_hub()
    if hub is None:
        return []
    hub.poke()
    out = []
    for state in hub.states.values():
        config = state.config
        tools = [
            {
                "name": tool_name(config.name, t.name),
                "offered": config.offers(t.name),
                "approval": config.needs_approval(t.name, t.read_only_hint),
                "readOnlyHint": t.read_only_hint,
            }
            for t in sorted(state.tools, key=lambda t: t.name)
        ]
        out.append(
            {
                "name": config.name,
                "where": config.where,
                "transport": config.transport,
                "trusted": config.trusted,
                "status": state.status,
                "lastError": state.last_error,
                "stderr": list(state.stderr),
                "tools": tools,
            }
        )
    return out
