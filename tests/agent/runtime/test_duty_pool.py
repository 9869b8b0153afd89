"""The periodic duties' database passes run on a pool of their own (`agent.runtime.db.duty`): while one
is in progress, no decision waits behind it on a `db()` thread (a pass on `db()` held every job the pool
queued behind it on its thread for the whole pass)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from agent.runtime import supervisor
from agent.runtime.db import db, shutdown_pools


def _block(entered: threading.Event, release: threading.Event, ran_on: list[str], result=None):
    def fake(*args, **kwargs):
        ran_on.append(threading.current_thread().name)
        entered.set()
        release.wait(10)
        return result

    return fake


@pytest.mark.parametrize(
    ("duty", "patched"),
    [
        (supervisor._checkpoint, [("periodic_checkpoint", None)]),
        (supervisor._purge, [("purge_expired_runs", None)]),
        (supervisor._sweep, [("sweep_expired_runs", []), ("expire_due", [])]),
    ],
    ids=["checkpoint", "purge", "sweep"],
)
def test_a_duty_pass_in_progress_holds_up_no_decision(duty, patched, monkeypatch, settings):
    entered, release, ran_on = threading.Event(), threading.Event(), []
    # The duties' functions as the supervisor imported them (at the top: none is imported on the loop).
    name, result = patched[0]
    monkeypatch.setattr(supervisor, name, _block(entered, release, ran_on, result))
    for name, result in patched[1:]:
        monkeypatch.setattr(supervisor, name, lambda *a, _r=result, **k: _r)

    async def scenario() -> list[str]:
        task = asyncio.create_task(duty())
        try:
            for _ in range(500):
                if entered.is_set():
                    break
                await asyncio.sleep(0.01)
            assert entered.is_set(), "the duty's pass never started"
            # More jobs than the pool has threads: on `db()`, round-robin would queue some behind the pass.
            count = 3 * settings.RUNTIME_DB_THREADS
            jobs = [db(lambda: threading.current_thread().name) for _ in range(count)]
            return await asyncio.wait_for(asyncio.gather(*jobs), 5)
        finally:
            release.set()
            await task

    try:
        decided_on = asyncio.run(scenario())
    finally:
        release.set()
        shutdown_pools()
    assert ran_on and ran_on[0].startswith("runtime-duties")
    assert len(decided_on) == 3 * settings.RUNTIME_DB_THREADS
    assert not set(decided_on) & set(ran_on)


@pytest.mark.django_db(transaction=True)
def test_a_serving_process_builds_the_knowledge_index_on_the_duties_pool_at_start(corpus, settings):
    """`start_serving` runs `warm_up` on the duties' pool: the knowledge index is built (0.5-1 s, which
    every run starting meanwhile waited for: B3's first chats came out of start-up together), and the
    first search reads nothing. A build that fails is logged by class and left to the first search."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from agent.knowledge import retrieval

    settings.RUN_SWEEP_INTERVAL_SECONDS = 0
    settings.AUDIT_CHECKPOINT_INTERVAL_SECONDS = 0
    settings.AUDIT_PURGE_INTERVAL_SECONDS = 0
    retrieval.reset_knowledge_index()
    built_on: list[str] = []
    build = retrieval._holder.get

    def get():
        built_on.append(threading.current_thread().name)
        return build()

    async def scenario() -> None:
        supervisor.start_serving()
        await asyncio.gather(*supervisor._warming)
        await supervisor.stop_background()

    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(retrieval._holder, "get", get)
            asyncio.run(scenario())
        assert built_on and built_on[0].startswith("runtime-duties")
        with CaptureQueriesContext(connection) as queries:
            assert retrieval.search_knowledge("nginx 502").items
        assert not queries.captured_queries

        retrieval.reset_knowledge_index()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(retrieval, "warm_knowledge_index", lambda: 1 / 0)
            assert supervisor.warm_up() is False  # logged by class, nothing raised
            asyncio.run(scenario())
    finally:
        shutdown_pools()


def test_settle_keeps_what_the_process_holds_out_of_the_collectors_passes():
    """`settle` freezes what is live (a full pass no longer walks it) after collecting the cyclic garbage
    already left, which would otherwise be kept for good."""
    import gc
    import weakref

    class Node:
        pass

    kept, garbage = Node(), Node()
    kept.me = kept
    garbage.me = garbage  # a cycle nothing refers to any more
    gone = weakref.ref(garbage)
    del garbage
    gc.disable()  # no pass of its own between the lines below
    try:
        supervisor.settle()
        assert gone() is None
        assert gc.get_freeze_count() > 0
        assert not any(o is kept for o in gc.get_objects())  # frozen: in no generation a pass walks
    finally:
        gc.unfreeze()
        gc.enable()
    assert any(o is kept for o in gc.get_objects())


def test_run_worker_warms_up_and_settles_before_its_loop_starts(monkeypatch):
    """`manage.py run_worker` prepares its process as `config.serve` does a server's: the knowledge index
    built, then the heap settled, both before the worker claims anything."""
    import io

    from django.core.management import call_command

    from surfaces.management.commands import run_worker

    order: list[str] = []

    async def work(**kwargs):
        order.append("work")
        return 0

    monkeypatch.setattr(supervisor, "warm_up", lambda: order.append("warm_up") or True)
    monkeypatch.setattr(supervisor, "settle", lambda: order.append("settle"))
    monkeypatch.setattr(supervisor, "ensure_background", lambda **kwargs: None)
    monkeypatch.setattr(run_worker, "work", work)
    call_command("run_worker", "--until-idle", stdout=io.StringIO())
    assert order == ["warm_up", "settle", "work"]
