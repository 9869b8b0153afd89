"""Support for the runtime tests: a scripted provider for the fake LLM server (by model name), settings
that point the runtime at it, SQL observation in every runtime thread, a small runbook corpus, and a
helper that executes a run to its end."""

from __future__ import annotations

import asyncio
import collections
import gc
import io
import json
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.core.management import call_command
from django.db import OperationalError
from django.db.backends.signals import connection_created

from agent.runtime import db as runtime_db
from agent.runtime.events import Event
from agent.runtime.executor import RunOutcome, execute_run, prepare_run
from agent.runtime.llm import aclose_clients
from tests.fakes.openai_server import HTTPError, stream_answer, stream_tool_calls, usage

ROUTER = "fake-router"
AGENT = "fake-agent"
GUARD = "fake-guard"
EVIDENCE_ID = re.compile(r"kb:[a-z0-9]+(?:[-_][a-z0-9]+)*#[1-9][0-9]*")

CORPUS = {
    "disk-full": """---
title: Disk full on /var/log
tags: [disk, logs, logrotate]
summary: A filesystem fills up because logs under /var/log grow without rotation.
---

## Symptoms

Writes fail with `No space left on device` and `df -h` shows the filesystem at 100 percent.

## Diagnosis

Find the largest log directories with `du -xh --max-depth=1 /var/log | sort -h` and check whether
deleted files are still held open with `lsof +L1`.

## Fix

Truncate the runaway log with `truncate -s 0`, then fix logrotate so the file rotates daily.
""",
    "nginx-502": """---
title: Nginx 502 Bad Gateway
tags: [nginx, 502, upstream]
summary: Nginx answers 502 when its upstream refuses, resets or times out the connection.
---

## Symptoms

Clients see 502 Bad Gateway and the Nginx error log shows `connect() failed (111: Connection refused)`.

## Diagnosis

Check that the upstream service listens on the configured port with `ss -ltnp`.
""",
}


def load_corpus(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for slug, text in CORPUS.items():
        (directory / f"{slug}.md").write_text(text, encoding="utf-8")
    call_command("load_knowledge", str(directory), stdout=io.StringIO())


def use_fake_llm(settings, server, **overrides: Any) -> None:
    """Point the runtime at the fake server with distinct router/agent/guard model names."""
    settings.LLM_PROVIDER = "openai"
    settings.LLM_BASE_URL = server.base_url
    settings.LLM_API_KEY = "sk-test"
    settings.LLM_MODEL = AGENT
    settings.LLM_ROUTER_MODEL = ROUTER
    settings.LLM_GUARD_MODEL = GUARD
    settings.LLM_TIMEOUT_SECONDS = 5
    settings.LLM_MAX_RETRIES = 2
    for key, value in overrides.items():
        setattr(settings, key, value)


Response = Any
Script = Response | Callable[[Any], Response]


class Provider:
    """The fake server's handler: one FIFO script per model name; an entry is a response or a function
    of the request (so an agent can cite the evidence ids the tools really returned)."""

    def __init__(self, server) -> None:
        self.scripts: dict[str, collections.deque] = collections.defaultdict(collections.deque)
        self.requests: dict[str, list] = collections.defaultdict(list)
        server.handler = self

    def add(self, model: str, *entries: Script) -> Provider:
        self.scripts[model].extend(entries)
        return self

    def route(self, intent: str, confidence: float = 0.9, usage: dict | None = None) -> Provider:
        body = json.dumps({"intent": intent, "confidence": confidence, "reason": "scripted"})
        return self.add(ROUTER, stream_answer(body, usage=usage))

    def supported(self, usage: dict | None = None) -> Provider:
        body = json.dumps({"supported": True, "unsupportedClaims": [], "reason": "all claims cited"})
        return self.add(GUARD, stream_answer(body, usage=usage))

    def __call__(self, request):
        self.requests[request.model].append(request)
        queue = self.scripts.get(request.model)
        if not queue:
            return HTTPError(
                500,
                body={"error": {"message": f"unscripted request for {request.model}"}},
                headers={"x-should-retry": "false"},
            )
        entry = queue.popleft()
        return entry(request) if callable(entry) else entry


ROUTER_THINKING = "The user reports a full disk: a symptom, so DIAGNOSIS."
GUARD_THINKING = "The only claim is the du command, which the cited chunk states."
ROUTE = '{"intent": "DIAGNOSIS", "confidence": 0.9, "reason": "symptom"}'
VERDICT = '{"supported": true, "unsupportedClaims": [], "reason": "cited"}'


def script_reasoned_diagnosis(llm: Provider, *, router_first: Response | None = None) -> None:
    """Script one published diagnosis of "Disk full on /var/log" (needs the `corpus`) in which every
    model call returns reasoning but the answer step: the router (`ROUTER_THINKING`), the agent's tool
    step, its answer citing the evidence the tool really returned, and the semantic guard
    (`GUARD_THINKING`), so the run stores four reasoning rows. `router_first`: one more router
    response before the good one (a retried attempt)."""
    if router_first is not None:
        llm.add(ROUTER, router_first)
    llm.add(ROUTER, stream_answer(ROUTE, reasoning=ROUTER_THINKING, usage=usage(40, 10)))
    llm.add(
        AGENT,
        stream_tool_calls(
            [("call_1", "lookup_knowledge", '{"query": "disk full /var/log"}')],
            reasoning="Search the runbooks.",
            usage=usage(200, 20),
        ),
        lambda request: stream_answer(
            f"Find the largest log directories with du [{evidence_ids(request)[0]}].", usage=usage(300, 30)
        ),
    )
    llm.add(GUARD, stream_answer(VERDICT, reasoning=GUARD_THINKING, usage=usage(100, 10)))


def evidence_ids(request) -> list[str]:
    """Evidence ids found in the tool messages of a chat request, in order."""
    ids: list[str] = []
    for message in request.messages:
        if message.get("role") == "tool":
            ids += EVIDENCE_ID.findall(str(message.get("content") or ""))
    return list(dict.fromkeys(ids))


class CollectingSink:
    """Keeps every event a run emits, in order (`events`)."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    async def emit(self, event: Event) -> None:
        self.events.append(event)

    def of_type(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


async def start_run(*, user, query: str, session_id: str | None = None, sink=None, **kwargs: Any):
    """Create the run (and its session if needed) and execute it in a task of the running loop."""
    from agent.runtime.db import db

    run = await db(prepare_run, user=user, query=query, session_id=session_id)
    task = asyncio.create_task(
        execute_run(run_id=run.run_id, sink=sink or CollectingSink(), **kwargs), name=f"run:{run.run_id}"
    )
    return run, task


def execute(run_id: str, **kwargs: Any) -> tuple[RunOutcome, CollectingSink]:
    sink = kwargs.pop("sink", None) or CollectingSink()

    async def main():
        try:
            return await execute_run(run_id=run_id, sink=sink, **kwargs)
        finally:
            await aclose_clients()

    return asyncio.run(main()), sink


def ask(user, query: str, *, session_id: str | None = None, **kwargs: Any):
    run = prepare_run(user=user, query=query, session_id=session_id)
    outcome, sink = execute(run.run_id, **kwargs)
    run.refresh_from_db()
    return run, outcome, sink


# -------------------------------------------------------------------------------------------------
# SQL in every runtime thread
# -------------------------------------------------------------------------------------------------
@contextmanager
def in_every_runtime_thread(wrapper):
    """Install a Django execute wrapper on every database connection the runtime's pool threads open
    (the pools are restarted so that each thread opens a fresh connection)."""
    runtime_db.shutdown_pools()

    def attach(sender, connection, **kwargs):
        if (
            threading.current_thread().name.startswith("runtime-")
            and wrapper not in connection.execute_wrappers
        ):
            connection.execute_wrappers.append(wrapper)

    connection_created.connect(attach)
    try:
        yield wrapper
    finally:
        connection_created.disconnect(attach)
        runtime_db.shutdown_pools()


class SqlLog:
    """Records every statement (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.statements: list[str] = []

    def __call__(self, execute, sql, params, many, context):
        with self.lock:
            self.statements.append(sql)
        return execute(sql, params, many, context)

    def count(self, pattern: str = "") -> int:
        with self.lock:
            return sum(1 for s in self.statements if pattern.lower() in s.lower())


class FailInserts:
    """Rejects the first `times` INSERTs into `table` as a database that refuses the write would (a
    table full: not a lost connection, which the recorder retries once; see `audit.write.rows`)."""

    def __init__(self, table: str, times: int) -> None:
        self.table, self.times, self.fired = table, times, 0
        self.lock = threading.Lock()

    def __call__(self, execute, sql, params, many, context):
        if sql.lstrip().upper().startswith("INSERT") and self.table in sql:
            with self.lock:
                fire = self.fired < self.times
                self.fired += fire
            if fire:
                raise OperationalError(1114, "The table is full")
        return execute(sql, params, many, context)


@contextmanager
def cycles_left() -> Iterator[set[type]]:
    """The types of the objects the block left in reference cycles (only a full collection frees them):
    the collector waits during the block, then one collection keeps what it would free in `gc.garbage`
    to be looked at. The set is filled when the block ends."""
    found: set[type] = set()
    gc.collect()
    gc.disable()
    try:
        yield found
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        found.update(type(o) for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
