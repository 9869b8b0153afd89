"""B3's floor: the bare `openai` SDK consuming a run's streams, N runs at once in one process.

A run here is what the runtime asks the provider for, with nothing around it: the router call, the
agent's tool call, the agent's answer after a tool result that carries an evidence id, the guard call
over that answer — each one `AsyncOpenAI().chat.completions.create(stream=True,
stream_options={"include_usage": True})` iterated to its end, the text (or the tool call's arguments)
joined. The fake provider (`bench.provider`, the same process and profile the runtime's runs meet)
answers these requests with exactly the streams it sends the runtime: the same models, the same
chunks, the same pacing. The messages have the runtime's shape and about its size (a system prompt, the
user's question, a tool definition, the tool result) so that request building costs what it costs there.

It runs in its own process (`python -m bench.b3_floor`), so that its CPU time (`/proc/self/stat`,
user + system, every thread) is the SDK's and the event loop's alone; it prints one JSON line with the
CPU per run, the chunks per run and the extra delay per answer chunk (receive − the provider's send time).
The module imports neither Django nor the project: it is the floor.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from pathlib import Path

STAMP = re.compile(r"<(\d{16,20})>")
SYSTEM = (
    "You are a database reliability assistant. Answer the operator's question about MySQL/MariaDB "
    "operations using only evidence returned by your tools, and cite every claim with the evidence id "
    "in brackets. " * 8
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup_knowledge",
            "description": "Search the runbooks and knowledge base; returns passages with evidence ids.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "description": "what to look for"}},
                "required": ["query"],
                "additionalProperties": False,
            },
        },
    }
]
TOOL_RESULT = json.dumps(
    {
        "results": [
            {
                "evidenceId": "kb:mysql-replication-lag#1",
                "title": "Replication lag",
                "text": "Check the SQL thread, long transactions and the relay log position. " * 6,
            }
        ]
    }
)


def cpu_seconds() -> float:
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Counts:
    def __init__(self) -> None:
        self.chunks = 0
        self.delays: list[float] = []


async def _consume(client, counts: Counts, *, stamps: bool = False, **params) -> tuple[str, str]:
    """One streamed call to its end: (text, tool-call arguments)."""
    stream = await client.chat.completions.create(
        stream=True, stream_options={"include_usage": True}, **params
    )
    text: list[str] = []
    args: list[str] = []
    async for chunk in stream:
        counts.chunks += 1
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if delta.content:
            text.append(delta.content)
            if stamps:
                now = time.time_ns()
                counts.delays.extend((now - int(s)) / 1e6 for s in STAMP.findall(delta.content))
        for call in delta.tool_calls or ():
            if call.function and call.function.arguments:
                args.append(call.function.arguments)
    return "".join(text), "".join(args)


async def one_run(client, counts: Counts, query: str) -> None:
    user = {"role": "user", "content": query}
    await _consume(
        client, counts, model="bench-router", messages=[{"role": "system", "content": SYSTEM[:600]}, user]
    )
    base = [{"role": "system", "content": SYSTEM}, user]
    _, args = await _consume(client, counts, model="bench-agent", messages=base, tools=TOOLS)
    json.loads(args)
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup_knowledge", "arguments": args}}
    answer, _ = await _consume(
        client,
        counts,
        stamps=True,
        model="bench-agent",
        messages=[
            *base,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": TOOL_RESULT},
        ],
        tools=TOOLS,
    )
    guard_user = json.dumps({"answer": answer, "evidence": [json.loads(TOOL_RESULT)["results"][0]]})
    verdict, _ = await _consume(
        client,
        counts,
        model="bench-guard",
        messages=[{"role": "system", "content": SYSTEM[:400]}, {"role": "user", "content": guard_user}],
    )
    if not json.loads(verdict)["supported"]:
        raise RuntimeError("the provider's guard did not answer `supported`")


async def batches(base_url: str, runs: int, reps: int, query: str, http_client: str = "httpx") -> list[dict]:
    """`reps` batches of `runs` runs at once on one client (connections pooled, as the runtime's), sent
    with the SDK's default HTTP client (`httpx`) or its aiohttp transport (`aiohttp`, what the runtime
    uses by default: `LLM_HTTP_CLIENT`)."""
    import openai

    extra = {"http_client": openai.DefaultAioHttpClient(timeout=300.0)} if http_client == "aiohttp" else {}
    client = openai.AsyncOpenAI(base_url=base_url, api_key="bench-key", max_retries=0, timeout=300.0, **extra)
    await one_run(client, Counts(), query)  # warm-up: imports, the pool's first connection
    out = []
    for _ in range(reps):
        counts = Counts()
        cpu0, wall0 = cpu_seconds(), time.perf_counter()
        await asyncio.gather(*(one_run(client, counts, query) for _ in range(runs)))
        out.append(
            {
                "runs": runs,
                "cpu_s": cpu_seconds() - cpu0,
                "wall_s": time.perf_counter() - wall0,
                "chunks": counts.chunks,
                "delays": sorted(counts.delays),
            }
        )
    await client.close()
    return out


def main(argv: list[str]) -> None:
    """`python -m bench.b3_floor --base-url URL --runs N --reps R [--profile NAME] [--http-client
    httpx|aiohttp]`: one JSON line
    `{"batches": [...]}` on standard output."""
    p = argparse.ArgumentParser(prog="python -m bench.b3_floor")
    p.add_argument("--base-url", required=True)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--profile", default="chat")
    p.add_argument("--http-client", choices=("httpx", "aiohttp"), default="httpx")
    args = p.parse_args(argv)
    query = f"Why is MySQL replication lagging on the replica? bench-profile={args.profile}"
    done = asyncio.run(batches(args.base_url, args.runs, args.reps, query, args.http_client))
    print(json.dumps({"batches": done}))


if __name__ == "__main__":
    main(sys.argv[1:])
