"""A scripted provider for the local fake LLM server (`tests/fakes/openai_server.py`), shared by B3/B4.

It answers the runtime's three roles by model name, like a real OpenAI-compatible provider: the router
with an intent, the agent first with one `lookup_knowledge` tool call and, once the tool result is in the
conversation, with an answer citing the first evidence id the tool returned (streamed in `pieces` deltas
`chunk_interval` seconds apart), the guard with "supported". `call_seconds` is how long every model call
takes at the provider (the first byte is held back so that the whole call lasts that long).

B3 paces the streams by a *profile* (`PROFILES`): **chat**, what a user meets — every one of a run's 4
model calls streams 300 output tokens, one token per chunk, at 50 chunks/s per stream (a call lasts ≈ 6 s,
a run ≈ 25 s); **short**, the bench's earlier pacing — the answer in 20 chunks 20 ms apart, the other
calls in 2–3 chunks at once (a run lasts ≈ 0.8 s). A request may ask for another profile than the
provider's default with `bench-profile=NAME` in any message (the bench's query carries it; the answer
repeats it so that the guard's request carries it too).

With `stamp`, every answer chunk carries the wall-clock time (ns) at which the provider *sent* it, and
the guard's last chunk the time it was sent; the provider prints `GUARD <answer's last stamp>
<guard request received ns> <guard's last chunk sent ns>` for every guard call, so that the bench can
take the guard's own model time out of a run's release latency.
"""

from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import dataclass, field

from bench.stats import harness_uncollected
from diagnosis.evidence import ID_RE, RUNBOOK_CHUNK
from tests.fakes.openai_server import (
    FakeLLMServer,
    Stream,
    finish_chunk,
    text_chunks,
    tool_call_chunks,
    usage,
)

ROUTER, AGENT, GUARD = "bench-router", "bench-agent", "bench-guard"
EVIDENCE_ID = re.compile(RUNBOOK_CHUNK.pattern)


STAMP = "<@@T@@>"
SENT = re.compile(r"<(\d{16,20})>")
GUARD_MARK = re.compile(rb"<@@G(\d+):(\d+)@@>")
PROFILE_ASKED = re.compile(r"bench-profile=([a-z]+)")


@dataclass(frozen=True)
class Profile:
    """How the provider paces a run's streams. `tokens`: chunks of the answer (and, when `every_call`,
    of every other call too: router, tool call, guard); `interval`: seconds between two chunks of a
    stream; `first`: seconds before a stream's first chunk."""

    name: str
    tokens: int
    interval: float
    first: float
    every_call: bool

    @property
    def run_seconds(self) -> float:
        """How long a run's 4 model calls last at the provider (the runtime's own work comes on top)."""
        paced = self.first + self.interval * self.tokens
        return 4 * paced if self.every_call else 3 * self.first + paced

    def scaled(self, *, tokens: int | None = None, interval: float | None = None) -> Profile:
        return Profile(
            self.name,
            tokens or self.tokens,
            self.interval if interval is None else interval,
            self.first,
            self.every_call,
        )


PROFILES = {
    "chat": Profile("chat", tokens=300, interval=0.02, first=0.1, every_call=True),
    "short": Profile("short", tokens=20, interval=0.02, first=0.02, every_call=False),
}


class StampingServer(FakeLLMServer):
    """The fake server, writing the wall-clock time (ns) of the moment a chunk is sent into every
    `STAMP` marker of that chunk, so that a client can tell how long the chunk took to reach it, and
    printing the send time of every guard call's last chunk (its `GUARD_MARK`)."""

    @staticmethod
    def _encode_event(item, ctx) -> bytes:
        data = FakeLLMServer._encode_event(item, ctx)
        now = time.time_ns()
        found = GUARD_MARK.search(data)
        if found:
            print(f"GUARD {int(found.group(1))} {int(found.group(2))} {now}", flush=True)
            data = data[: found.start()] + f"<{now}>".encode() + data[found.end() :]
        return data.replace(STAMP.encode(), f"<{now}>".encode())


@dataclass
class BenchProvider:
    call_seconds: float = 0.3
    chunk_interval: float = 0.02
    pieces: int = 8
    stamp: bool = False
    profile: Profile | None = None
    calls: list[str] = field(default_factory=list)
    # The agent's one tool call of the unpaced shape (B10 calls an MCP tool instead): name, arguments.
    tool: str = "lookup_knowledge"
    tool_arguments: dict = field(default_factory=lambda: {"query": "mysql replication lag long transaction"})

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
        if self.profile is not None:
            return self._paced(request)
        return self._legacy(request)

    def _legacy(self, request):
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
            args = json.dumps(self.tool_arguments)
            chunks = [
                *tool_call_chunks([(f"call_{len(self.calls)}", self.tool, args)]),
                finish_chunk("tool_calls"),
            ]
            return self._stream(chunks, prompt=800, completion=40)
        self.calls.append("agent-answer")
        tool_text = " ".join(str(m.get("content") or "") for m in messages if m.get("role") == "tool")
        found = (EVIDENCE_ID if self.tool == "lookup_knowledge" else ID_RE).search(tool_text)
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

    # ---------------------------------------------------------------------------------------------
    # Paced by a profile (B3)
    # ---------------------------------------------------------------------------------------------
    def profile_of(self, messages) -> Profile:
        for m in messages:
            found = PROFILE_ASKED.search(str(m.get("content") or ""))
            if found and found.group(1) in PROFILES:
                asked = PROFILES[found.group(1)]
                if asked.name == self.profile.name:
                    return self.profile
                return asked
        return self.profile

    def _paced_stream(
        self, chunks: list, profile: Profile, *, prompt: int, completion: int, paced: bool = True
    ) -> Stream:
        """`chunks` after `profile.first`, `profile.interval` apart (`paced`) or all at once. The last
        chunk (the finish reason) and the usage chunk follow the last token at once, as a real provider
        sends them: pacing them too put two intervals (40 ms on the chat profile) between the guard's
        last token and the end of its call, which B3 counted as release overhead."""
        return Stream(
            chunks=chunks,
            first_delay=profile.first,
            delay=profile.interval if paced else 0.0,
            usage=usage(prompt, completion),
            usage_if_requested=True,
            paced_events=len(chunks) - 1,
        )

    def _paced(self, request):
        """The runtime's three roles, each call streamed at `profile`'s pace (see the module's text)."""
        received = time.time_ns()
        messages = request.messages
        profile = self.profile_of(messages)
        n = profile.tokens if profile.every_call else None
        model = request.model
        if model == ROUTER:
            self.calls.append("router")
            body = {"intent": "DIAGNOSIS", "confidence": 0.9, "reason": "replication symptom"}
            if n:
                body["reason"] += " and a lagging replica" * (n // 20 + 1)
            chunks = text_chunks(json.dumps(body), n or 2)
            return self._paced_stream(
                [*chunks, finish_chunk("stop")], profile, prompt=120, completion=n or 20, paced=bool(n)
            )
        if model == GUARD:
            self.calls.append("guard")
            answer = " ".join(str(m.get("content") or "") for m in messages)
            last = max((int(s) for s in SENT.findall(answer)), default=0)
            reason = "all claims cited" + (" by the evidence returned" * (n // 20 + 1) if n else "")
            mark = f"<@@G{last}:{received}@@>" if self.stamp else ""
            body = json.dumps({"supported": True, "unsupportedClaims": [], "reason": reason + mark})
            head, _, tail = body.partition(mark) if mark else (body, "", "")
            pieces = [*_pieces(head, (n or 2) - (1 if mark else 0)), *([mark + tail] if mark else [])]
            chunks = [c for i, p in enumerate(pieces) for c in text_chunks(p, 1, role=i == 0)]
            return self._paced_stream(
                [*chunks, finish_chunk("stop")], profile, prompt=600, completion=n or 25, paced=bool(n)
            )
        if not any(m.get("role") == "tool" for m in messages):
            self.calls.append("agent-tools")
            args = json.dumps({"query": "mysql replication lag long transaction"})
            if n:  # one token per chunk: the arguments padded with JSON whitespace to `n` fragments
                args = "{" + " " * max(0, n - len(args)) + args[1:]
            chunks = [
                *tool_call_chunks([(f"call_{len(self.calls)}", "lookup_knowledge", args)], fragments=n or 3),
                finish_chunk("tool_calls"),
            ]
            return self._paced_stream(chunks, profile, prompt=800, completion=n or 40, paced=bool(n))
        self.calls.append("agent-answer")
        tool_text = " ".join(str(m.get("content") or "") for m in messages if m.get("role") == "tool")
        found = (EVIDENCE_ID if self.tool == "lookup_knowledge" else ID_RE).search(tool_text)
        cite = f" [{found.group(0)}]" if found else ""
        text = (
            f"Check the replica's SQL thread and long-running transactions first.{cite} "
            f"Then compare the relay log position with the source's binary log position.{cite} "
            f"(bench-profile={profile.name})"
        )
        mark = STAMP if self.stamp else ""
        pieces = [f"{mark} {text}"] + [f" {mark or 'token'}" for _ in range(profile.tokens - 1)]
        chunks = [c for i, piece in enumerate(pieces) for c in text_chunks(piece, 1, role=i == 0)]
        return self._paced_stream(
            [*chunks, finish_chunk("stop")], profile, prompt=1500, completion=profile.tokens
        )


def _pieces(text: str, n: int) -> list[str]:
    """`text` in `n` near-equal pieces (fewer when it is shorter than `n` characters)."""
    n = max(1, min(n, len(text)))
    size, extra = divmod(len(text), n)
    out, pos = [], 0
    for i in range(n):
        step = size + (1 if i < extra else 0)
        out.append(text[pos : pos + step])
        pos += step
    return out


def main(argv: list[str]) -> None:
    """`python -m bench.provider [--profile chat|short] [--tokens N] [--interval S]`: serve the stamping
    provider paced by the profile (`--tokens`/`--interval` shrink it for smoke runs) on an OS-chosen
    port of 127.0.0.1, print `PORT <n>`, and stop when standard input closes.

    The earlier form `python -m bench.provider CALL_SECONDS CHUNK_INTERVAL PIECES [TOOL ARGUMENTS_JSON]`
    serves the unpaced stamping provider (B4/B7's shape; the agent's tool call `TOOL`, default
    `lookup_knowledge`)."""
    import argparse

    if argv and not argv[0].startswith("--"):
        call_seconds, interval, pieces = float(argv[0]), float(argv[1]), int(argv[2])
        provider = BenchProvider(
            call_seconds=call_seconds, chunk_interval=interval, pieces=pieces, stamp=True
        )
        if len(argv) > 3:
            provider.tool, provider.tool_arguments = argv[3], json.loads(argv[4])
    else:
        p = argparse.ArgumentParser(prog="python -m bench.provider")
        p.add_argument("--profile", default="chat", choices=sorted(PROFILES))
        p.add_argument("--tokens", type=int, default=None)
        p.add_argument("--interval", type=float, default=None)
        args = p.parse_args(argv)
        profile = PROFILES[args.profile].scaled(tokens=args.tokens, interval=args.interval)
        provider = BenchProvider(stamp=True, profile=profile)
    with StampingServer(handler=provider) as server, harness_uncollected():
        print(f"PORT {server.port}", flush=True)
        sys.stdin.read()
        if server.errors:
            print(f"ERRORS {len(server.errors)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
