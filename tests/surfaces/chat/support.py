"""Support for the chat tests: a scripted provider for the fake LLM server, daphne subprocesses on the
test database, a TCP proxy that can drop connections, and an SSE reader for httpx streams."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from django.conf import settings
from django.db import connection

from agent.runtime import supervisor
from tests.fakes.openai_server import (
    Completion,
    Stream,
    finish_chunk,
    text_chunks,
    tool_call_chunks,
    usage,
)

BASE_DIR = Path(settings.BASE_DIR)
# The password of the users the browser tests sign in with (hashed for the daphne subprocess).
PASSWORD = "pw-staff-1"
ARTIFACTS = BASE_DIR / "test-artifacts"
ROUTER_MODEL = "router-m"
AGENT_MODEL = "agent-m"
GUARD_MODEL = "guard-m"
EVIDENCE_ID = re.compile(r"kb:[a-z0-9]+(?:[-_][a-z0-9]+)*#[1-9][0-9]*")


# -------------------------------------------------------------------------------------------------
# A scripted provider: router → one tool round → a cited answer streamed slowly → guard
# -------------------------------------------------------------------------------------------------
@dataclass
class ScriptedProvider:
    """Answers the runtime's three roles like a real provider would, by model name.

    Router: `{"intent": intent, ...}`. Agent, first step: one call per name in `tools` (parallel calls);
    after the tool results: an answer citing the first evidence id found in them, streamed in `pieces`
    pieces `delay` seconds apart. Guard: `supported`. `answer` may be overridden; `answers`, when given,
    are the agent's answers in turn (e.g. an uncited draft, then its repair), the last one repeated;
    `{cite}` in an answer becomes ` [<the first evidence id in the tool results>]`.
    """

    intent: str = "DIAGNOSIS"
    tools: tuple[tuple[str, dict[str, Any]], ...] = (("lookup_knowledge", {"query": "replication lag"}),)
    delay: float = 0.0
    pieces: int = 4
    answer: str | None = None
    answers: list[str] = field(default_factory=list)
    supported: bool = True
    calls: list[str] = field(default_factory=list)

    def env(self, base_url: str) -> dict[str, str]:
        return {
            "LLM_PROVIDER": "openai",
            "LLM_BASE_URL": base_url,
            "LLM_API_KEY": "test-key",
            "LLM_MODEL": AGENT_MODEL,
            "LLM_ROUTER_MODEL": ROUTER_MODEL,
            "LLM_GUARD_MODEL": GUARD_MODEL,
            "LLM_MAX_RETRIES": "0",
        }

    def settings(self, base_url: str) -> dict[str, Any]:
        return {
            "LLM_PROVIDER": "openai",
            "LLM_BASE_URL": base_url,
            "LLM_API_KEY": "test-key",
            "LLM_MODEL": AGENT_MODEL,
            "LLM_ROUTER_MODEL": ROUTER_MODEL,
            "LLM_GUARD_MODEL": GUARD_MODEL,
            "LLM_MAX_RETRIES": 0,
        }

    def __call__(self, request):
        model = request.model
        if model == ROUTER_MODEL:
            self.calls.append("router")
            return _text(
                request, json.dumps({"intent": self.intent, "confidence": 0.9, "reason": "scripted"})
            )
        if model == GUARD_MODEL:
            self.calls.append("guard")
            claims = [] if self.supported else ["the answer claims more than the runbook says"]
            verdict = {"supported": self.supported, "unsupportedClaims": claims, "reason": "scripted"}
            return _text(request, json.dumps(verdict))
        messages = request.messages
        if self.intent in ("DIAGNOSIS", "KNOWLEDGE") and not any(m.get("role") == "tool" for m in messages):
            self.calls.append("agent-tools")
            calls = [
                (f"call_{i}_{len(self.calls)}", name, json.dumps(args))
                for i, (name, args) in enumerate(self.tools)
            ]
            chunks = [*tool_call_chunks(calls, fragments=2), finish_chunk("tool_calls")]
            return Stream(chunks=chunks, usage=usage(300, 20), usage_if_requested=True)
        self.calls.append("agent-answer")
        tool_text = " ".join(str(m.get("content") or "") for m in messages if m.get("role") == "tool")
        found = EVIDENCE_ID.search(tool_text)
        cite = f" [{found.group(0)}]" if found else ""
        text = self.answer
        if self.answers:
            text = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if text is None:
            text = (
                f"Check the replica's SQL thread and long transactions first.{cite} "
                f"Then compare binlog positions.{cite}"
            )
        text = text.replace("{cite}", cite)
        chunks = [*text_chunks(text, self.pieces), finish_chunk("stop")]
        return Stream(chunks=chunks, delay=self.delay, usage=usage(900, 60), usage_if_requested=True)


def _text(request, text: str):
    if request.stream:
        return Stream(
            chunks=[*text_chunks(text, 2), finish_chunk("stop")],
            usage=usage(100, 10),
            usage_if_requested=True,
        )
    return Completion(message={"content": text}, usage=usage(100, 10))


# -------------------------------------------------------------------------------------------------
# The test database, as a URL another process can use
# -------------------------------------------------------------------------------------------------
def database_url() -> str:
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    auth = db["USER"] + (f":{db['PASSWORD']}" if db.get("PASSWORD") else "")
    return f"mysql://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 3306}/{db['NAME']}"


# -------------------------------------------------------------------------------------------------
# daphne subprocesses
# -------------------------------------------------------------------------------------------------
class DaphneServer:
    """`daphne -b 127.0.0.1 -p 0 <app>` on the test database; the port is read from its log. With
    `serve=True` it is started as the shipped units do, through `python -m config.serve daphne asyncio`
    (background duties at process start)."""

    def __init__(
        self,
        *,
        env: dict[str, str] | None = None,
        app: str = "config.asgi:application",
        name: str = "d",
        serve: bool = False,
    ):
        self.app = app
        self.serve = serve
        self.name = name
        self.extra_env = env or {}
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.log_path = ARTIFACTS / f"daphne-{name}-{os.getpid()}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> DaphneServer:
        ARTIFACTS.mkdir(exist_ok=True)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("LLM_", "PYTEST", "DJANGO_")) and k not in ("REDIS_URL", "DATABASE_URL")
        }
        env.update(
            {
                "DJANGO_SETTINGS_MODULE": "config.settings",
                "DATABASE_URL": database_url(),
                "DEBUG": "true",
                "LLM_PROVIDER": "demo",
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(self.extra_env)
        self.log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            # Twisted's default listen backlog (50) overflows when a test opens hundreds of connections
            # at once: the kernel then resets connections the server never saw (a deployment sets it
            # the same way, docs/deployment.md).
            [
                *(
                    [sys.executable, "-m", "config.serve", "daphne", "asyncio"]
                    if self.serve
                    else [str(Path(sys.executable).with_name("daphne"))]
                ),
                "-e",
                "tcp:port=0:interface=127.0.0.1:backlog=1024",
                self.app,
            ],
            cwd=BASE_DIR,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        pattern = re.compile(rb"Listening on TCP address 127\.0\.0\.1:(\d+)")
        while time.monotonic() < deadline:
            found = pattern.search(self.log_path.read_bytes())
            if found:
                self.port = int(found.group(1))
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        output = self.log_path.read_text(errors="replace")[-3000:]
        self.stop()
        raise RuntimeError(f"daphne {self.name} did not start:\n{output}")

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if getattr(self, "log", None) is not None:
            self.log.close()
            self.log = None

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


# -------------------------------------------------------------------------------------------------
# A TCP proxy whose open connections can be dropped (a network blip between browser and server)
# -------------------------------------------------------------------------------------------------
class DroppingProxy:
    """Forwards 127.0.0.1:<port> to `upstream_port` from a thread; `drop()` aborts every open connection
    (new ones are still accepted); `request_lines` records each HTTP request line it saw."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port: int | None = None
        self.request_lines: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._writers: set = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def start(self) -> DroppingProxy:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self._loop
        ).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, reader, writer) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.close()
            return
        self._writers.update({writer, up_writer})

        async def pipe(src, dst, record: bool) -> None:
            try:
                while data := await src.read(65536):
                    if record:
                        for line in data.split(b"\r\n"):
                            if re.match(rb"^(GET|POST|PUT|DELETE|HEAD|OPTIONS) ", line):
                                self.request_lines.append(line.decode("latin1"))
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer, True), pipe(up_reader, writer, False))
        self._writers.difference_update({writer, up_writer})

    def drop(self) -> int:
        async def abort() -> int:
            writers = list(self._writers)
            for w in writers:
                w.transport.abort()
            return len(writers)

        return asyncio.run_coroutine_threadsafe(abort(), self._loop).result(10)

    def stop(self) -> None:
        async def close() -> None:
            self._server.close()
            for w in list(self._writers):
                w.transport.abort()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


# -------------------------------------------------------------------------------------------------
# Reading SSE
# -------------------------------------------------------------------------------------------------
@dataclass
class SseEvent:
    event: str
    data: Any
    id: int | None = None


def parse_sse(text: str) -> tuple[list[SseEvent], int]:
    """Events of a complete SSE text (comments counted separately)."""
    events, comments = [], 0
    for block in text.replace("\r\n", "\n").split("\n\n"):
        if not block.strip():
            continue
        event, data, ident = "message", [], None
        only_comments = True
        for line in block.split("\n"):
            if line.startswith(":"):
                comments += 1
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            only_comments = False
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)
            elif name == "id":
                ident = int(value)
        if not only_comments and data:
            events.append(SseEvent(event, json.loads("\n".join(data)), ident))
    return events, comments


def iter_sse(response: httpx.Response):
    """Events of a streaming httpx response as they arrive."""
    buffer = ""
    for chunk in response.iter_text():
        buffer += chunk.replace("\r\n", "\n")
        while "\n\n" in buffer:
            block, buffer = buffer.split("\n\n", 1)
            events, _ = parse_sse(block + "\n\n")
            yield from events


def use_redis_layer(django_settings, url: str, *, socket_timeout: float = 15) -> None:
    """Point the test's channel layer at Redis database `url` (channels_redis, as `REDIS_URL` configures
    it); skip the test when Redis does not answer. Each module uses a database of its own: a layer's
    `flush()` empties every channel of its database."""
    import redis

    try:
        redis.Redis.from_url(url, socket_timeout=1).ping()
    except redis.RedisError:
        import pytest

        pytest.skip("needs Redis on 127.0.0.1:6379")
    django_settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [{"address": url, "socket_timeout": socket_timeout}]},
        }
    }


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05, message: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {message}")


def owned_runs() -> dict[str, asyncio.Task]:
    """The runs this process is executing (run id → task), from the supervisor's registry."""
    return {run_id: owned.task for run_id, owned in supervisor._runs.items()}


# The contract's keys of each chat frame's payload (SSE `data:`; a WebSocket frame adds `type`, and
# `runId` to progress, draft and tool frames). Progress frames carry their optional facts only when set.
PAYLOAD_KEYS = {
    "run": {"sessionId", "runId", "demo", "query", "askedAt"},
    "progress": {"stage", "status", "sequenceNo"},
    "draft": {"text"},
    "tool": {"toolCallId", "name", "status"},
    "outcome": {"runId", "status", "releaseDecision", "content", "contentHtml"},
    "error": {"code", "message"},
}
PROGRESS_OPTIONAL = {"intent", "stepIndex", "agentName", "verdict", "retry", "redacted", "at"}
TOOL_OPTIONAL = {"at"}  # replayed frames: when the timeline event was recorded
_ADDRESSED = {"progress", "draft", "tool"}


def assert_frame_keys(kind: str, keys: set[str], *, websocket: bool) -> None:
    """`keys` are exactly the contract's keys of a `kind` frame (WebSocket or SSE payload)."""
    expected = set(PAYLOAD_KEYS[kind])
    if websocket:
        expected |= {"type"} | ({"runId"} if kind in _ADDRESSED else set())
    if kind in ("progress", "tool"):
        optional = PROGRESS_OPTIONAL if kind == "progress" else TOOL_OPTIONAL
        assert expected <= keys <= expected | optional, (kind, keys)
    else:
        assert keys == expected, (kind, keys)


def text_before_release(frames: list[dict], *, content: str) -> list[dict]:
    """The frames before the outcome that carry answer text: drafts, or any frame quoting the content."""
    out = []
    for frame in frames:
        if frame.get("type") == "outcome":
            break
        wire = json.dumps(frame, ensure_ascii=False)
        if frame.get("type") == "draft" or (content and content[:40] in wire):
            out.append(frame)
    return out
