"""Draft coalescing in the executor's sink (`agent.runtime.live.ChannelLayerSink`,
`CHAT_DRAFT_COALESCE_MS`): a draft that finds the run quiet goes out at once; pieces written within the
window after a draft frame go out as one `draft` frame; nothing is lost or reordered, no other event
overtakes held text, and held text goes out on its own (timer) or when it reaches the size bound.
Asserted by what a follower of the run receives, in order, never by how long it took.
"""

from __future__ import annotations

import asyncio

import pytest

from agent.runtime import local_fanout
from agent.runtime.events import DraftEvent, OutcomeEvent, ProgressEvent, ToolEvent
from agent.runtime.live import MAX_COALESCED_DRAFT_CHARS, ChannelLayerSink, RunFollower

RUN = "run_coalesce"
# So long that only an explicit flush, another event or the size bound can publish held text.
NEVER = 3600.0


@pytest.fixture(autouse=True)
def in_memory_layer(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    yield
    local_fanout._followers.clear()  # the scenarios leave their followers subscribed
    local_fanout._remote.clear()


async def _subscribe() -> RunFollower:
    """A follower of the run in this process: what it receives is what the sink published."""
    follower = RunFollower(RUN)
    await follower.__aenter__()
    return follower


def _queued(follower: RunFollower) -> int:
    return follower._queue.qsize()


async def _drain(follower: RunFollower) -> list:
    return [follower._queue.get_nowait() for _ in range(_queued(follower))]


def _tool(status: str, seq: int) -> ToolEvent:
    return ToolEvent(
        run_id=RUN, tool_call_id="call_1", name="lookup_knowledge", status=status, sequence_no=seq
    )


def _outcome(seq: int) -> OutcomeEvent:
    return OutcomeEvent(
        run_id=RUN, status="SUCCESS", release_decision="PUBLISHED", content="x", sequence_no=seq
    )


def test_the_first_piece_goes_out_at_once_and_the_rest_of_the_window_becomes_one_frame():
    async def scenario():
        follower = await _subscribe()
        sink = ChannelLayerSink(RUN, coalesce_seconds=NEVER)
        for piece in ("Check ", "the ", "replica", "."):
            await sink.emit(DraftEvent(run_id=RUN, text=piece))
        held = _queued(follower)
        await sink.emit(_outcome(9))
        return held, await _drain(follower)

    held, frames = asyncio.run(scenario())
    assert held == 1  # the quiet run's first piece; the rest was held
    assert frames == [
        DraftEvent(run_id=RUN, text="Check "),
        DraftEvent(run_id=RUN, text="the replica."),
        _outcome(9),
    ]


def test_no_event_overtakes_text_written_before_it_and_nothing_is_lost():
    pieces = [f"p{i} " for i in range(30)]
    script = [
        ProgressEvent(run_id=RUN, stage="MODEL_STEP", status="STARTED"),
        *[DraftEvent(run_id=RUN, text=p) for p in pieces[:10]],
        _tool("RUNNING", 4),
        *[DraftEvent(run_id=RUN, text=p) for p in pieces[10:25]],
        _tool("SUCCESS", 5),
        _tool("SUCCESS", 6),
        *[DraftEvent(run_id=RUN, text=p) for p in pieces[25:]],
        _outcome(7),
    ]

    async def scenario():
        follower = await _subscribe()
        sink = ChannelLayerSink(RUN, coalesce_seconds=NEVER)
        for event in script:
            await sink.emit(event)
        return await _drain(follower)

    frames = asyncio.run(scenario())
    assert frames == [
        script[0],
        DraftEvent(run_id=RUN, text=pieces[0]),
        DraftEvent(run_id=RUN, text="".join(pieces[1:10])),
        _tool("RUNNING", 4),
        DraftEvent(run_id=RUN, text="".join(pieces[10:25])),
        _tool("SUCCESS", 5),
        _tool("SUCCESS", 6),
        DraftEvent(run_id=RUN, text="".join(pieces[25:])),
        _outcome(7),
    ]


def test_held_text_goes_out_on_its_own_when_the_window_ends():
    """No later event is needed: the timer publishes the held text (the run may sit in a tool call)."""
    text = "Check the replica. Then the relay log."

    async def scenario():
        follower = await _subscribe()
        sink = ChannelLayerSink(RUN, coalesce_seconds=0.001)
        for piece in text.split(" "):
            await sink.emit(DraftEvent(run_id=RUN, text=piece + " "))
        frames = []
        while "".join(f.text for f in frames) != text + " ":
            frames.append(await asyncio.wait_for(follower._queue.get(), 10))
        return frames, _queued(follower)

    frames, left = asyncio.run(scenario())
    assert all(isinstance(f, DraftEvent) and f.run_id == RUN for f in frames)
    assert left == 0


def test_held_text_goes_out_at_once_when_it_reaches_the_size_bound():
    piece = "x" * 1000
    count = MAX_COALESCED_DRAFT_CHARS // len(piece) + 1  # held after the first one (sent at once)

    async def scenario():
        follower = await _subscribe()
        sink = ChannelLayerSink(RUN, coalesce_seconds=NEVER)
        for _ in range(1 + count):
            await sink.emit(DraftEvent(run_id=RUN, text=piece))
        at_bound = await _drain(follower)
        await sink.emit(DraftEvent(run_id=RUN, text="tail"))
        await sink.flush()
        return at_bound, await _drain(follower)

    at_bound, rest = asyncio.run(scenario())
    assert at_bound == [DraftEvent(run_id=RUN, text=piece), DraftEvent(run_id=RUN, text=piece * count)]
    assert rest == [DraftEvent(run_id=RUN, text="tail")]


def test_without_a_window_every_piece_is_its_own_frame(settings):
    settings.CHAT_DRAFT_COALESCE_MS = 0

    async def scenario():
        follower = await _subscribe()
        sink = ChannelLayerSink(RUN)
        for piece in ("a", "b", "c"):
            await sink.emit(DraftEvent(run_id=RUN, text=piece))
        return await _drain(follower)

    assert asyncio.run(scenario()) == [DraftEvent(run_id=RUN, text=t) for t in "abc"]


def test_the_window_comes_from_the_setting(settings):
    settings.CHAT_DRAFT_COALESCE_MS = 30
    assert ChannelLayerSink(RUN).coalesce_seconds == pytest.approx(0.03)


def test_an_event_of_another_run_is_refused_even_while_text_is_held():
    async def scenario():
        sink = ChannelLayerSink(RUN, coalesce_seconds=NEVER)
        follower = await _subscribe()
        await sink.emit(DraftEvent(run_id=RUN, text="sent "))
        await sink.emit(DraftEvent(run_id=RUN, text="held"))
        with pytest.raises(ValueError):
            await sink.emit(DraftEvent(run_id="other", text="leak"))
        await sink.flush()
        return await _drain(follower)

    assert asyncio.run(scenario()) == [
        DraftEvent(run_id=RUN, text="sent "),
        DraftEvent(run_id=RUN, text="held"),
    ]
