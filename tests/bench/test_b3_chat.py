"""B3 on the chat profile (issue 36) at smoke size: the provider's pacing profiles, the bare-SDK floor,
the cost split, the ramp's figures and the report rows. The bench measures; these tests assert only that
each piece produces sane numbers from real streams (the fake provider, the real `openai` SDK, and on
MariaDB the real runtime behind a real daphne), never a wall time."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import re
import statistics
import time

import pytest

from bench import b3_chat, b3_floor
from bench.provider import PROFILES, BenchProvider, StampingServer

SENT = re.compile(r"<(\d{16,20})>")


def _guard_lines(text: str) -> list[list[int]]:
    return [[int(x) for x in line.split()[1:]] for line in text.splitlines() if line.startswith("GUARD ")]


def test_the_chat_profile_is_four_calls_of_300_tokens_at_50_per_second():
    chat, short = PROFILES["chat"], PROFILES["short"]
    assert (chat.tokens, chat.interval, chat.every_call) == (300, 0.02, True)
    assert 24.0 <= chat.run_seconds <= 26.0  # 4 × (0.1 s to the first token + 300 × 20 ms)
    assert (short.tokens, short.every_call) == (20, False) and short.run_seconds < 1.0


def test_the_provider_paces_every_call_of_a_run_one_token_per_chunk(capsys):
    """At smoke size (60 tokens at 200/s): every call of a run through the real SDK streams 60 chunks
    (+ finish, + usage), the answer's chunks carry their send times `interval` apart, and the guard's
    last chunk is printed with the answer's last stamp as its key."""
    profile = PROFILES["chat"].scaled(tokens=60, interval=0.005)
    with StampingServer(handler=BenchProvider(stamp=True, profile=profile)) as server:
        url = f"http://127.0.0.1:{server.port}/v1"
        batch = asyncio.run(b3_floor.batches(url, runs=2, reps=1, query="why is replication lagging?"))[0]
        assert server.errors == []
    assert batch["chunks"] == 2 * 4 * (60 + 2)
    assert len(batch["delays"]) == 2 * 60 and all(d >= 0 for d in batch["delays"])
    guards = _guard_lines(capsys.readouterr().out)
    # The warm-up run and the batch's two runs each made one guard call.
    assert len(guards) == 3
    for key, received, sent in guards:
        assert key < received < sent  # the answer ended, then the guard was asked, then it answered
        assert (sent - received) / 1e6 >= 60 * 5 * 0.9  # its 60 tokens were paced, not sent at once


def test_the_answer_chunks_are_sent_at_the_profiles_rate():
    profile = PROFILES["chat"].scaled(tokens=40, interval=0.01)
    with StampingServer(handler=BenchProvider(stamp=True, profile=profile)) as server:
        from openai import OpenAI

        client = OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="k", max_retries=0)
        stream = client.chat.completions.create(
            model="bench-agent",
            stream=True,
            messages=[
                {"role": "user", "content": "q"},
                {"role": "tool", "tool_call_id": "c", "content": "kb:mysql-replication-lag#1"},
            ],
        )
        pieces = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
    assert len(pieces) == 40
    stamps = [int(SENT.search(p).group(1)) for p in pieces]
    gaps = [(b - a) / 1e6 for a, b in itertools.pairwise(stamps)]
    assert 9.0 <= statistics.median(gaps) <= 30.0  # 10 ms apart, give or take the loop's scheduling
    assert "[kb:mysql-replication-lag#1]" in pieces[0] and "bench-profile=chat" in pieces[0]


def test_a_request_may_ask_for_the_short_profile():
    provider = BenchProvider(stamp=True, profile=PROFILES["chat"])

    class Request:
        model = "bench-router"
        messages = [{"role": "user", "content": "why? bench-profile=short"}]

    stream = provider(Request())
    assert len(stream.chunks) == 3 and stream.delay == 0.0  # 2 pieces + finish, at once (today's)
    Request.messages = [{"role": "user", "content": "why?"}]
    paced = provider(Request())
    assert len(paced.chunks) == 301 and paced.delay == 0.02
    assert paced.paced_events == 300  # the finish reason (and usage) follow the last token at once


def test_the_finish_reason_and_usage_follow_the_last_token_at_once():
    """A real provider ends a stream right after its last token; the paced provider did not (its finish
    and usage chunks waited an interval each, counted by B3 as the runtime's release overhead). With
    0.5 s between tokens, the stream's end comes well within one interval of its last token."""
    profile = PROFILES["chat"].scaled(tokens=2, interval=0.5)
    with StampingServer(handler=BenchProvider(stamp=True, profile=profile)) as server:
        from openai import OpenAI

        client = OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="k", max_retries=0)
        stream = client.chat.completions.create(
            model="bench-router",
            stream=True,
            stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "q"}],
        )
        arrivals = [(time.monotonic(), chunk) for chunk in stream]
        ended = time.monotonic()
    tokens = [t for t, c in arrivals if c.choices and c.choices[0].delta.content]
    assert len(tokens) == 2 and arrivals[-1][1].usage is not None
    assert tokens[1] - tokens[0] >= 0.4  # the tokens are paced
    assert ended - tokens[1] < 0.25  # the tail is not: two more intervals would be 1 s


def test_the_floor_row_from_the_bare_sdk_in_its_own_process():
    """The floor process (`python -m bench.b3_floor`) against the paced provider, both profiles: CPU
    per run, chunks per run, and the split into CPU per chunk and fixed CPU per run; its report row."""
    profile = PROFILES["chat"].scaled(tokens=30, interval=0.005)
    with StampingServer(handler=BenchProvider(stamp=True, profile=profile)) as server:
        fl = b3_chat.floor_cost(server.port, runs=2, short_reps=1)
        assert server.errors == []
    assert fl["chat_chunks"] == 4 * (30 + 2)
    assert fl["short_chunks"] < fl["chat_chunks"]
    assert fl["chat_ms_per_run"] > 0 and fl["short_ms_per_run"] >= 0
    assert math.isfinite(fl["per_chunk_ms"]) and math.isfinite(fl["fixed_ms"])
    assert fl["delay_p99"] >= fl["delay_p50"] >= 0
    ev = {"profile": profile.__dict__, "floor": fl, "ramps": {}, "server": "daphne", "levels": [2]}
    (row,) = b3_chat.rows(ev)
    assert row.name.startswith("floor: bare openai SDK (AsyncOpenAI, streaming), 2 runs at once")
    assert "µs CPU per chunk" in row.result and row.target is None
    assert "floor: bare SDK, 2 runs at once" in b3_chat.markdown(ev)


def test_cost_split_and_a_levels_figures():
    """The two-profile split solves CPU = fixed + chunks × per chunk; a level's draft delays and release
    overheads are those inside its window, the overhead counted from the guard's last token."""
    per_chunk, fixed = b3_chat.split_cost(
        chat_ms=10 + 1000 * 0.05, short_ms=10 + 30 * 0.05, chat_chunks=1000, short_chunks=30
    )
    assert per_chunk == pytest.approx(0.05) and fixed == pytest.approx(10.0)
    ms = 1_000_000
    frames = [(5 * ms, 3.0), (15 * ms, 7.0), (25 * ms, 900.0)]
    guards = {111: (10 * ms, 18 * ms)}
    outcomes = [
        {"status": "SUCCESS", "answer_last": 111, "received": 20 * ms},
        {"status": "FAILED", "ended": 2 * ms},
    ]
    e = b3_chat.summarise("verified", 2, frames, outcomes, guards, window=(10 * ms, 22 * ms), begin=0)
    assert (e["frames"], e["frame_p99"]) == (1, 7.0)
    assert (e["release_p99"], e["guard_p50"]) == (2.0, 8.0)
    assert e["failed"] == 1 and not e["ok"]
    ok = b3_chat.summarise("draft", 1, frames, outcomes[:1], guards, window=(10 * ms, 22 * ms), begin=0)
    assert ok["ok"] and ok["p99"] == 7.0


@pytest.mark.mariadb
@pytest.mark.django_db(transaction=True)
def test_b3_on_the_chat_profile_end_to_end_at_smoke_size(monkeypatch):
    """The whole of B3 shrunk: the floor, the cost split on a real daphne running the real runtime on
    this test database, a one-level ramp per release mode (in-memory layer), every run's records
    checked, and the rows with the issue's targets. Takes ≈ 40–60 s on a loaded 2-core machine: it
    starts the provider, the floor's process and a daphne per release mode, each chat a real run."""
    from django.db import connection

    db = connection.settings_dict
    monkeypatch.setenv("DATABASE_URL", f"mysql://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}")
    monkeypatch.setenv("WEBSOCKET_REQUIRE_TLS", "false")
    rows, ev = b3_chat.run_all(
        levels=(2,), redis=False, cost_chats=2, tokens=10, interval=0.01, server="daphne", log=lambda *_: None
    )
    for mode in ("draft", "verified"):
        cost = ev[f"cost / {mode}"]
        assert cost["chat_ms_per_run"] > 0 and math.isfinite(cost["per_chunk_ms"]), cost
        assert cost["missing"] == 0 and cost["bad_runs"] == 0
        ramp = ev["ramps"][f"{mode} / one process, in-memory layer"]
        (level,) = ramp["levels"]
        assert level["failed"] == 0 and level["outcomes"] >= 2
        assert ramp["missing"] == 0 and ramp["bad_runs"] == 0 and ramp["runs"] >= 2
        assert level["release_p99"] == level["release_p99"]  # measured (not NaN): guard lines matched
        assert level["guard_p50"] >= 10 * 10 * 0.9  # the guard's 10 tokens 10 ms apart
        if mode == "draft":
            assert level["frames"] > 0 and level["frame_p99"] >= 0
        else:
            assert level["frames"] == 0  # verified release forwards no answer text
    names = [r.name for r in rows]
    assert names[0].startswith("floor: bare openai SDK")
    assert names[1].startswith("floor beside it: the same SDK on its aiohttp transport")
    for floor in (ev["floor"], ev["floor / aiohttp"]):  # both floors measured the same streams
        assert floor["chat_chunks"] == ev["floor"]["chat_chunks"] and floor["chat_ms_per_run"] > 0
    assert "on the same transport" in b3_chat.markdown(ev)
    targets = {r.name.split(":")[1].strip(): r.target for r in rows if ":" in r.name and r.target}
    assert targets["CPU per chunk vs bare SDK (chat profile"] == 1.5
    assert targets["fixed CPU per run (everything but chunk handling)"] == 20.0
    assert [r.target for r in rows if "most concurrent chats" in r.name] == [200.0, 200.0]
    text = b3_chat.markdown(ev)
    assert "draft / one process, in-memory layer" in text and "verified / one process" in text
    assert "Next lever" in b3_chat.limits(ev)
    json.dumps(ev)  # the evidence is plain data (kept by the report)
    # docs/performance.md of a run with these rows: the table, the per-level section, the limits.
    from bench.env import Machine
    from bench.report import Results, markdown

    res = Results(
        machine=Machine(2, 1.0, "cpu", "3.11", "5.2", "10.11", "2.3", "innodb", "linux"), quick=True
    )
    res.rows, res.evidence["b3_chat"] = rows, ev
    page = markdown(res)
    assert "| B3 | floor: bare openai SDK" in page and "fixed CPU per run" in page
    assert "### B3 on the chat profile" in page and "| draft / one process, in-memory layer | 2" in page
    assert "so one process saturates its core near" in " ".join(page.split())


def test_the_limits_name_what_bound_each_ramp():
    """Where a ramp stopped, the paragraph names the bound from the level's own figures: the servers'
    CPU, the harness's, or (neither) a queue on the frames' path — Redis when the in-memory
    layer held the same level — and the next levers, larger share first."""
    level = dict.fromkeys(("frame_p50", "release_p50", "release_p99", "guard_p50"), 1.0)
    level.update(outcomes=2, failed=0, frames=10, provider_cores=0.05, clients_cores=0.05, load_average=1.0)

    def ramp(*levels):
        held = [e["chats"] for e in levels if e["ok"]]
        return {
            "levels": list(levels),
            "capacity": held[-1] if held else 0,
            "runs": 4,
            "missing": 0,
            "bad_runs": 0,
        }

    ev = {
        "profile": PROFILES["chat"].__dict__,
        "floor": {"chat_ms_per_run": 480.0, "fixed_ms": 10.0, "per_chunk_ms": 0.38, "runs": 10},
        "cost / draft": {"chat_ms_per_run": 700.0, "fixed_ms": 70.0, "per_chunk_ms": 0.5, "runs": 10},
        "ramps": {
            "draft / one process, in-memory layer": ramp(
                {**level, "chats": 25, "p99": 30.0, "ok": True, "cpu_cores": 0.6},
                {**level, "chats": 50, "p99": 400.0, "ok": False, "cpu_cores": 0.95},
            ),
            "draft / one process, Redis layer": ramp(
                {**level, "chats": 25, "p99": 19000.0, "ok": False, "cpu_cores": 0.6}
            ),
        },
    }
    text = " ".join(b3_chat.limits(ev).split())
    assert (
        "in-memory layer: 25 held, at 50 p99 400 ms, bound by the servers' own CPU (0.95 of 1 cores)" in text
    )
    assert "Redis layer: 0 held, at 25 p99 19000 ms, bound by neither the servers' own CPU" in text
    assert "Redis, which this configuration adds to a run's path" in text
    assert "the in-memory configuration at 25: p99 30 ms" in text
    assert "saturates its core near 34 concurrent chats" in text  # 24.4 s / 0.7 s
    assert "the bare SDK alone spends 480 ms per chat run" in text
    assert text.index("the per-chunk path") < text.index("then the fixed part")  # 90 % is per chunk
