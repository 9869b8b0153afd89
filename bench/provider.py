"""A scripted provider for the local fake LLM server (`tests/fakes/openai_server.py`), shared by B3/B4.

It answers the runtime's three roles by model name, like a real OpenAI-compatible provider: the router
with an intent, the agent first with one `lookup_knowledge` tool call and, once the tool result is in the
conversation, with an answer citing the first evidence id the tool returned (streamed in `pieces` deltas
`chunk_interval` seconds apart), the guard with "supported". `call_seconds` is how long every model call
takes at the provider (the first byte is held back so that the whole call lasts that long).
"""

from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import dataclass, field

from tests.fakes.openai_server import (
    FakeLLMServer,
    Stream,
    finish_chunk,
    text_chunks,
    tool_call_chunks,
    usage,
)

ROUTER, AGENT, GUARD = "bench-router", "bench-agent", "bench-guard"
EVIDENCE_ID = re.compile(r"kb:[a-z0-9]+(?:[-_][a-z0-9]+)*#[1-9][0-9]*")


STAMP = "<@@T@@>"


class StampingServer(FakeLLMServer):
    """The fake server, writing the wall-clock time (ns) of the moment a chunk is sent into every
    `STAMP` marker of that chunk, so that a client can tell how long the chunk took to reach it."""

    @staticmethod
    def _encode_event(item, ctx) -> bytes:
        data = FakeLLMServer._encode_event(item, ctx)
        return data.replace(STAMP.encode(), f"<{time.time_ns()}>".encode())


@dataclass
class BenchProvider:
    call_seconds: float = 0.3
    chunk_interval: float = 0.02
    pieces: int = 8
    stamp: bool = False
    calls: list[str] = field(default_factory=list)

    def settings(self, base_url: str) -> dict:
        return {
            "LLM_PROVIDER": "openai",
            "LLM_BASE_URL": base_url,
            "LLM_API_KEY": "bench-key",
            "LLM_MODEL": AGENT,
            "LLM_ROUTER_MODEL": ROUTER,
            "LLM_GUARD_MODEL": GUARD,
            "LLM_MAX_RETRIES": 0,
            "LLM_TIMEOUT_SECONDS": 30.0,
        }

    def env(self, base_url: str) -> dict[str, str]:
        return {k: str(v) for k, v in self.settings(base_url).items()}

    def _stream(self, chunks: list, *, prompt: int, completion: int, interval: float = 0.0) -> Stream:
        first = max(0.0, self.call_seconds - interval * (len(chunks) - 1))
        return Stream(
            chunks=chunks,
            first_delay=first,
            delay=interval,
            usage=usage(prompt, completion),
            usage_if_requested=True,
        )

    def __call__(self, request):
        model = request.model
        if model == ROUTER:
            self.calls.append("router")
            body = json.dumps({"intent": "DIAGNOSIS", "confidence": 0.9, "reason": "replication symptom"})
            return self._stream([*text_chunks(body, 2), finish_chunk("stop")], prompt=120, completion=20)
        if model == GUARD:
            self.calls.append("guard")
            body = json.dumps({"supported": True, "unsupportedClaims": [], "reason": "all claims cited"})
            return self._stream([*text_chunks(body, 2), finish_chunk("stop")], prompt=600, completion=25)
        messages = request.messages
        if not any(m.get("role") == "tool" for m in messages):
            self.calls.append("agent-tools")
            args = json.dumps({"query": "mysql replication lag long transaction"})
            chunks = [
                *tool_call_chunks([(f"call_{len(self.calls)}", "lookup_knowledge", args)]),
                finish_chunk("tool_calls"),
            ]
            return self._stream(chunks, prompt=800, completion=40)
        self.calls.append("agent-answer")
        tool_text = " ".join(str(m.get("content") or "") for m in messages if m.get("role") == "tool")
        found = EVIDENCE_ID.search(tool_text)
        cite = f" [{found.group(0)}]" if found else ""
        text = (
            f"Check the replica's SQL thread and long-running transactions first.{cite} "
            f"Then compare the relay log position with the source's binary log position.{cite}"
        )
        if self.stamp:
            # One chunk per piece, each carrying a send-time stamp (the citation stays intact).
            pieces = [text] + [f" {STAMP}" for _ in range(self.pieces - 1)]
            pieces[0] = f"{STAMP} {text}"
            chunks = [c for i, piece in enumerate(pieces) for c in text_chunks(piece, 1, role=i == 0)]
            return self._stream(
                [*chunks, finish_chunk("stop")], prompt=1500, completion=90, interval=self.chunk_interval
            )
        chunks = [*text_chunks(text, self.pieces), finish_chunk("stop")]
        return self._stream(chunks, prompt=1500, completion=90, interval=self.chunk_interval)


def main(argv: list[str]) -> None:
    """`python -m bench.provider CALL_SECONDS CHUNK_INTERVAL PIECES`: serve the stamping provider on an
    OS-chosen port of 127.0.0.1, print `PORT <n>`, and stop when standard input closes."""
    call_seconds, interval, pieces = float(argv[0]), float(argv[1]), int(argv[2])
    provider = BenchProvider(call_seconds=call_seconds, chunk_interval=interval, pieces=pieces, stamp=True)
    with StampingServer(handler=provider) as server:
        print(f"PORT {server.port}", flush=True)
        sys.stdin.read()
        if server.errors:
            print(f"ERRORS {len(server.errors)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
