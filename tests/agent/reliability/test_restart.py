"""MariaDB restarted between two runs: the runtime's long-lived database pool recovers by itself.

One event loop plays a server process that stays up: a run, then the local mariadbd is really stopped
(`mariadb-admin shutdown`) and started again, then a second run through the same pool threads, whose
connections all died with the server. The second run must be created, claimed, executed and recorded
without a single failed audit write. Whatever happens, MariaDB is running again when the test ends.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from django.db import connection

from agent.runtime import db as runtime_db
from agent.runtime.llm import aclose_clients
from audit.read import get_trace
from diagnosis.models import DiagnosisRun, ReleaseDecision, RunStatus
from tests.agent.reliability.support import mariadb_running, restart_mariadb
from tests.agent.runtime.support import AGENT, CollectingSink, start_run
from tests.fakes.openai_server import stream_answer, usage

pytestmark = [pytest.mark.mariadb, pytest.mark.serial, pytest.mark.django_db(transaction=True)]

POOL_THREADS = 3


@pytest.fixture
def small_pool(settings):
    settings.RUNTIME_DB_THREADS = POOL_THREADS
    runtime_db.shutdown_pools()
    yield
    runtime_db.shutdown_pools()


def _connection_ids() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT CONNECTION_ID()")
        return cursor.fetchone()[0]


async def _open_every_pool_connection(barrier: threading.Barrier) -> set[int]:
    """One job per pool thread, held together by a barrier, so that every thread holds a connection."""

    def job() -> int:
        barrier.wait(10)
        return _connection_ids()

    return set(await asyncio.gather(*(runtime_db.db(job) for _ in range(POOL_THREADS))))


def test_runs_before_and_after_a_mariadb_restart_share_one_pool_and_lose_nothing(llm, user, small_pool):
    for _ in range(2):
        llm.route("CHITCHAT", usage=usage(10, 2))
        llm.add(AGENT, stream_answer("Hello! Ask me about an incident.", usage=usage(20, 8)))

    async def server_process():
        try:
            sink1 = CollectingSink()
            run1, task1 = await start_run(user=user, query="hello before the restart", sink=sink1)
            outcome1 = await task1
            pool = runtime_db._db_workers()
            before = await _open_every_pool_connection(threading.Barrier(POOL_THREADS))

            downtime = await asyncio.to_thread(restart_mariadb)

            sink2 = CollectingSink()
            run2, task2 = await start_run(user=user, query="hello after the restart", sink=sink2)
            outcome2 = await task2
            assert runtime_db._db_workers() is pool  # the same long-lived pool, not a new one
            after = await _open_every_pool_connection(threading.Barrier(POOL_THREADS))
            return (run1, outcome1), (run2, outcome2), before, after, downtime
        finally:
            await aclose_clients()

    with mariadb_running():  # also closes this process's connections that died with the server
        (run1, outcome1), (run2, outcome2), before, after, downtime = asyncio.run(server_process())

    assert downtime > 0 and len(before) == len(after) == POOL_THREADS
    assert before.isdisjoint(after)  # every pool thread reconnected to the restarted server
    for run, outcome in ((run1, outcome1), (run2, outcome2)):
        run = DiagnosisRun.objects.get(run_id=run.run_id)
        assert outcome.status == run.status == RunStatus.SUCCESS
        assert run.release_decision == ReleaseDecision.PUBLISHED and run.lease_owner == ""
        summary = get_trace(run=run).summary
        assert summary.audit_complete and summary.audit_write_failures == 0, summary.gaps
        assert summary.persisted == summary.expected


# --------------------------------------------------------------------------------------------------
# The pool's recovery rules, one by one (regression tests for agent/runtime/db.py)
# --------------------------------------------------------------------------------------------------
def _kill(connection_id: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"KILL CONNECTION {int(connection_id)}")


def test_an_idle_pool_connection_that_died_is_replaced_before_the_next_job(settings, small_pool, monkeypatch):
    monkeypatch.setattr(runtime_db, "PING_IDLE_SECONDS", 0.05)

    async def scenario():
        first = await runtime_db.db(_connection_ids)
        await asyncio.to_thread(_kill, first)
        await asyncio.sleep(0.2)  # idle longer than PING_IDLE_SECONDS: the next job pings first
        second = await runtime_db.db(_connection_ids)
        return first, second

    settings.RUNTIME_DB_THREADS = 1
    runtime_db.shutdown_pools()
    first, second = asyncio.run(scenario())
    assert first != second


def test_a_busy_pool_thread_whose_connection_died_fails_one_job_then_reconnects(
    settings, small_pool, monkeypatch
):
    from django.db import OperationalError

    monkeypatch.setattr(runtime_db, "PING_IDLE_SECONDS", 3600)  # no ping: the job meets the dead socket

    async def scenario():
        first = await runtime_db.db(_connection_ids)
        await asyncio.to_thread(_kill, first)
        with pytest.raises(OperationalError):
            await runtime_db.db(_connection_ids)
        return first, await runtime_db.db(_connection_ids)

    settings.RUNTIME_DB_THREADS = 1
    runtime_db.shutdown_pools()
    first, second = asyncio.run(scenario())
    assert first != second
