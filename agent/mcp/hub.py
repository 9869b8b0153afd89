"""The process's MCP connections: one event loop holds every configured server's session.

That loop is a serving process's own (`serve_on`, at process start), so a run's call takes no thread hop;
elsewhere the hub runs a loop of its own in a thread. `current_hub()` gives the hub of the configured
servers (rebuilt when `MCP_SERVERS` changes or its loop ended). Each server is connected in the
background, bounded by `MCP_CONNECT_TIMEOUT_SECONDS`, its tools listed then and on change notifications,
retried with back-off (1 s doubling to 60 s). `call` raises only the bounded `McpCallError`s below. A
stdio server's stderr is kept and logged redacted, never raw. Details: docs/mcp.md, *Discovery*.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
from django.conf import settings
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from agent.mcp.config import ServerConfig, servers
from agent.redaction import Redactor
from audit.payloads import clip

logger = logging.getLogger(__name__)

BACKOFF_START_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 60.0
STDERR_LINES = 20
LIST_PAGES = 10
MESSAGE_CHARS = 200


class McpCallError(Exception):
    """A call that did not yield a result; its message is bounded and names no argument or content."""


class McpUnavailable(McpCallError):
    pass


class McpTimeout(McpCallError):
    pass


class McpConnectionLost(McpCallError):
    pass


class McpProtocolError(McpCallError):
    pass


class McpServerError(McpCallError):
    pass


@dataclass(frozen=True, slots=True)
class DiscoveredTool:
    """A tool as the server listed it (its schema as sent)."""

    name: str
    description: str
    input_schema: dict[str, Any]
    read_only_hint: bool | None


@dataclass(eq=False)
class ServerState:
    config: ServerConfig
    status: str = "starting"  # starting → ready | down; down → starting after the back-off
    tools: tuple[DiscoveredTool, ...] = ()
    last_error: str = ""
    failures: int = 0
    retry_at: float = 0.0
    connected_at: float = 0.0
    lists: int = 0  # how many times the tools were listed (a change notification lists them again)
    stderr: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=STDERR_LINES))
    client: Client | None = None
    closed: asyncio.Event | None = None
    task: asyncio.Task[None] | None = None
    settled: threading.Event = field(default_factory=threading.Event)  # first attempt ended

    def reason(self) -> str | None:
        """Why its tools cannot run now, or None."""
        if self.status == "ready" and self.client is not None:
            return None
        if self.status == "starting":
            return f"Connecting: MCP server {self.config.name} is not connected yet"
        return clip(f"Unreachable: MCP server {self.config.name}: {self.last_error or 'down'}", 300)


def _bounded(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return clip(f"{type(exc).__name__}: {text}" if text else type(exc).__name__, MESSAGE_CHARS)


def _read_stderr(state: ServerState, fd: int) -> None:
    """Each line the server writes to stderr, redacted, into `state.stderr` and the DEBUG log."""
    redactor = Redactor()
    with open(fd, encoding="utf-8", errors="replace") as stream:
        for line in stream:
            text = clip(redactor.redact(line.rstrip("\n"), count=False), 300)
            redactor.take()
            state.stderr.append(text)
            logger.debug("mcp server=%s stderr: %s", state.config.name, text)


class Hub:
    """The connections of one configuration (see the module docstring): on `loop` when given (a loop that
    runs for the process's life), else on a loop of its own in a daemon thread."""

    def __init__(
        self, configs: tuple[ServerConfig, ...], loop: asyncio.AbstractEventLoop | None = None
    ) -> None:
        self.configs = configs
        self.states = {c.name: ServerState(c) for c in configs}
        self.closing = False
        self._thread: threading.Thread | None = None
        if loop is None:
            loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=loop.run_forever, name="mcp-hub", daemon=True)
            self._thread.start()
        self.loop = loop
        for state in self.states.values():
            self._submit(self._start(state))

    def alive(self) -> bool:
        """Whether its loop can still serve calls."""
        if self._thread is not None:
            return self._thread.is_alive()
        return not self.loop.is_closed()

    def _submit(self, coro: Any) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def poke(self) -> None:
        """Start again, now, every server that is down and whose back-off has passed (non-blocking)."""
        now = time.monotonic()
        for state in self.states.values() if not self.closing else ():
            if state.status == "down" and state.retry_at <= now:
                state.status = "starting"
                self._submit(self._start(state))

    def wait_settled(self, timeout: float) -> bool:
        """Wait (blocking) until each server's first connection attempt ended; whether all did."""
        deadline = time.monotonic() + timeout
        return all(s.settled.wait(max(0.0, deadline - time.monotonic())) for s in self.states.values())

    def reason(self, name: str) -> str | None:
        self.poke()
        return self.states[name].reason()

    async def _start(self, state: ServerState) -> None:
        state.status, state.closed = "starting", asyncio.Event()
        state.task = asyncio.current_task()
        try:
            await self._serve(state)
        except Exception as exc:
            state.last_error = _bounded(exc)
        except asyncio.CancelledError:
            state.last_error = "stopped"
        finally:
            state.client = None
            state.failures += 1
            delay = min(BACKOFF_MAX_SECONDS, BACKOFF_START_SECONDS * 2 ** min(state.failures - 1, 10))
            state.retry_at = time.monotonic() + delay
            state.status = "down"
            state.settled.set()
            logger.info(
                "mcp server=%s down error=%s retry_in=%.0fs", state.config.name, state.last_error, delay
            )
            if not self.closing:
                self.loop.call_later(delay, self.poke)

    def _transport(self, state: ServerState, stack: contextlib.ExitStack) -> Any:
        config = state.config
        if config.url:
            http = create_mcp_http_client(headers=config.http_headers())
            return streamable_http_client(config.url, http_client=http)
        command = config.command
        if os.sep in command and not os.path.isabs(command):
            command = os.path.join(settings.BASE_DIR, command)
        read_fd, write_fd = os.pipe()
        errlog = stack.enter_context(open(write_fd, "w", encoding="utf-8"))  # noqa: SIM115
        threading.Thread(target=_read_stderr, args=(state, read_fd), name="mcp-stderr", daemon=True).start()
        params = StdioServerParameters(
            command=command, args=list(config.args), env=config.child_env(), cwd=str(settings.BASE_DIR)
        )
        return stdio_client(params, errlog=errlog)

    async def _serve(self, state: ServerState) -> None:
        """Connect, list the tools, and hold the session until it is closed (a broken call, a stop)."""
        assert state.closed is not None

        async def on_message(message: Any) -> None:
            if isinstance(message, types.ToolListChangedNotification) and state.client is not None:
                asyncio.get_running_loop().create_task(self._relist(state, state.client))

        with contextlib.ExitStack() as pipes:
            transport = self._transport(state, pipes)
            async with contextlib.AsyncExitStack() as stack:
                async with asyncio.timeout(float(settings.MCP_CONNECT_TIMEOUT_SECONDS)):
                    client = await stack.enter_async_context(
                        Client(transport, message_handler=on_message, cache=None, mode=state.config.protocol)
                    )
                    state.tools = await self._list(client)
                state.lists += 1
                state.client, state.status, state.last_error = client, "ready", ""
                state.failures, state.connected_at = 0, time.time()
                state.settled.set()
                logger.info("mcp server=%s ready tools=%d", state.config.name, len(state.tools))
                modern = client.protocol_version in MODERN_PROTOCOL_VERSIONS
                listener = asyncio.create_task(self._listen(state, client)) if modern else None
                try:
                    await state.closed.wait()
                finally:
                    state.client = None
                    if listener is not None:
                        listener.cancel()
                        with contextlib.suppress(asyncio.CancelledError, Exception):
                            await listener
            state.last_error = state.last_error or "the connection was closed"

    @staticmethod
    async def _list(client: Client) -> tuple[DiscoveredTool, ...]:
        tools: list[DiscoveredTool] = []
        cursor: str | None = None
        for _ in range(LIST_PAGES):
            page = await client.list_tools(cursor=cursor)
            for tool in page.tools:
                hint = tool.annotations.read_only_hint if tool.annotations is not None else None
                schema = tool.input_schema if isinstance(tool.input_schema, dict) else {}
                tools.append(DiscoveredTool(tool.name, tool.description or "", schema, hint))
            cursor = page.next_cursor
            if not cursor:
                break
        return tuple(tools)

    async def _listen(self, state: ServerState, client: Client) -> None:
        """On a 2026-07-28 connection a server announces changed tools only on a `subscriptions/listen`
        stream (never on the connection itself): listen, and list the tools again at each change. A server
        that refuses or does not honour it is not listened to; a stream that breaks once open ends the
        session (restarted with back-off, which lists the tools again)."""
        name, opened = state.config.name, False
        try:
            async with client.listen(tools_list_changed=True) as subscription:
                opened = True
                if not subscription.honored.tools_list_changed:
                    logger.info("mcp server=%s does not announce changed tools", name)
                    return
                async for _event in subscription:
                    await self._relist(state, client)
        except Exception as exc:
            logger.info("mcp server=%s change stream ended error=%s", name, _bounded(exc))
            if opened and state.client is client:
                self._broken(state, f"the change stream broke: {_bounded(exc)}")

    async def _relist(self, state: ServerState, client: Client) -> None:
        try:
            async with asyncio.timeout(float(settings.MCP_CONNECT_TIMEOUT_SECONDS)):
                state.tools = await self._list(client)
            state.lists += 1
        except Exception as exc:
            state.last_error = f"listing the changed tools failed: {_bounded(exc)}"
            self._broken(state, state.last_error)

    def _broken(self, state: ServerState, why: str) -> None:
        state.last_error, state.client = why, None
        if state.closed is not None:
            state.closed.set()

    async def _call(self, name: str, tool: str, arguments: dict[str, Any]) -> types.CallToolResult:
        state = self.states[name]
        client, config = state.client, state.config
        if client is None:
            raise McpUnavailable(state.reason() or "the server is not connected")
        try:
            async with asyncio.timeout(config.timeout):
                return await client.call_tool(tool, arguments)
        except TimeoutError:
            raise McpTimeout(f"MCP server {name} did not answer within {config.timeout:g} s") from None
        except MCPError as exc:
            if exc.code == types.CONNECTION_CLOSED:
                self._broken(state, "the server closed the connection")
                raise McpConnectionLost(f"MCP server {name} closed the connection during the call") from None
            raise McpServerError(clip(f"MCP server {name} answered error {exc.code}: {exc}", 300)) from None
        except ValidationError:
            raise McpProtocolError(f"MCP server {name} answered a result that is not valid MCP") from None
        except Exception as exc:  # a transport that broke: the server is restarted with back-off
            self._broken(state, _bounded(exc))
            raise McpConnectionLost(
                f"MCP server {name}: the connection failed ({type(exc).__name__})"
            ) from None

    async def call(self, name: str, tool: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """Call `tool` on server `name` from any event loop: directly on the hub's loop, else through it
        (the session lives there)."""
        if asyncio.get_running_loop() is self.loop:
            return await self._call(name, tool, arguments)
        return await asyncio.wrap_future(self._submit(self._call(name, tool, arguments)))

    async def _stop(self, timeout: float) -> None:
        for state in self.states.values():
            if state.task is not None and not state.task.done():
                state.task.cancel()
        tasks = [s.task for s in self.states.values() if s.task is not None]
        await asyncio.wait(tasks, timeout=timeout) if tasks else None

    async def aclose(self, timeout: float = 5.0) -> None:
        """Close from the hub's own loop (a serving process's shutdown): stop each session, awaiting
        the servers' ends up to `timeout`."""
        self.closing = True
        await self._stop(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Close from any thread; on the hub's own loop it only cancels the sessions (it cannot wait)."""
        self.closing = True
        if self.loop.is_closed():
            return
        try:
            on_loop = asyncio.get_running_loop() is self.loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            for state in self.states.values():
                if state.task is not None:
                    state.task.cancel()
            return
        with contextlib.suppress(Exception):
            self._submit(self._stop(timeout)).result(timeout + 1)
        if self._thread is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)


_hub: Hub | None = None
_home: asyncio.AbstractEventLoop | None = None  # the serving loop, once `serve_on` named it
_hub_lock = threading.Lock()


def current_hub() -> Hub | None:
    """The hub of the configured servers (None when none is configured); a changed configuration, or a
    hub whose loop has ended, is closed and a new one started (on the serving loop while it runs)."""
    global _hub
    configs = servers()
    with _hub_lock:
        if _hub is not None and (_hub.configs != configs or not _hub.alive()):
            _hub.close()
            _hub = None
        if _hub is None and configs:
            home = _home if _home is not None and not _home.is_closed() else None
            _hub = Hub(configs, loop=home)
        return _hub


def serve_on(loop: asyncio.AbstractEventLoop) -> None:
    """Hold the MCP sessions on `loop`, a serving process's loop for its whole life, so that a run's
    call (made on it) takes no thread hop; a hub already running elsewhere is closed (its sessions
    start again on `loop`). Called once, at process start, before any run."""
    global _home, _hub
    with _hub_lock:
        _home = loop
        previous, _hub = (_hub, None) if _hub is not None and _hub.loop is not loop else (None, _hub)
    if previous is not None:
        previous.close()


async def aclose_hub() -> None:
    """Close the hub at a serving process's end, from its loop (sessions on it are awaited; a hub on
    its own thread is closed from a worker thread, never blocking the loop)."""
    global _hub, _home
    with _hub_lock:
        hub, _hub = _hub, None
        _home = None
    if hub is None:
        return
    if hub.loop is asyncio.get_running_loop():
        await hub.aclose()
    else:
        await asyncio.to_thread(hub.close)


def close_hub() -> None:
    global _hub
    with _hub_lock:
        if _hub is not None:
            _hub.close()
        _hub = None
