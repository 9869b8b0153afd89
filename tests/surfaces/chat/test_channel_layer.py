"""The single-process channel layer (core/channel_layers.py): channels' in-memory layer whose expiry
sweep runs at most once per interval; expired messages and memberships are still dropped."""

import asyncio

import pytest
from channels.layers import InMemoryChannelLayer as ChannelsLayer

from core.channel_layers import InMemoryChannelLayer
from tests.surfaces.chat.support import use_redis_layer


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


def test_the_redis_layer_waits_longer_than_its_blocking_pop_and_receives_after_an_idle_period():
    """redis-py 8 defaults the socket timeout to 5 s, channels_redis blocks 5 s per pop: the configured
    timeout must exceed the pop's, else every idle receive fails (TimeoutError) and live frames stall.
    With Redis running, a receive that idles through one whole blocking pop still gets its message."""
    import importlib
    import os

    import redis
    from channels_redis.core import RedisChannelLayer
    from channels_redis.utils import create_pool

    import config.settings as project_settings

    url = "redis://127.0.0.1:6379/12"
    os.environ["REDIS_URL"] = url
    try:
        layers = importlib.reload(project_settings).CHANNEL_LAYERS
    finally:
        del os.environ["REDIS_URL"]
        importlib.reload(project_settings)
    assert layers["default"]["BACKEND"] == "channels_redis.core.RedisChannelLayer"
    layer = RedisChannelLayer(**layers["default"]["CONFIG"])
    layer.brpop_timeout = 1  # one whole pop idles in a second
    timeout = create_pool(layer.hosts[0]).connection_kwargs["socket_timeout"]
    assert timeout is None or timeout > 5  # channels_redis's own pop timeout
    try:
        redis.Redis.from_url(url, socket_timeout=1).ping()
    except redis.RedisError:
        pytest.skip("needs Redis on 127.0.0.1:6379")
    layer.hosts[0]["socket_timeout"] = 1.5  # scaled with the pop, as the setting is

    async def idle_then_receive():
        channel = await layer.new_channel(prefix="test.")
        waiting = asyncio.ensure_future(layer.receive(channel))
        # The receiver's pop comes back empty twice (nothing to read) before anything is sent.
        done, _ = await asyncio.wait({waiting}, timeout=2.5)
        assert not done
        await layer.send(channel, {"type": "late"})
        message = await asyncio.wait_for(waiting, 10)
        await layer.flush()
        return message

    assert asyncio.run(idle_then_receive()) == {"type": "late"}


def test_a_follower_receives_while_the_control_listener_blocks_in_its_pop(settings):
    """channels_redis lets one receiver at a time pop the Redis list of a channel-name prefix: the run
    followers and the cancel listener must share the layer's default prefix, or every live frame waits
    behind the listener's blocking pop (here 30 s, so a wrong prefix fails the 10 s wait)."""
    from agent.runtime import supervisor
    from agent.runtime.events import DraftEvent, to_message
    from agent.runtime.live import FRAME_MESSAGE_TYPE, RunFollower, run_group

    use_redis_layer(settings, "redis://127.0.0.1:6379/12", socket_timeout=60)

    async def scenario():
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        layer.brpop_timeout = 30
        ready = asyncio.Event()
        listener = asyncio.ensure_future(supervisor._control_listener(ready))
        await ready.wait()
        while not layer.receive_lock or not layer.receive_lock.locked():
            await asyncio.sleep(0.01)  # the listener is in its blocking pop
        try:
            async with RunFollower("run_prefix") as follower:
                # Sent as another process sends it (this process's own events skip the layer).
                frame = to_message(DraftEvent(run_id="run_prefix", text="live"))
                await layer.group_send(
                    run_group("run_prefix"), {"type": FRAME_MESSAGE_TYPE, "origin": "elsewhere", **frame}
                )
                return await asyncio.wait_for(follower._queue.get(), 10)
        finally:
            listener.cancel()
            await layer.flush()

    assert asyncio.run(scenario()) == DraftEvent(run_id="run_prefix", text="live")


@pytest.mark.django_db(transaction=True)
def test_a_chat_socket_holds_no_receive_of_its_own_on_the_layer(settings, user):
    """Nothing is sent to a chat connection through the channel layer, so it takes no turn in
    channels_redis's receive (channels would give it one for its whole life, and on close a cancel the
    layer can lose: `surfaces.chat.consumers.ChatConsumer.channel_layer_alias`). With Redis: the
    receivers while a socket is open are the control listener's alone, and the socket closes at once."""
    from agent.runtime import supervisor
    from tests.surfaces.chat.transports import ws_connect

    use_redis_layer(settings, "redis://127.0.0.1:6379/15")
    settings.RUN_SWEEP_INTERVAL_SECONDS = 0
    settings.AIOPS_WORKER_CONCURRENCY = 0

    async def scenario():
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        supervisor.ensure_background()
        await supervisor._control_channel()
        while layer.receive_count < 1:
            await asyncio.sleep(0.01)  # the control listener is receiving
        comm = await ws_connect(user)
        try:
            await asyncio.sleep(0.1)
            receivers = layer.receive_count
        finally:
            await asyncio.wait_for(comm.disconnect(), 2)
            await supervisor.stop_background()
            await layer.flush()
        return receivers

    assert asyncio.run(scenario()) == 1
