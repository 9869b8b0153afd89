"""The single-process channel layer (config/channel_layers.py): channels' in-memory layer whose expiry
sweep runs at most once per interval; expired messages and memberships are still dropped."""

import asyncio

import pytest
from channels.layers import InMemoryChannelLayer as ChannelsLayer

from config.channel_layers import InMemoryChannelLayer


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def sweeps(monkeypatch):
    """How many times channels' own sweep ran."""
    count = {"n": 0}
    original = ChannelsLayer._clean_expired

    def counted(self):
        count["n"] += 1
        original(self)

    monkeypatch.setattr(ChannelsLayer, "_clean_expired", counted)
    return count


def test_the_sweep_runs_once_per_interval_whatever_the_number_of_frames(sweeps):
    clock = Clock()
    layer = InMemoryChannelLayer(sweep_interval=1.0, clock=clock)

    async def frames(n: int) -> None:
        await layer.group_add("run.x", "specific.a!1")
        for i in range(n):
            await layer.group_send("run.x", {"type": "frame", "i": i})
            assert (await layer.receive("specific.a!1"))["i"] == i

    asyncio.run(frames(200))
    assert sweeps["n"] == 1
    clock.now += 1.0
    asyncio.run(frames(200))
    assert sweeps["n"] == 2


def test_expired_messages_and_memberships_are_still_dropped():
    clock = Clock()
    layer = InMemoryChannelLayer(sweep_interval=1.0, clock=clock, expiry=0, group_expiry=0)

    async def scenario() -> tuple[dict, dict]:
        await layer.send("specific.a!1", {"type": "old"})
        await asyncio.sleep(0.01)  # the message's expiry (0 s) has passed
        layer._clean_expired()
        channels_after = dict(layer.channels)
        await layer.group_add("g", "specific.b!1")
        layer.groups["g"]["specific.b!1"] = 1.0  # joined long ago
        clock.now += 1.0
        layer._clean_expired()
        return channels_after, dict(layer.groups.get("g", {}))

    channels_after, members = asyncio.run(scenario())
    assert "specific.a!1" not in channels_after
    assert members == {}


def test_interval_zero_sweeps_on_every_call_as_channels_does(sweeps):
    layer = InMemoryChannelLayer(sweep_interval=0.0, clock=Clock())

    async def calls() -> None:
        for _ in range(5):
            await layer.group_send("g", {"type": "x"})

    asyncio.run(calls())
    assert sweeps["n"] == 5


def test_group_send_gives_every_member_its_own_copy_and_skips_a_full_one():
    layer = InMemoryChannelLayer(sweep_interval=1.0, clock=Clock(), capacity=1)

    async def scenario():
        for member in ("specific.a!1", "specific.b!1", "specific.c!1"):
            await layer.group_add("run.x", member)
        await layer.send("specific.b!1", {"type": "filler"})  # b is full (capacity 1)
        message = {"type": "frame", "fields": {"text": "x"}}
        await layer.group_send("run.x", message)
        message["fields"]["text"] = "changed by the sender"
        a, b, c = [await layer.receive(m) for m in ("specific.a!1", "specific.b!1", "specific.c!1")]
        return a, b, c, {m: layer.channels.get(m) for m in ("specific.a!1", "specific.b!1", "specific.c!1")}

    a, b, c, left = asyncio.run(scenario())
    assert a == c == {"type": "frame", "fields": {"text": "x"}} and a is not c
    assert b == {"type": "filler"}
    assert all(queue is None or queue.empty() for queue in left.values())
