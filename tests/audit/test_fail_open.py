"""Durable audit is fail-open for every error, and a failure stays in its own run.

A non-database exception in each audit write path (a timeline event, a model step, a reasoning row whose
encryption fails, a tool start, a tool terminal, a run-row update, the run's finish), with and without
group commit: the run ends as it would have (SUCCESS with its release), the failure is counted and shows
in the trace gaps, nothing with content is logged, and another run written at the same time is
untouched. Through the real runtime, the real `openai` SDK against the local fake provider and the real
database; the faults are raised from Django execute wrappers on the runtime's connections (where the
write path's own statements run), the encryption failure comes from an unusable key.

Group commit needs connections outside any test transaction on a server database: those variants run on
MariaDB only (`transaction=True` throughout)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading

import pytest
from django.db import connection

from agent.runtime.executor import execute_run, prepare_run
from agent.runtime.llm import aclose_clients
from audit.models import AgentStep, ToolInvocation, TraceEvent
from audit.read import get_trace
from audit.write import RunRecorder
from audit.write.group_commit import get_committer
from diagnosis import services
from diagnosis.models import ReleaseDecision, RunStatus
from reasoning.capture import build_capture
from reasoning.models import AgentReasoningAudit
from tests.agent.runtime.support import AGENT, CollectingSink, evidence_ids, in_every_runtime_thread
from tests.audit.support import in_threads, join_threads, wait_queued
from tests.factories import usage
from tests.fakes.openai_server import stream_answer, stream_tool_calls

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("runtime_pools")]

SECRET = "rejected-value-5d0c"
QUERY = "nginx answers 502 after the deploy (ticket 4471)"
OTHER_QUERY = "nginx 502 from the upstream since this morning"
MODES = {"direct": False, "group-commit": True}


class RaiseFor:
    """Execute wrapper: a statement of the victim run matching `verb`, `table`, `sql_has` and `param`
    raises `exc` (a non-database error, as the write path or a serialiser raises), with a message that
    quotes a value. `same_op`: only the statement first matched fires again (its batch retry), not a
    later write of the same kind (e.g. the finish's own retry)."""

    def __init__(self, verb, table, *, sql_has="", param=None, exc=RuntimeError, same_op=False):
        self.verb, self.table, self.sql_has, self.param = verb, table, sql_has, param
        self.exc, self.same_op = exc, same_op
        self.run_id = None
        self.key = None
        self.fired = 0
        self.lock = threading.Lock()

    def __call__(self, execute, sql, params, many, context):
        values = list(params or ())
        # The statement's target table (an UPDATE of the run's stored facts names the audit tables in
        # its subqueries only).
        target = sql.split(" SET ", 1)[0] if self.verb == "UPDATE" else sql
        if (
            sql.lstrip().upper().startswith(self.verb)
            and self.table in target
            and self.sql_has in sql
            and self.run_id in values
            and (self.param is None or self.param in values)
        ):
            with self.lock:
                # The statement's own values, not its WHERE clause: a batch and its op-by-op retry
                # write the same values but fence them differently (the epoch joins a lone UPDATE's WHERE).
                where = values.index(self.run_id) if self.verb == "UPDATE" else len(values)
                key = tuple(map(str, values[:where]))
                fire = not (self.same_op and self.key is not None and key != self.key)
                if fire:
                    self.key = key
                    self.fired += 1
            # Outside the lock: the wrapper may be installed twice on one connection (it then runs
            # nested around the same statement).
            if fire:
                raise self.exc(f"{SECRET}: {QUERY}")
        return execute(sql, params, many, context)


# point -> (wrapper, failed op, error class, gap naming what was lost)
POINTS = {
    "timeline-event": (
        lambda: RaiseFor("INSERT", "diagnosis_trace_event", param="EVIDENCE_GUARD_INITIAL"),
        "evidence_guard",
        "RuntimeError",
        "1 timeline event expected but not stored",
    ),
    "model-step": (
        lambda: RaiseFor("INSERT", "agent_step", param="tool_calls", exc=TypeError),
        "model_step",
        "TypeError",
        "1 model step expected but not stored",
    ),
    "tool-start": (
        lambda: RaiseFor("INSERT", "tool_invocation", param="RUNNING"),
        "tool_started",
        "RuntimeError",
        "1 timeline event expected but not stored",
    ),
    "tool-terminal": (
        lambda: RaiseFor("UPDATE", "tool_invocation", exc=ValueError),
        "tool_finished",
        "ValueError",
        "tool call c_kb still RUNNING after the run ended",
    ),
    "run-update": (
        lambda: RaiseFor("UPDATE", "diagnosis_run", sql_has="first_model_request_at"),
        "model_call_started",
        "RuntimeError",
        None,
    ),
    "run-finished-event": (
        lambda: RaiseFor("INSERT", "diagnosis_trace_event", param="RUN_FINISHED"),
        "run_finished",
        "RuntimeError",
        "1 timeline event expected but not stored",
    ),
    "finish": (
        lambda: RaiseFor("UPDATE", "diagnosis_run", sql_has="tokens_reconciled", same_op=True),
        "finish",
        "RuntimeError",
        None,
    ),
}


def _agent(request):
    if any(m.get("role") == "tool" for m in request.messages):
        ids = evidence_ids(request)
        return stream_answer(f"Check that the upstream listens on its port [{ids[0]}].")
    return stream_tool_calls([("c_kb", "lookup_knowledge", '{"query": "nginx 502 upstream"}')])


def _script(llm, runs):
    for _ in range(runs):
        llm.route("DIAGNOSIS")
        llm.add(AGENT, _agent, _agent)
        llm.supported()


def _execute_together(run_ids):
    async def main():
        try:
            return await asyncio.gather(*(execute_run(run_id=r, sink=CollectingSink()) for r in run_ids))
        finally:
            await aclose_clients()

    return asyncio.run(main())


def _log_text(caplog):
    return "\n".join(f"{r.name} {r.getMessage()}" for r in caplog.records)


def _assert_nothing_with_content_logged(caplog, *runs):
    text = _log_text(caplog) + caplog.text
    assert SECRET not in text
    for run in runs:
        assert run.query not in text
        if run.content:
            assert run.content not in text


def _assert_unaffected(run):
    assert run.status == RunStatus.SUCCESS and run.release_decision == ReleaseDecision.PUBLISHED
    assert run.audit_write_failures == 0
    summary = get_trace(run=run).summary
    assert summary.audit_complete, summary.gaps


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("point", POINTS)
def test_a_non_database_error_in_an_audit_write_costs_only_its_own_record(
    llm, corpus, user, settings, caplog, point, mode
):
    if MODES[mode] and connection.vendor != "mysql":
        pytest.skip("group commit needs MariaDB")
    settings.AUDIT_GROUP_COMMIT = MODES[mode]
    make_wrapper, op, error, lost = POINTS[point]
    wrapper = make_wrapper()
    victim = prepare_run(user=user, query=QUERY)
    bystander = prepare_run(user=user, query=OTHER_QUERY)
    wrapper.run_id = victim.run_id
    _script(llm, 2)

    # With group commit the committer also installs the wrapper on whichever connection leads a batch
    # (an execute wrapper that raises never calls the next one, so a statement fires at most once).
    batches = get_committer().execute_wrapper(wrapper) if MODES[mode] else contextlib.nullcontext()
    with in_every_runtime_thread(wrapper), batches, caplog.at_level(logging.DEBUG):
        outcomes = _execute_together([victim.run_id, bystander.run_id])
    victim.refresh_from_db()
    bystander.refresh_from_db()

    assert wrapper.fired >= 1, (
        [(o.status, o.error_code) for o in outcomes],
        victim.audit_write_failures,
        list(AgentStep.objects.filter(run_id=victim.run_id).values_list("step_index", "finish_reason")),
    )
    # The run ends as it would have: released, published, the answer the guards checked.
    assert [o.status for o in outcomes] == [RunStatus.SUCCESS, RunStatus.SUCCESS]
    assert victim.status == RunStatus.SUCCESS and victim.release_decision == ReleaseDecision.PUBLISHED
    assert victim.content == outcomes[0].content and "[kb:nginx-502#" in victim.content
    assert victim.error_code == ""
    # The failure is counted (once: the decision it cost), logged by op and class, shown as a gap.
    assert victim.audit_write_failures == 1
    logged = _log_text(caplog)
    assert logged.count(f"audit write failed run={victim.run_id} op={op} error={error}") == 1
    summary = get_trace(run=victim).summary
    assert not summary.audit_complete and summary.chain_valid
    assert summary.audit_write_failures == 1
    assert "1 audit write failure recorded" in summary.gaps
    if lost:
        assert lost in summary.gaps
    if op == "tool_started":
        # The terminal's row stands in for the lost RUNNING row, with the real input.
        tool = ToolInvocation.objects.get(run_id=victim.run_id)
        assert tool.status == "SUCCEEDED" and tool.input_params["query"] == "nginx 502 upstream"
    _assert_nothing_with_content_logged(caplog, victim, bystander)
    # The run written at the same time is untouched.
    _assert_unaffected(bystander)


@pytest.mark.parametrize("mode", MODES)
def test_an_unusable_encryption_key_costs_only_the_model_steps_records(
    llm, corpus, user, settings, caplog, mode
):
    if MODES[mode] and connection.vendor != "mysql":
        pytest.skip("group commit needs MariaDB")
    settings.AUDIT_GROUP_COMMIT = MODES[mode]
    settings.REASONING_ENCRYPTION_KEYS = ["not-a-fernet-key"]
    run = prepare_run(user=user, query=QUERY)
    _script(llm, 1)

    with caplog.at_level(logging.DEBUG):
        (outcome,) = _execute_together([run.run_id])
    run.refresh_from_db()

    assert outcome.status == run.status == RunStatus.SUCCESS
    assert run.release_decision == ReleaseDecision.PUBLISHED and "[kb:nginx-502#" in run.content
    # Each decision that writes a reasoning row is lost (its events with it), nothing else: the routing
    # attempt, the two model steps (step row, reasoning row, two events) and the semantic guard decision.
    assert run.audit_write_failures == 4
    logged = _log_text(caplog)
    for op, times in (("routing_attempt", 1), ("model_step", 2), ("semantic_guard", 1)):
        assert (
            logged.count(f"audit write failed run={run.run_id} op={op} error=ImproperlyConfigured") == times
        )
    assert not AgentStep.objects.filter(run_id=run.run_id).exists()
    assert not AgentReasoningAudit.objects.filter(run_id=run.run_id).exists()
    tool = ToolInvocation.objects.get(run_id=run.run_id)
    assert tool.status == "SUCCEEDED"
    summary = get_trace(run=run).summary
    assert summary.chain_valid and not summary.audit_complete
    assert "4 audit write failures recorded" in summary.gaps
    assert "2 model steps expected but not stored" in summary.gaps
    assert "8 timeline events expected but not stored" in summary.gaps
    _assert_nothing_with_content_logged(caplog, run)


# --------------------------------------------------------------------------------------------------
# Group commit: one bad op in a batch of many runs' decisions
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def runs(user):
    session = services.create_session(owner=user)
    return [services.create_run(session=session, query=f"{QUERY} {i}") for i in range(6)]


def _events(run_id):
    return [e.event_type for e in TraceEvent.objects.filter(run_id=run_id).order_by("sequence_no")]


@pytest.mark.mariadb
def test_a_non_database_error_in_a_batch_fails_only_its_op(runs, caplog):
    committer = get_committer()
    victim, others = runs[0], runs[1:]
    recorders = {r.run_id: RunRecorder.for_run(r, group_commit=True) for r in runs}
    fail = RaiseFor("INSERT", "diagnosis_trace_event")
    fail.run_id = victim.run_id
    retried = committer.retried_batches
    with committer.execute_wrapper(fail), caplog.at_level(logging.DEBUG):
        with committer.hold():
            threads, errors = in_threads([lambda rec=rec: rec.run_started() for rec in recorders.values()])
            wait_queued(committer, len(runs))
        join_threads(threads, errors)
    assert committer.retried_batches == retried + 1
    assert fail.fired == 2  # in its batch, then alone
    for run in others:
        run.refresh_from_db()
        assert run.status == RunStatus.RUNNING and run.audit_write_failures == 0
        assert _events(run.run_id) == ["RUN_STARTED"]
    victim.refresh_from_db()
    assert victim.audit_write_failures == 1 == recorders[victim.run_id].audit_write_failures
    assert _events(victim.run_id) == [] and victim.started_at is None
    assert f"audit write failed run={victim.run_id} op=run_started error=RuntimeError" in _log_text(caplog)
    _assert_nothing_with_content_logged(caplog, *runs)


@pytest.mark.mariadb
def test_a_reasoning_row_that_cannot_be_encrypted_costs_only_its_step_in_a_batch(runs, settings, caplog):
    committer = get_committer()
    victim, others = runs[0], runs[1:]
    recorders = {r.run_id: RunRecorder.for_run(r, group_commit=True) for r in runs}
    settings.REASONING_ENCRYPTION_KEYS = ["not-a-fernet-key"]

    def step(rec):
        rec.model_step(
            step_index=1,
            agent_name="diagnosis_agent",
            model="m",
            usage=usage(1, 1),
            reasoning=build_capture(reasoning=f"because {QUERY}", text="answer"),
        )

    retried = committer.retried_batches
    with caplog.at_level(logging.DEBUG):
        with committer.hold():
            fns = [lambda: step(recorders[victim.run_id])]
            fns += [
                lambda rec=recorders[r.run_id]: rec.release(decision="PUBLISHED", reason="ok") for r in others
            ]
            threads, errors = in_threads(fns)
            # The reasoning row is encrypted while its digest is taken, before the op is queued: the
            # victim's op never reaches the batch, so the others commit without a retry.
            wait_queued(committer, len(others))
        join_threads(threads, errors)
    assert committer.retried_batches == retried
    for run in others:
        run.refresh_from_db()
        assert run.release_decision == "PUBLISHED" and run.audit_write_failures == 0
        assert _events(run.run_id) == ["RELEASE_DECISION"]
    victim.refresh_from_db()
    assert victim.audit_write_failures == 1 == recorders[victim.run_id].audit_write_failures
    assert not AgentStep.objects.filter(run_id=victim.run_id).exists()
    assert not AgentReasoningAudit.objects.filter(run_id=victim.run_id).exists()
    assert _events(victim.run_id) == []
    logged = _log_text(caplog)
    assert f"audit write failed run={victim.run_id} op=model_step error=ImproperlyConfigured" in logged
    assert "because" not in json.dumps(logged)
    _assert_nothing_with_content_logged(caplog, *runs)
