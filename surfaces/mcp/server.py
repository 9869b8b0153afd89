"""The record's MCP server (official `mcp` SDK, low-level `Server`): five read-only tools and the runbooks
as resources, for the user `surfaces.mcp.asgi` authenticated (`USER_KEY` in the HTTP request's scope).

Each tool is one read of `surfaces.mcp.reads`, run on the runtime's database pool; a refusal is a tool
result with `isError` and the REST API's message (the same text for absent and not yours), an unknown
tool or runbook a protocol error. Every request is counted by method and outcome
(`surfaces.mcp.metrics`). Details: docs/mcp.md, *The record over MCP*.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.shared.exceptions import MCPError
from rest_framework.utils.encoders import JSONEncoder as DRFEncoder

from agent.runtime.db import db
from core.product import PRODUCT_NAME
from diagnosis import review_queue
from diagnosis.models import Intent, ReleaseDecision, RunStatus
from surfaces.mcp import reads
from surfaces.mcp.metrics import count

USER_KEY = "diagnosis.mcp_user"
RUNBOOK_SCHEME = "runbook://"
RESOURCE_NOT_FOUND = -32002  # the MCP specification's code for an unknown resource
MAX_SLUG_CHARS = 100
ID = {"type": "string", "minLength": 1, "maxLength": 64}


# --------------------------------------------------------------------------------------------------
# The tools
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    title: str
    description: str
    properties: dict[str, Any]
    read: Callable[[Any, dict[str, Any]], Any]

    def tool(self) -> types.Tool:
        schema = {"type": "object", "properties": self.properties, "additionalProperties": False}
        return types.Tool(
            name=self.name,
            title=self.title,
            description=self.description,
            input_schema=schema,
            annotations=types.ToolAnnotations(
                title=self.title,
                read_only_hint=True,
                destructive_hint=False,
                idempotent_hint=True,
                open_world_hint=False,
            ),
        )


_RUN = {
    "sessionId": {**ID, "description": "The run's session (optional when runId is given)."},
    "runId": {**ID, "description": "The run; omitted: the session's latest run."},
}
_LIMIT = {"type": "integer", "minimum": 1, "maximum": reads.MAX_RESULTS, "default": 20}
_WHEN = {"type": "string", "format": "date-time", "maxLength": 40}

TOOLS = (
    ToolSpec(
        "search_runs",
        "Search diagnosis runs",
        "The diagnosis runs you may see, newest first: their question, status, release decision, tokens "
        "and cost. `text` is a run or session id (or its beginning) or words of the question; the filters "
        "are those of the REST run list. Read a run with get_run_trace.",
        {
            "text": {"type": "string", "maxLength": 200},
            "sessionId": ID,
            "status": {"type": "string", "enum": list(RunStatus.values)},
            "releaseDecision": {"type": "string", "enum": list(ReleaseDecision.values)},
            "intent": {"type": "string", "enum": list(Intent.values)},
            "createdAfter": _WHEN,
            "createdBefore": _WHEN,
            "limit": _LIMIT,
        },
        reads.search_runs,
    ),
    ToolSpec(
        "get_run_trace",
        "Read a run's decision trace",
        "The decision trace of one run as the REST API serves it: the run, its ordered timeline, model "
        "steps, tool calls and the audit summary (auditComplete, chainValid, gaps). Never reasoning.",
        _RUN,
        reads.trace,
    ),
    ToolSpec(
        "get_evidence_bundle",
        "Fetch a run's evidence bundle",
        "The run's evidence bundle (its chain, bound rows as digests and its transparency-log proof), "
        "verifiable offline with `python -m audit.verify_bundle`. Staff and reasoning auditors only.",
        _RUN,
        reads.evidence_bundle,
    ),
    ToolSpec(
        "verify_run",
        "Verify a run's record",
        "Verify one run's record now, as `manage.py verify_audit --run` does: hash chain, stored rows "
        "against their digests, anchoring and list facts. `ok` false names every problem.",
        _RUN,
        reads.verification,
    ),
    ToolSpec(
        "list_review_queue",
        "List the review queue",
        "The finished runs waiting for a human review, oldest first, with why each is queued and the "
        "counts per reason. Staff only.",
        {"reason": {"type": "string", "enum": list(review_queue.REASON_KEYS)}, "limit": _LIMIT},
        reads.review_queue_page,
    ),
)
TOOLS_BY_NAME = {spec.name: spec for spec in TOOLS}


def _user(ctx: ServerRequestContext) -> Any:
    request = ctx.request
    user = request.scope.get(USER_KEY) if request is not None else None
    if user is None:  # never reached through `surfaces.mcp.asgi`, which authenticates first
        raise MCPError(types.INVALID_REQUEST, "Not authenticated.")
    return user


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, cls=DRFEncoder, ensure_ascii=False, separators=(",", ":"))


async def list_tools(
    ctx: ServerRequestContext, params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    _user(ctx)
    count("tools/list", "ok")
    return types.ListToolsResult(tools=[spec.tool() for spec in TOOLS])


async def call_tool(ctx: ServerRequestContext, params: types.CallToolRequestParams) -> types.CallToolResult:
    user = _user(ctx)
    spec = TOOLS_BY_NAME.get(params.name)
    if spec is None:
        count("tools/call", "unknown_tool")
        raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {params.name[:100]}")
    try:
        value = await db(spec.read, user, dict(params.arguments or {}))
    except reads.Refused as refused:
        count(spec.name, refused.kind)
        return types.CallToolResult(content=[types.TextContent(text=refused.message)], is_error=True)
    except Exception:
        count(spec.name, "error")
        raise
    count(spec.name, "ok")
    return types.CallToolResult(content=[types.TextContent(text=_text(value))])


async def list_resources(
    ctx: ServerRequestContext, params: types.PaginatedRequestParams | None
) -> types.ListResourcesResult:
    _user(ctx)
    found = await db(reads.runbooks)
    count("resources/list", "ok")
    return types.ListResourcesResult(
        resources=[
            types.Resource(
                name=row["slug"],
                title=row["title"],
                uri=f"{RUNBOOK_SCHEME}{row['slug']}",
                description=row["summary"][:500] or None,
                mime_type="text/markdown",
            )
            for row in found
        ]
    )


async def read_resource(
    ctx: ServerRequestContext, params: types.ReadResourceRequestParams
) -> types.ReadResourceResult:
    _user(ctx)
    uri = str(params.uri)
    slug = uri.removeprefix(RUNBOOK_SCHEME)
    try:
        if not uri.startswith(RUNBOOK_SCHEME) or not 0 < len(slug) <= MAX_SLUG_CHARS:
            raise reads.Refused("not_found", reads.NOT_FOUND_RUNBOOK)
        text = await db(reads.runbook_markdown, slug)
    except reads.Refused as refused:
        count("resources/read", refused.kind)
        raise MCPError(RESOURCE_NOT_FOUND, refused.message, {"uri": uri[:200]}) from None
    count("resources/read", "ok")
    return types.ReadResourceResult(
        contents=[types.TextResourceContents(uri=uri, mime_type="text/markdown", text=text)]
    )


def build_server() -> Server:
    """A new MCP server of the record (one per session manager: `surfaces.mcp.asgi`)."""
    return Server(
        "diagnosis-record",
        version="1",
        title=f"{PRODUCT_NAME}: the record",
        instructions=(
            "Read-only access to the audited record of diagnosis runs: search runs, read a run's trace, "
            "fetch its evidence bundle, verify it, list the review queue; runbooks are resources "
            "(runbook://<slug>). You see exactly what your API token's user may see."
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_read_resource=read_resource,
    )
