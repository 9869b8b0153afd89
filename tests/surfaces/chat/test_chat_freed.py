"""A chat's run is freed when it ends, through the WebSocket path too (consumer, follower, the channel
layer's sink): none of its objects is left in a reference cycle for a full collection to find on the
serving loop (tests/agent/runtime/test_run_freed.py holds the runtime's own objects to the same)."""

from __future__ import annotations

import pytest

from agent.runtime.context import RunContext
from agent.runtime.events import SafeSink
from agent.runtime.executor import _Ending
from agent.runtime.live import ChannelLayerSink
from audit.write import RunRecorder
from surfaces.chat.consumers import ChatConsumer
from tests.agent.runtime.support import cycles_left
from tests.surfaces.chat.test_ws import _stop, _wait_run_finished
from tests.surfaces.chat.transports import ws_connect, ws_frames_until_outcome

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio,
    pytest.mark.usefixtures("chat_settings", "stop_chat_background"),
]

RUNS_OWN = {RunContext, _Ending, SafeSink, ChannelLayerSink, RunRecorder, ChatConsumer}


async def test_a_finished_chat_leaves_none_of_its_objects_in_a_reference_cycle(user, knowledge):
    with cycles_left() as left:
        comm = await ws_connect(user)
        await comm.send_json_to({"type": "chat", "query": "Disk full on /var/log, what should I check?"})
        frames = await ws_frames_until_outcome(comm)
        await _wait_run_finished(frames[0]["runId"])
        await _stop(comm)
    assert frames[-1]["type"] == "outcome" and frames[-1]["status"] == "SUCCESS"
    assert not left & RUNS_OWN, sorted(k.__name__ for k in left & RUNS_OWN)
