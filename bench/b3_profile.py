"""B3 profile — where one daphne process's CPU goes per run under N concurrent chats (issue 19, item 1).

The B3 harness (`bench.b3_live`: the fake provider, one daphne on the bench database, N WebSocket
clients) with `py-spy` attached to the daphne process while a level runs (`--gil`: only the thread
holding the GIL is sampled, so the samples partition the process's Python CPU; `--nonblocking`: the
process is not paused to sample). The process's CPU time (user + system, `/proc/<pid>/stat`) over the
level, divided by the runs, is the CPU per run; each sample's stack is put in the first category found
walking from the innermost frame outwards (a `json` frame under the recorder counts as recorder), and
the category's share of samples times the CPU per run is its cost per run.

    python -m bench --only b3p            # draft and verified release at 50 and 200 chats

Needs `py-spy` (requirements-dev.txt); skipped with a note when it is absent.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from bench import b3_live

# Categories a sample belongs to when any frame of its stack matches (in this order): the work that
# owns everything beneath it.
OWNERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("knowledge search", ("/agent/knowledge/", "/tools/lookup_knowledge.py")),
    ("recorder (audit rows, chain, digests, encryption, its SQL)", ("/audit/", "/reasoning/")),
    ("model SDK", ("/openai/",)),
)
# Otherwise the first of these that a frame matches, innermost frame first.
LEAFWARD: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Redis channel layer (channels_redis, redis-py, msgpack)", ("/channels_redis/", "/redis/", "/msgpack/")),
    (
        "model SDK",
        (
            "/httpx",
            "/httpcore",
            "/h11/",
            "/aiohttp/",
            "/multidict/",
            "/yarl/",
            "/pydantic/",
            "/pydantic_core/",
            "/anyio/",
        ),
    ),
    (
        "frames, consumer and channel layer",
        (
            "/channels/",
            "/daphne/",
            "/autobahn/",
            "/twisted/",
            "/txaio/",
            "/surfaces/chat/",
            "/runtime/live.py",
            "/runtime/events.py",
        ),
    ),
    (
        "other database work (token auth, lockout, run setup)",
        ("/MySQLdb/", "/django/db/", "/axes/", "/access/"),
    ),
    (
        "thread-pool hops",
        (
            "/concurrent/futures/",
            "/asgiref/",
            "/threading.py",
            "/runtime/db.py",
            "/queue.py",
            "/audit/write/group_commit.py",  # only the `Bridged` frames reach here (see `categorise`)
        ),
    ),
    ("runtime (router, agent loop, guards, release)", ("/diagnosis/",)),
    ("event loop", ("/asyncio/", "/selectors.py")),
)
SDK_PARSING = ("/openai/_streaming.py", "/openai/lib/streaming/")
BRIDGE_FRAMES = ("Bridged.",)
PY_SPY = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))


def available() -> bool:
    return Path(PY_SPY).exists()


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _frames(line: str) -> tuple[list[str], int]:
    stack, _, count = line.rpartition(" ")
    return stack.split(";"), int(count)


def _path(frame: str) -> str:
    """`/path/of/file.py` of a py-spy frame `function (path/of/file.py:line)`."""
    inner = frame[frame.rfind("(") + 1 :]
    return "/" + inner.rsplit(":", 1)[0].lstrip("/")


def categorise(raw: str) -> tuple[Counter, Counter, int]:
    """(samples per category, innermost functions of the uncategorised samples, total samples) of
    py-spy's raw (collapsed) output."""
    per: Counter = Counter()
    other: Counter = Counter()
    total = 0
    for line in raw.splitlines():
        if not line.strip():
            continue
        frames, count = _frames(line)
        total += count
        paths = [_path(f) for f in frames]
        # Every job of the runtime's database pool runs inside a `Bridged` greenlet
        # (audit/write/group_commit.py): that frame is the pool's transport, not recorder work, so it owns
        # nothing.
        owners = [p for f, p in zip(frames, paths, strict=True) if not f.startswith(BRIDGE_FRAMES)]
        found = next((n for n, frags in OWNERS if any(f in p for p in owners for f in frags)), None)
        if found is None:
            for p in reversed(paths):
                found = next((n for n, frags in LEAFWARD if any(f in p for f in frags)), None)
                if found:
                    break
        if found is None:
            per["other (interpreter, stdlib outside the above)"] += count
            other[frames[-1]] += count
            continue
        if found == "model SDK":
            parsing = any(f in p for p in paths for f in SDK_PARSING)
            found = "model SDK: stream (chunk) parsing" if parsing else "model SDK: request building and HTTP"
        per[found] += count
    return per, other, total


def profile_level(url: str, tokens: list[str], pid: int, out: Path, rate: int = 200) -> dict:
    spy = subprocess.Popen(
        [
            PY_SPY,
            "record",
            "-p",
            str(pid),
            "--gil",
            "--nonblocking",
            "-r",
            str(rate),
            "-f",
            "raw",
            "-o",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    time.sleep(1.0)  # py-spy attached
    cpu0 = _cpu_seconds(pid)
    delays, outs, wall = asyncio.run(b3_live._level(url, tokens))
    cpu = _cpu_seconds(pid) - cpu0
    spy.send_signal(signal.SIGINT)
    try:
        spy.wait(30)
    except subprocess.TimeoutExpired:
        spy.kill()
        spy.wait(10)
    raw = out.read_text() if out.exists() else ""
    per, other, total = categorise(raw)
    runs = [o for o in outs if "run_id" in o]
    return {
        "chats": len(tokens),
        "runs": len(runs),
        "succeeded": sum(1 for o in outs if o.get("status") == "SUCCESS"),
        "cpu_s": cpu,
        "wall_s": wall,
        "cpu_ms_per_run": cpu * 1e3 / max(1, len(runs)),
        "samples": total,
        "categories": per,
        "other_top": other.most_common(8),
        "draft_frames": len(delays),
    }


@b3_live.on_own_database
def run_all(
    *,
    levels: tuple[int, ...] = (50, 200),
    modes=("draft", "verified"),
    extra: dict[str, str] | None = None,
    chat: bool = False,
    log=print,
) -> dict:
    """Profiles of each release mode at each level (`extra`: more settings of the daphne, e.g.
    `REDIS_URL`; `chat`: the provider paced by the chat profile, ≈ 25 s runs, instead of the short
    one); evidence for docs/performance.md."""
    from bench.b4_loop import load_runbooks

    if not available():
        log("  B3 profile skipped: py-spy is not installed (requirements-dev.txt)")
        return {}
    logs = b3_live.ROOT / "test-artifacts"
    logs.mkdir(exist_ok=True)
    load_runbooks()
    tokens = b3_live.users_with_tokens(max(levels))
    if chat:
        from bench import b3_chat

        provider, pport = b3_chat.start_provider(logs)
        extra = {"LLM_TIMEOUT_SECONDS": "300", **(extra or {})}
    else:
        provider, pport = b3_live.start_provider(0.02, 20, logs)
    evidence: dict = {}
    try:
        for mode in modes:
            daphne, dport = b3_live.start_daphne(pport, logs, {"CHAT_RELEASE": mode, **(extra or {})})
            try:
                url = f"ws://127.0.0.1:{dport}/ws/chat/"
                asyncio.run(b3_live._level(url, tokens[:2]))  # warm-up
                for n in levels:
                    e = profile_level(url, tokens[:n], daphne.proc.pid, logs / f"b3-profile-{mode}-{n}.txt")
                    evidence[(mode, n)] = e
                    log(f"  B3 profile {mode} {n} chats: {format_level(e)}")
            finally:
                daphne.stop()
    finally:
        provider.stop()
    return evidence


def format_level(e: dict) -> str:
    total = max(1, e["samples"])
    parts = [
        f"{name} {count / total * e['cpu_ms_per_run']:.1f} ms ({count / total:.0%})"
        for name, count in e["categories"].most_common()
    ]
    return (
        f"{e['succeeded']}/{e['chats']} SUCCESS, {e['cpu_ms_per_run']:.1f} ms CPU per run "
        f"({e['cpu_s']:.1f} s CPU in {e['wall_s']:.1f} s wall, {e['samples']} samples): "
        + "; ".join(parts)
        + "; other, innermost: "
        + ", ".join(f"{f} {c}" for f, c in e["other_top"][:5])
    )


def markdown(evidence: dict) -> str:
    if not evidence:
        return "(not run: py-spy absent)"
    names: list[str] = []
    for e in evidence.values():
        for name, _ in e["categories"].most_common():
            if name not in names:
                names.append(name)
    keys = list(evidence)
    head = "| CPU per run (ms, share) | " + " | ".join(f"{m} {n} chats" for m, n in keys) + " |"
    out = [head, "|---|" + "---|" * len(keys)]
    out.append(
        "| **total CPU per run** | "
        + " | ".join(f"**{evidence[k]['cpu_ms_per_run']:.1f}**" for k in keys)
        + " |"
    )
    for name in names:
        cells = []
        for k in keys:
            e = evidence[k]
            share = e["categories"].get(name, 0) / max(1, e["samples"])
            cells.append(f"{share * e['cpu_ms_per_run']:.1f} ({share:.0%})")
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    out.append(
        "| runs SUCCESS; CPU s in wall s; samples | "
        + " | ".join(
            f"{evidence[k]['succeeded']}/{evidence[k]['chats']}; {evidence[k]['cpu_s']:.1f} in "
            f"{evidence[k]['wall_s']:.1f}; {evidence[k]['samples']}"
            for k in keys
        )
        + " |"
    )
    return "\n".join(out)
