"""Support for the tests of the record's MCP endpoint: runs executed by the real runtime against the fake
OpenAI-compatible server (with reasoning stored), API tokens, and the official MCP client (`mcp` 2.x)
against a daphne process serving `config.asgi` with `MCP_SERVER_ENABLED`."""

from __future__ import annotations

import asyncio
import http.server
import io
import json
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import httpx2
from django.core.management import call_command
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from access.services import issue_token
from diagnosis.models import ReleaseDecision, RunStatus
from reasoning.models import AgentReasoningAudit
from tests.agent.runtime.support import GUARD_THINKING, ROUTER_THINKING, ask, script_reasoned_diagnosis
from tests.surfaces.chat.support import DaphneServer

# Reasoning the fake provider returns and the runtime stores (`script_reasoned_diagnosis`).
REASONING_TEXTS = (ROUTER_THINKING, GUARD_THINKING, "Search the runbooks.")
QUIET = {
    "AIOPS_WORKER_CONCURRENCY": "0",
    "RUN_SWEEP_INTERVAL_SECONDS": "0",
    "AUDIT_CHECKPOINT_INTERVAL_SECONDS": "0",
    "AUDIT_PURGE_INTERVAL_SECONDS": "0",
}


def executed_run(llm, user, query: str = "Disk full on /var/log"):
    """One diagnosis of `user` executed by the runtime to a published answer, its reasoning stored (so a
    leak would be visible), anchored by a checkpoint."""
    script_reasoned_diagnosis(llm)
    run, outcome, _ = ask(user, query)
    assert outcome.release_decision == ReleaseDecision.PUBLISHED and run.status == RunStatus.SUCCESS
    stored = AgentReasoningAudit.objects.filter(run_id=run.run_id, reasoning_available=True)
    assert {row.reasoning_content for row in stored} >= {ROUTER_THINKING, GUARD_THINKING}
    call_command("audit_checkpoint", stdout=io.StringIO())
    return run


def token_of(user, **kwargs: Any) -> str:
    return issue_token(user=user, **kwargs).plaintext


def mcp_server(**env: str) -> DaphneServer:
    return DaphneServer(env={**QUIET, **env}, name="mcp").start()


def with_client(url: str, token: str | None, work: Callable[[Client], Awaitable[Any]], **kwargs: Any) -> Any:
    """`work(client)` with the official client connected to `url` over streamable HTTP, sending
    `Authorization: Bearer <token>` (no header without a token)."""

    async def main():
        headers = {"Authorization": f"Bearer {token}"} if token else None
        async with (
            httpx2.AsyncClient(headers=headers, timeout=30) as http,
            Client(streamable_http_client(url, http_client=http), **kwargs) as client,
        ):
            return await work(client)

    return asyncio.run(main())


def text_of(result) -> str:
    """The text of a tool result (one text content)."""
    (content,) = result.content
    return content.text


def json_of(result) -> Any:
    assert not result.is_error, text_of(result)
    return json.loads(text_of(result))


def refusal_of(connect: Callable[[], Any]) -> MCPError:
    """The `MCPError` that `connect()` fails with (the client raises it inside nested exception groups)."""
    try:
        connect()
    except BaseException as exc:
        pending: list[BaseException] = [exc]
        while pending:
            found = pending.pop()
            if isinstance(found, MCPError):
                return found
            pending += list(getattr(found, "exceptions", ()))
        raise
    raise AssertionError("the client connected")


class AuthorizingProxy:
    """A plain HTTP proxy on 127.0.0.1 that adds `Authorization: Bearer <token>` to every request it
    forwards to `upstream` (as a gateway in front of the endpoint would): for clients that send no
    header of their own, like the MCP conformance suite. Bodies are buffered (the endpoint answers JSON)."""

    def __init__(self, upstream: str, token: str) -> None:
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _forward(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else None
                # Everything but hop-by-hop headers, the Host and Origin included, as the client sent them.
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                headers["Authorization"] = f"Bearer {proxy.token}"
                answer = httpx.request(
                    self.command, proxy.upstream + self.path, content=body, headers=headers, timeout=30
                )
                self.send_response(answer.status_code)
                for key, value in answer.headers.items():
                    if key.lower() not in _HOP_BY_HOP | {"host"}:
                        self.send_header(key, value)
                self.send_header("content-length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_POST = do_DELETE = _forward

            def log_message(self, format, *args) -> None:
                return

        self.upstream, self.token = upstream, token
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> AuthorizingProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "authorization"}
