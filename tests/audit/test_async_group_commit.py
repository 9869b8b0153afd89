"""The event loop's write path (agent/runtime/db.py "Suspended writes", audit/write/group_commit.py
`BatchWriter`): recorder decisions awaited through `db()` under group commit suspend instead of holding a
pool thread and share the writer's batches. Nothing is lost with hundreds of runs in flight (more than the
pool has threads), a batch is one transaction, a bad op fails alone and is counted, a stale writer's op
is refused by its fence while the others of its batch commit, and concurrent decisions of one run (the
parallel tool calls) still commit one at a time, gapless and chained.

`transaction=True`: batches are written on the writer thread's own connection."""

import asyncio

import pytest
from django.db.models import F

from agent.runtime import db as runtime_db
from agent.runtime.db import batch_writer, db
from audit.models import AgentStep, ToolInvocation, TraceEvent
from audit.verify.hash_chain import verify_chain
from audit.write import DeclaredToolCall, RunRecorder
from audit.write.group_commit import RecorderLock, get_committer
from diagnosis import services
from diagnosis.models import DiagnosisRun, RunStatus
from reasoning.capture import build_capture
from tests.audit.test_group_commit import _FailEventsOf
from tests.factories import record_full_run, usage

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def session(user, runtime_pools, settings):
    settings.RUNTIME_DB_THREADS = 4
    return services.create_session(owner=user)


def _runs(session, n):
    return [services.create_run(session=session, query=f"q{i}") for i in range(n)]


def _events(run_id):
    return list(TraceEvent.objects.filter(run_id=run_id).order_by("sequence_no"))


async def _held_batch(recorders, decide):
    """Every recorder's decision queued in the batch writer while it is held, then one release."""
    batcher = batch_writer()
    with batcher.hold():
        tasks = [asyncio.ensure_future(db(decide, rec)) for rec in recorders]
        while batcher.queued() < len(recorders):
            await asyncio.sleep(0.01)
    return await asyncio.gather(*tasks)


def test_200_concurrent_runs_through_db_lose_nothing_and_share_batches(session, settings):
    runs = _runs(session, 200)
    committer = get_committer()
    batches, ops = committer.batches, committer.ops

    async def main():
        recorders = [RunRecorder.for_run(r, group_commit=True) for r in runs]
        # A whole run per job: each of its decisions suspends the job until its batch committed.
        await asyncio.gather(
            *(db(record_full_run, r, recorder=rec, tools=3) for r, rec in zip(runs, recorders, strict=True))
        )
        return recorders

    recorders = asyncio.run(main())
    per_run = len(_events(runs[0].run_id))
    for run, rec in zip(runs, recorders, strict=True):
        run.refresh_from_db()
        events = _events(run.run_id)
        assert [e.sequence_no for e in events] == list(range(1, per_run + 1))
        assert verify_chain(events).valid
        assert run.status == RunStatus.SUCCESS and run.audit_write_failures == 0 == rec.audit_write_failures
        assert run.expected_events == per_run
        assert run.expected_steps == AgentStep.objects.filter(run_id=run.run_id).count()
        assert run.expected_tools == ToolInvocation.objects.filter(run_id=run.run_id).count() == 3
    written = committer.ops - ops
    assert written >= 200 * 15  # every decision (17 per run) went through the writer's batches
    # 200 runs in flight on 4 pool threads: batches far larger than the pool (a thread-bound group
    # commit could never batch more than one op per thread).
    assert committer.batches - batches < written / settings.RUNTIME_DB_THREADS


def test_queued_decisions_commit_in_one_batch_and_a_method_returns_after_it(session):
    runs = _runs(session, 50)
    committer = get_committer()

    async def main():
        recorders = [RunRecorder.for_run(r, group_commit=True) for r in runs]
        batches = committer.batches
        committer.largest_batch = 0
        await _held_batch(recorders, lambda rec: rec.run_started())
        return committer.batches - batches

    assert asyncio.run(main()) == 1  # one transaction (one compound statement on MariaDB) for all 50
    assert committer.largest_batch == 50
    for run in runs:
        run.refresh_from_db()
        assert run.status == RunStatus.RUNNING and run.expected_events == 1
        assert [e.sequence_no for e in _events(run.run_id)] == [1]


def test_a_bad_op_in_a_loop_batch_fails_alone_and_is_counted(session):
    runs = _runs(session, 10)
    victim = runs[0]
    committer = get_committer()
    fail = _FailEventsOf(victim.run_id)
    retried = committer.retried_batches

    async def main():
        recorders = [RunRecorder.for_run(r, group_commit=True) for r in runs]
        with committer.execute_wrapper(fail):
            await _held_batch(recorders, lambda rec: rec.run_started())
        await asyncio.gather(*(db(rec.finish, status=RunStatus.SUCCESS, content="a") for rec in recorders))
        return recorders

    recorders = asyncio.run(main())
    assert committer.retried_batches == retried + 1
    assert fail.fired == 2  # once in its batch, once alone
    for run in runs[1:]:
        run.refresh_from_db()
        assert run.audit_write_failures == 0
        assert [e.event_type for e in _events(run.run_id)] == ["RUN_STARTED", "RUN_FINISHED"]
    victim.refresh_from_db()
    assert victim.audit_write_failures == 1 == recorders[0].audit_write_failures
    events = _events(victim.run_id)
    assert [e.event_type for e in events] == ["RUN_FINISHED"] and verify_chain(events).valid


def test_a_stale_writers_op_is_fenced_and_its_batch_commits_the_others(session):
    runs = _runs(session, 10)
    stale = runs[3]

    async def main():
        recorders = [RunRecorder.for_run(r, group_commit=True) for r in runs]
        # Another process claimed the stale run since its recorder was made.
        await db(DiagnosisRun.objects.filter(run_id=stale.run_id).update, lease_epoch=F("lease_epoch") + 1)
        await _held_batch(recorders, lambda rec: rec.run_started())
        return recorders

    recorders = asyncio.run(main())
    for run, rec in zip(runs, recorders, strict=True):
        run.refresh_from_db()
        if run.run_id == stale.run_id:
            assert rec.fenced and rec.fenced_writes == 1 and run.fenced_writes == 1
            assert _events(run.run_id) == [] and run.status == RunStatus.PENDING
            assert rec.audit_write_failures == 0 == run.audit_write_failures  # a refusal, not a failure
        else:
            assert not rec.fenced and run.status == RunStatus.RUNNING
            assert [e.sequence_no for e in _events(run.run_id)] == [1]


def test_concurrent_decisions_of_one_run_commit_one_at_a_time_in_order(session, monkeypatch):
    """Parallel tool calls of one run (`asyncio.gather` in the runtime): the second decision waits for
    the recorder's lock held by the first, suspended job, without holding a pool thread."""
    (run,) = _runs(session, 1)
    waits = []
    when_free = RecorderLock.when_free
    monkeypatch.setattr(
        RecorderLock, "when_free", lambda lock, wake: (waits.append(1), when_free(lock, wake))
    )

    async def main():
        rec = RunRecorder.for_run(run, group_commit=True)
        await db(rec.run_started)
        await db(
            rec.model_step,
            step_index=1,
            agent_name="diagnosis_agent",
            model="m",
            usage=usage(1, 1),
            reasoning=build_capture(reasoning="why", text=""),
            tool_calls=[
                DeclaredToolCall(tool_call_id=f"c{i}", name="lookup_knowledge", arguments="{}")
                for i in range(6)
            ],
        )
        batcher = batch_writer()
        with batcher.hold():
            tasks = [
                asyncio.ensure_future(
                    db(rec.tool_started, tool_call_id=f"c{i}", tool_name="t", input_params={})
                )
                for i in range(6)
            ]
            while batcher.queued() < 1:
                await asyncio.sleep(0.01)
        await asyncio.gather(*tasks)
        await db(rec.finish, status=RunStatus.SUCCESS, content="a")
        return rec

    rec = asyncio.run(main())
    events = _events(run.run_id)
    run.refresh_from_db()
    assert [e.sequence_no for e in events] == list(range(1, run.expected_events + 1))
    started = [e for e in events if e.event_type == "TOOL_INVOCATION" and e.status == "RUNNING"]
    assert len(started) == 6
    assert waits  # the later calls waited for the lock of the suspended first one
    assert verify_chain(events).valid
    assert ToolInvocation.objects.filter(run_id=run.run_id).count() == 6
    assert rec.audit_write_failures == 0


def test_without_group_commit_jobs_never_suspend(session):
    runs = _runs(session, 5)
    committer = get_committer()
    ops = committer.ops

    async def main():
        await asyncio.gather(
            *(db(record_full_run, r, recorder=RunRecorder.for_run(r, group_commit=False)) for r in runs)
        )

    asyncio.run(main())
    assert committer.ops == ops  # the direct path: each decision its own transaction on its thread
    for run in runs:
        run.refresh_from_db()
        assert run.status == RunStatus.SUCCESS and verify_chain(_events(run.run_id)).valid


def test_shutdown_between_loops_recreates_the_pool(session):
    (run,) = _runs(session, 1)
    rec = RunRecorder.for_run(run, group_commit=True)
    asyncio.run(db(rec.run_started))
    runtime_db.shutdown_pools()
    asyncio.run(db(rec.release, decision="PUBLISHED", reason="ok"))
    assert [e.sequence_no for e in _events(run.run_id)] == [1, 2]


def test_a_cancelled_caller_s_suspended_decision_still_commits_and_frees_its_run(session):
    """Cancelling the task that awaits a suspended decision (a client gone, a timeout) stops the wait
    only: the job resumes on its thread once its batch committed, so the decision is durable and the
    recorder's lock is free for the run's next decision."""
    (run,) = _runs(session, 1)

    async def main():
        rec = RunRecorder.for_run(run, group_commit=True)
        batcher = batch_writer()
        with batcher.hold():
            task = asyncio.ensure_future(db(rec.run_started))
            while batcher.queued() < 1:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        await db(rec.finish, status=RunStatus.SUCCESS, content="a")
        return rec

    rec = asyncio.run(main())
    events = _events(run.run_id)
    assert [e.event_type for e in events] == ["RUN_STARTED", "RUN_FINISHED"] and verify_chain(events).valid
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS and rec.audit_write_failures == 0
