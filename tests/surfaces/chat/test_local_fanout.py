"""The process-local path of live events (agent/runtime/local_fanout.py): a follower of this process gets
each event once, in emit order, without the channel layer; a follower of another process (a second
Redis layer, as another daphne has) still gets every event through the real Redis; drafts stay off
Redis while nobody elsewhere follows the run; a reader that stopped reading is bounded."""

from __future__ import annotations

import asyncio
import threading

import pytest
from channels.layers import get_channel_layer
from channels_redis.core import RedisChannelLayer

from agent.runtime import local_fanout
from agent.runtime.events import DraftEvent, ToolEvent, from_message, to_message
from agent.runtime.live import FRAME_MESSAGE_TYPE, RunFollower, publish, run_group
from tests.surfaces.chat.support import use_redis_layer

REDIS_URL = "redis://127.0.0.1:6379/13"
RUN = "run_localfanout"


def _draft(text: str) -> DraftEvent:
    return DraftEvent(run_id=RUN, text=text)


def _tool(seq: int) -> ToolEvent:
    return ToolEvent(
        run_id=RUN, tool_call_id=f"call_{seq}", name="lookup_knowledge", status="RUNNING", sequence_no=seq
    )


async def _drain(follower: RunFollower, *, settle: float) -> list:
    """Everything in the follower's queue once nothing more arrived for `settle` seconds."""
    got = []
    while True:
        try:
            got.append(await asyncio.wait_for(follower._queue.get(), settle))
        except TimeoutError:
            return got


@pytest.fixture
def redis_layer(settings):
    use_redis_layer(settings, REDIS_URL)
    return get_channel_layer


def _count_group_sends(layer, monkeypatch) -> list[dict]:
    sent: list[dict] = []
    original = type(layer).group_send

    async def counted(self, group, message):
        sent.append(message)
        return await original(self, group, message)

    monkeypatch.setattr(type(layer), "group_send", counted)
    return sent


def test_in_memory_a_local_follower_gets_every_event_once_in_order_and_the_layer_carries_none(monkeypatch):
    async def scenario():
        layer = get_channel_layer()
        sent = _count_group_sends(layer, monkeypatch)
        async with RunFollower(RUN) as follower:
            events = [_draft("Check "), _tool(3), _draft("the replica."), _tool(4)]
            for event in events:
                assert await publish(RUN, event)
            got = await _drain(follower, settle=0.2)
        return events, got, sent

    events, got, sent = asyncio.run(scenario())
    assert got == events
    assert sent == []  # one process: no other process to reach
    assert local_fanout._followers.get(RUN) is None  # unregistered on exit


def test_redis_one_process_drafts_stay_off_redis_and_nothing_arrives_twice(redis_layer, monkeypatch):
    async def scenario():
        layer = redis_layer()
        sent = _count_group_sends(layer, monkeypatch)
        try:
            async with RunFollower(RUN) as follower:
                for text in ("a", "b", "c"):
                    await publish(RUN, _draft(text))
                await publish(RUN, _tool(5))  # goes through Redis too: a follower elsewhere may need it
                # A frame from another process, sent after: once it is here, the layer's copy of the
                # tool event (sent before it, on the same Redis list) has been received and dropped.
                foreign = to_message(_draft("from elsewhere"))
                await layer.group_send(
                    run_group(RUN), {"type": FRAME_MESSAGE_TYPE, "origin": "elsewhere", **foreign}
                )
                got = await _drain(follower, settle=1.0)
        finally:
            await layer.flush()
        return got, sent

    got, sent = asyncio.run(scenario())
    assert got == [_draft("a"), _draft("b"), _draft("c"), _tool(5), _draft("from elsewhere")]
    ours = [m for m in sent if m.get("origin") == local_fanout.ORIGIN]
    assert [from_message(m) for m in ours] == [_tool(5)]  # no draft went to Redis


def test_redis_a_follower_in_another_process_gets_drafts_and_events_through_redis(redis_layer, monkeypatch):
    monkeypatch.setattr(local_fanout, "REMOTE_CHECK_SECONDS", 0.0)

    async def scenario():
        layer = redis_layer()
        other = RedisChannelLayer(hosts=[{"address": REDIS_URL}])  # another daphne's layer
        remote = await other.new_channel()
        try:
            async with RunFollower(RUN) as follower:
                await other.group_add(run_group(RUN), remote)
                events = [_draft("Check "), _tool(6), _draft("the replica.")]
                for event in events:
                    assert await publish(RUN, event)
                elsewhere = [from_message(await asyncio.wait_for(other.receive(remote), 10)) for _ in events]
                here = await _drain(follower, settle=1.0)
                await other.group_discard(run_group(RUN), remote)
        finally:
            await other.flush()
            await layer.flush()
        return events, elsewhere, here

    events, elsewhere, here = asyncio.run(scenario())
    assert elsewhere == events
    assert here == events  # the local follower: each once, though Redis carried them too


def test_a_follower_on_another_event_loop_of_the_process_gets_events_through_its_loop():
    ready, done = threading.Event(), threading.Event()
    box: dict = {}

    def other_loop():
        async def follow():
            async with RunFollower(RUN) as follower:
                ready.set()
                box["got"] = [await asyncio.wait_for(follower._queue.get(), 10) for _ in range(2)]

        asyncio.run(follow())
        done.set()

    thread = threading.Thread(target=other_loop)
    thread.start()
    assert ready.wait(10)

    async def publish_both():
        await publish(RUN, _draft("one"))
        await publish(RUN, _tool(7))

    asyncio.run(publish_both())
    assert done.wait(10)
    thread.join(5)
    assert box["got"] == [_draft("one"), _tool(7)]


def test_a_follower_that_stopped_reading_is_bounded(monkeypatch):
    monkeypatch.setattr(local_fanout, "LOCAL_QUEUE_MAX", 3)

    async def scenario():
        async with RunFollower(RUN) as follower:
            for i in range(10):
                await publish(RUN, _draft(str(i)))
            return follower._queue.qsize(), [follower._queue.get_nowait() for _ in range(3)]

    size, kept = asyncio.run(scenario())
    assert size == 3 and kept == [_draft("0"), _draft("1"), _draft("2")]


def test_the_remote_check_is_cached_per_run_and_its_cache_stays_bounded(monkeypatch):
    """A draft of a run nobody here follows (a queue worker's run) asks Redis at most once per window,
    and the answers of finished runs do not pile up."""
    reads: list[bytes] = []

    class Connection:
        async def zrange(self, key, start, end):
            reads.append(key)
            return [b"specific.elsewhere!1"]

    class Layer:  # the two channels_redis calls the check makes, and nothing else
        def _group_key(self, group):
            return group.encode()

        def consistent_hash(self, group):
            return 0

        def connection(self, index):
            return Connection()

    monkeypatch.setattr(local_fanout, "REMOTE_CACHE_MAX", 10)
    monkeypatch.setattr(local_fanout, "REMOTE_CHECK_SECONDS", 0.2)
    monkeypatch.setattr(local_fanout, "_remote", {})

    async def scenario():
        layer = Layer()
        for i in range(10):
            assert await local_fanout.needs_layer(layer, f"r{i}", f"run.r{i}", draft=True)
        assert await local_fanout.needs_layer(layer, "r0", "run.r0", draft=True)  # cached
        first = len(reads)
        await asyncio.sleep(0.25)
        for i in (10, 11):
            assert await local_fanout.needs_layer(layer, f"r{i}", f"run.r{i}", draft=True)
        return first

    first = asyncio.run(scenario())
    assert first == 10 and len(reads) == 12
    assert sorted(local_fanout._remote) == ["r10", "r11"]  # the stale answers were dropped
