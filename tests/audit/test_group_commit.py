"""Group commit (audit/write/group_commit.py) keeps every recorder guarantee: concurrent runs from many
threads share transactions yet stay gapless, chained and complete; a write that fails inside a batch fails
alone and is counted exactly; a method returns only once its batch committed; the second-writer clash still
reloads the chain head. Also the compound-statement write path on MariaDB (audit/write/ops.py).

These tests are `transaction=True`: group commit writes on whichever writer thread leads a batch, and a
separate connection cannot see rows of a test transaction."""

import threading

import pytest
from django.db import OperationalError, connection

from audit.models import AgentStep, ToolInvocation, TraceEvent
from audit.verify.hash_chain import verify_chain
from audit.write import DeclaredToolCall, RunRecorder
from audit.write.group_commit import GroupCommitter, get_committer
from diagnosis import services
from diagnosis.models import DiagnosisRun, RunStatus
from reasoning.capture import build_capture
from reasoning.models import AgentReasoningAudit
from tests.audit.support import in_threads, join_threads, reasoning_row, wait_queued
from tests.factories import record_full_run, usage

pytestmark = pytest.mark.django_db(transaction=True)


def _events(run_id):
    return list(TraceEvent.objects.filter(run_id=run_id).order_by("sequence_no"))


def _complete(run):
    run.refresh_from_db()
    events = _events(run.run_id)
    assert [e.sequence_no for e in events] == list(range(1, len(events) + 1))
    assert verify_chain(events).valid
    assert run.expected_events == len(events)
    assert run.expected_steps == AgentStep.objects.filter(run_id=run.run_id).count()
    assert run.expected_tools == ToolInvocation.objects.filter(run_id=run.run_id).count()
    assert AgentReasoningAudit.objects.filter(run_id=run.run_id).count() == run.expected_steps
    assert run.audit_write_failures == 0 and run.status == RunStatus.SUCCESS
    return run


@pytest.fixture
def runs(user):
    session = services.create_session(owner=user)
    return [services.create_run(session=session, query=f"q{i}") for i in range(10)]


def test_concurrent_full_runs_from_many_threads_are_complete_and_chained(runs):
    committer = get_committer()
    before = committer.ops
    barrier = threading.Barrier(len(runs))

    def record(run):
        barrier.wait()
        record_full_run(run, tools=3, extra_steps=1, recorder=RunRecorder.for_run(run, group_commit=True))

    join_threads(*in_threads([lambda r=r: record(r) for r in runs]))
    for run in runs:
        _complete(run)
    per_run = TraceEvent.objects.filter(run_id=runs[0].run_id).count()
    assert per_run == 21
    assert committer.ops - before >= len(runs) * 18  # every decision went through the committer


def test_queued_decisions_of_many_runs_commit_in_one_batch(runs):
    committer = get_committer()
    recorders = [RunRecorder.for_run(r, group_commit=True) for r in runs]
    committer.largest_batch = 0
    with committer.hold():
        threads, errors = in_threads([lambda rec=rec: rec.run_started() for rec in recorders])
        wait_queued(committer, len(runs))
        assert committer.largest_batch == 0  # held: nothing written yet
    join_threads(threads, errors)
    assert committer.largest_batch == len(runs)
    for run in runs:
        run.refresh_from_db()
        assert run.status == RunStatus.RUNNING and run.expected_events == 1
        assert [e.sequence_no for e in _events(run.run_id)] == [1]


class _FailEventsOf:
    """Execute wrapper: rejects every INSERT into the timeline that carries `run_id` (a bad write)."""

    def __init__(self, run_id):
        self.run_id, self.fired = run_id, 0
        self.lock = threading.Lock()

    def __call__(self, execute, sql, params, many, context):
        if "INSERT INTO" in sql and "diagnosis_trace_event" in sql and self.run_id in (params or ()):
            with self.lock:
                self.fired += 1
            raise OperationalError(1205, "Lock wait timeout exceeded")
        return execute(sql, params, many, context)


def test_a_bad_write_in_a_batch_fails_alone_and_is_counted_exactly(runs, caplog):
    committer = get_committer()
    victim, others = runs[0], runs[1:]
    recorders = {r.run_id: RunRecorder.for_run(r, group_commit=True) for r in runs}
    fail = _FailEventsOf(victim.run_id)
    retried = committer.retried_batches
    with committer.execute_wrapper(fail):
        with committer.hold():
            threads, errors = in_threads([lambda rec=rec: rec.run_started() for rec in recorders.values()])
            wait_queued(committer, len(runs))
        join_threads(threads, errors)
        # A second decision of every run, again in one batch with the victim's.
        with committer.hold():
            threads, errors = in_threads(
                [
                    lambda rec=rec: rec.release(decision="PUBLISHED", reason="guards passed")
                    for rec in recorders.values()
                ]
            )
            wait_queued(committer, len(runs))
        join_threads(threads, errors)
    assert committer.retried_batches >= retried + 2  # each failed batch was retried op by op
    assert fail.fired == 4  # per decision: once in its batch, once alone
    for rec in recorders.values():
        rec.finish(status=RunStatus.SUCCESS, content="answer")
    for run in others:
        run.refresh_from_db()
        assert run.audit_write_failures == 0 and run.expected_events == 3
        events = _events(run.run_id)
        assert [e.event_type for e in events] == ["RUN_STARTED", "RELEASE_DECISION", "RUN_FINISHED"]
        assert verify_chain(events).valid
    victim.refresh_from_db()
    assert victim.audit_write_failures == 2 == recorders[victim.run_id].audit_write_failures
    assert victim.expected_events == 3
    assert [e.sequence_no for e in _events(victim.run_id)] == [1]  # only RUN_FINISHED, no hole
    assert verify_chain(_events(victim.run_id)).valid
    # The failed transactions rolled back whole: the run-row fields written with those events are absent.
    assert victim.started_at is None and victim.release_decision == "PUBLISHED"  # set again by finish
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert f"audit write failed run={victim.run_id} op=run_started" in logged
    assert "Lock wait timeout" not in logged


def test_a_method_returns_only_after_its_batch_committed(runs):
    """What a recorder method wrote is visible to another connection the moment it returns."""
    run = runs[0]
    seen = {}

    def worker():
        rec = RunRecorder.for_run(run, group_commit=True)
        rec.run_started()
        seen["status"] = DiagnosisRun.objects.get(pk=run.pk).status  # this thread's own connection
        seen["events"] = TraceEvent.objects.filter(run_id=run.run_id).count()

    join_threads(*in_threads([worker]))
    assert seen == {"status": RunStatus.RUNNING, "events": 1}


def test_second_writer_collision_reloads_head_through_group_commit(runs):
    run = runs[0]
    a = RunRecorder.for_run(run, group_commit=True)
    b = RunRecorder.for_run(run, group_commit=True)
    assert not connection.in_atomic_block  # so these writes really go through the committer
    ops = get_committer().ops
    a.run_started()
    b.release(decision="BLOCKED", reason="swept")
    assert get_committer().ops >= ops + 3  # a's write, b's clash, b's retry
    events = _events(run.run_id)
    assert [e.sequence_no for e in events] == [1, 2]
    assert verify_chain(events).valid
    assert b.audit_write_failures == 0


def test_step_ids_come_back_from_a_batch_and_reach_the_tool_rows(runs):
    committer = get_committer()
    recorders = [RunRecorder.for_run(r, group_commit=True) for r in runs[:4]]

    def declare(rec):
        rec.model_step(
            step_index=1,
            agent_name="diagnosis_agent",
            model="m",
            usage=usage(1, 1),
            reasoning=build_capture(reasoning="why", text=""),
            tool_calls=[DeclaredToolCall(tool_call_id="c1", name="lookup_knowledge", arguments="{}")],
        )

    with committer.hold():
        threads, errors = in_threads([lambda rec=rec: declare(rec) for rec in recorders])
        wait_queued(committer, len(recorders))
    join_threads(threads, errors)
    for rec in recorders:
        rec.tool_started(tool_call_id="c1", tool_name="lookup_knowledge", input_params={})
        step = AgentStep.objects.get(run_id=rec.run_id)
        tool = ToolInvocation.objects.get(run_id=rec.run_id)
        assert tool.step_id == step.pk and tool.step_index == 1


@pytest.mark.mariadb
def test_a_real_database_error_in_a_compound_batch_fails_only_its_op(runs):
    """No execute wrapper: the batch is one compound statement; a value the server rejects (a tool name
    longer than its column, strict mode) rolls back the batch, and the op-by-op retry isolates it."""
    committer = get_committer()
    recorders = [RunRecorder.for_run(r, group_commit=True) for r in runs[:5]]
    for rec in recorders:
        rec.model_step(
            step_index=1,
            agent_name="diagnosis_agent",
            model="m",
            usage=usage(1, 1),
            reasoning=build_capture(reasoning=None, text=""),
            tool_calls=[DeclaredToolCall(tool_call_id="c1", name="t", arguments="{}")],
        )
    bad = recorders[0]
    retried = committer.retried_batches
    with committer.hold():
        threads, errors = in_threads(
            [lambda: bad.tool_started(tool_call_id="c1", tool_name="x" * 100, input_params={})]
            + [
                lambda rec=rec: rec.tool_started(tool_call_id="c1", tool_name="t", input_params={"q": 1})
                for rec in recorders[1:]
            ]
        )
        wait_queued(committer, len(recorders))
    join_threads(threads, errors)
    assert committer.retried_batches == retried + 1
    assert bad.audit_write_failures == 1
    assert not ToolInvocation.objects.filter(run_id=bad.run_id).exists()
    assert [e.sequence_no for e in _events(bad.run_id)] == [1, 2]  # the step's events; no hole
    for rec in recorders[1:]:
        assert rec.audit_write_failures == 0
        assert ToolInvocation.objects.get(run_id=rec.run_id).status == "RUNNING"
        assert [e.sequence_no for e in _events(rec.run_id)] == [1, 2, 3]


@pytest.mark.mariadb
def test_compound_write_keeps_the_database_error_class_and_rolls_back(runs):
    """A duplicate step index inside a compound transaction: IntegrityError, nothing of it stored."""
    from audit.write import ops
    from audit.write.rows import tables as _tables

    t = _tables()
    run = runs[0]
    RunRecorder.for_run(run, group_commit=False).model_step(
        step_index=1,
        agent_name="a",
        model="m",
        usage=usage(1, 1),
        reasoning=build_capture(reasoning=None, text=""),
    )
    from django.db import IntegrityError
    from django.utils import timezone

    now = timezone.now()
    op = ops.WriteOp(
        inserts=[
            reasoning_row(run, step_index=9),
            ops.Insert(
                t.step,
                t.step.row(
                    run_id=run.run_id,
                    session_id=run.session_id,
                    step_index=1,
                    agent_name="a",
                    model="m",
                    created_at=now,
                ),
                want_id=True,
            ),
        ]
    )
    assert connection.mysql_is_mariadb and not connection.execute_wrappers
    with pytest.raises(IntegrityError):
        ops.execute([op], connection)
    assert not AgentReasoningAudit.objects.filter(run_id=run.run_id, step_index=9).exists()
    assert not connection.in_atomic_block
    assert AgentStep.objects.filter(run_id=run.run_id).count() == 1


def test_committer_releases_every_writer_when_a_batch_raises_a_bug():
    """A non-database exception while writing a batch fails its ops; nobody waits forever."""
    from audit.write.ops import Update, WriteOp

    class Broken:
        db_table = "diagnosis_run"

        def prep_columns(self, *args):
            raise TypeError("boom")

        def update_sql(self, *args):
            return ""

    committer = GroupCommitter()
    ops = [WriteOp(updates=[Update(Broken(), ("status",), ("X",), ("run_id",), (str(i),))]) for i in range(4)]
    with committer.hold():
        threads, errors = in_threads([lambda op=op: committer.submit(op) for op in ops])
        wait_queued(committer, len(ops))
    join_threads(threads, errors)
    assert all(isinstance(op.error, TypeError) for op in ops)
    assert committer.queued() == 0
