"""The node the service writes to is SIGKILLed while runs record (docs/reliability.md, *A Galera cluster
behind HAProxy*): nothing acknowledged is lost, nothing is written twice, the lease fence holds, the
transparency log stays consistent, every run verifies, and the killed node rejoins with the same data.

The cluster is scripts/mariadb-galera.sh's (three nodes, HAProxy in front with one writer at a time);
this process reaches it only through the proxy, with DATABASE_WSREP_SYNC_WAIT=1 as documented. The runs
are executed by the real runtime (its database pool, the recorder, the lease and its heartbeat) against
the fake OpenAI-compatible server. At the kill, six runs wait for their model's answer (their claim and
first decisions committed on the killed node, their connections idle) and six more have just started
(their claims and first decisions in flight).
"""

from __future__ import annotations

import asyncio
import io
import time

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection

from audit.models import EventType, LogLeaf, TraceEvent
from audit.read import get_trace
from audit.verify.hash_chain import verify_chain
from bench import galera_cluster
from diagnosis.models import DiagnosisRun, RunStatus
from tests.agent.runtime.support import (
    AGENT,
    GUARD,
    ROUTE,
    ROUTER,
    VERDICT,
    CollectingSink,
    evidence_ids,
    start_run,
)
from tests.fakes.openai_server import stream_answer, stream_tool_calls, usage

pytestmark = pytest.mark.galera

HELD, STARTING, BEFORE = 6, 6, 3
TABLES = [
    "diagnosis_run",
    "diagnosis_trace_event",
    "agent_step",
    "tool_invocation",
    "audit_log_leaf",
    "audit_checkpoint",
]


class _Gate:
    """Holds the agent's answer of the runs asked with "held" until `open()` (in the fake server's loop)."""

    def __init__(self) -> None:
        self.waiting: set[str] = set()
        self.opened = False

    def agent(self, request):
        asked = next(str(m.get("content")) for m in request.messages if m.get("role") == "user")
        if not any(m.get("role") == "tool" for m in request.messages):
            return stream_tool_calls(
                [("call_1", "lookup_knowledge", '{"query": "disk full /var/log"}')], usage=usage(200, 20)
            )
        answer = stream_answer(
            f"Find the largest log directories with du [{evidence_ids(request)[0]}].", usage=usage(300, 30)
        )
        if "held" not in asked:
            return answer
        return self._held(asked, answer)

    async def _held(self, asked, answer):
        self.waiting.add(asked)
        while not self.opened:
            await asyncio.sleep(0.01)
        return answer


def _script(llm, gate: _Gate, runs: int) -> None:
    for _ in range(runs):
        llm.add(ROUTER, stream_answer(ROUTE, usage=usage(40, 10)))
        llm.add(AGENT, gate.agent, gate.agent)
        llm.add(GUARD, stream_answer(VERDICT, usage=usage(100, 10)))


def _checkpoint() -> str:
    out = io.StringIO()
    call_command("audit_checkpoint", stdout=out)
    return out.getvalue()


def test_killing_the_written_node_mid_run_loses_nothing_acknowledged(
    galera_db, llm, corpus, runtime_pools, settings
):
    # The held runs wait for their answer until the node is killed: no model timeout meanwhile.
    settings.LLM_TIMEOUT_SECONDS = 60
    user = get_user_model().objects.create_user("galera", password="pw-galera-1", is_staff=True)
    gate = _Gate()
    _script(llm, gate, BEFORE + HELD + STARTING)
    killed = galera_cluster.writer()

    async def service():
        runs = []
        started = time.monotonic()

        async def begin(query: str):
            sink = CollectingSink()
            run, task = await start_run(user=user, query=query, sink=sink)
            runs.append((run, task, sink))
            return task

        # Runs recorded and anchored before the kill: the log has leaves and a checkpoint on every node.
        await asyncio.gather(*[await begin(f"Disk full on /var/log, before {i}") for i in range(BEFORE)])
        await asyncio.to_thread(_checkpoint)
        t0 = time.monotonic()
        print(f"\nbefore runs and checkpoint: {t0 - started:.1f} s")
        for i in range(HELD):
            await begin(f"Disk full on /var/log, held {i}")
        deadline = time.monotonic() + 30
        while len(gate.waiting) < HELD and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert len(gate.waiting) == HELD, f"{len(gate.waiting)} waiting"
        for i in range(STARTING):
            await begin(f"Disk full on /var/log, starting {i}")
        await asyncio.sleep(0.05)  # their claims and first decisions in flight
        kill_at = time.monotonic()
        await asyncio.to_thread(galera_cluster.kill_node, killed)
        gate.opened = True
        outcomes = await asyncio.wait_for(asyncio.gather(*(task for _, task, _ in runs)), timeout=60)
        return runs, outcomes, time.monotonic() - kill_at

    try:
        runs, outcomes, after_kill = asyncio.run(service())
        connection.close()  # this thread's connection died with the node (a request's would be dropped)
        assert galera_cluster.writer() != killed  # the proxy moved the writes to a surviving node
        failed = []
        for (run, _task, sink), outcome in zip(runs, outcomes, strict=True):
            run = DiagnosisRun.objects.get(run_id=run.run_id)
            events = list(TraceEvent.objects.filter(run_id=run.run_id).order_by("sequence_no"))
            # Every decision the service acknowledged (a frame with its sequence number) is stored as it was.
            stored = {e.sequence_no: e for e in events}
            acknowledged = [e.sequence_no for e in sink.events if getattr(e, "sequence_no", None)]
            assert acknowledged and set(acknowledged) <= set(stored), run.run_id
            # One gapless chain that verifies, written by one writer: one claim, nothing fenced, one end.
            assert [e.sequence_no for e in events] == list(range(1, len(events) + 1))
            assert verify_chain(events).valid
            types = [e.event_type for e in events]
            assert types.count(EventType.RUN_FINISHED) == 1 and types[-1] == EventType.RUN_FINISHED
            assert run.lease_epoch == 1 and run.fenced_writes == 0 and run.lease_owner == ""
            assert outcome.status == run.status and run.is_terminal
            summary = get_trace(run=run).summary
            assert summary.chain_valid
            # Writes in flight at the kill were retried on the surviving node (or found stored): nothing
            # failed open, every run complete. A run whose read outside the recorder met its pool
            # thread's dead connection ends FAILED INTERNAL_ERROR, its audit complete all the same.
            assert summary.audit_complete and summary.persisted == summary.expected, summary.gaps
            assert run.status == RunStatus.SUCCESS or (
                run.status == RunStatus.FAILED and run.error_code == "INTERNAL_ERROR"
            ), (run.status, run.error_code)
            if run.status == RunStatus.SUCCESS:
                assert run.tokens_reconciled
            else:
                failed.append(run.run_id)
        print(
            f"\ngalera failover: {after_kill:.1f} s from the kill to the last run's end; {len(failed)} failed"
        )
        assert len(failed) <= STARTING  # only a run starting at the kill can meet a dead connection there

        # The log: every finished run anchored once, leaves gapless, and the whole audit verifies.
        _checkpoint()
        leaves = list(LogLeaf.objects.order_by("leaf_index").values_list("leaf_index", flat=True))
        assert leaves == list(range(len(leaves))) and len(leaves) >= len(runs)
        out = io.StringIO()
        try:
            call_command("verify_audit", stdout=out)  # raises CommandError on any problem
        finally:
            print(out.getvalue())
        assert f"verified {len(runs)} run(s): {len(runs)} ok" in out.getvalue()
    finally:
        galera_cluster.start_node(killed)

    # The killed node rejoined (IST) and holds exactly what the survivors hold.
    assert galera_cluster.state(killed) == 4 and galera_cluster.cluster_size(killed) == 3
    survivor = next(n for n in galera_cluster.NODE_PORTS if n != killed)
    sums = galera_cluster.table_checksums(survivor, galera_db, TABLES)
    assert galera_cluster.table_checksums(killed, galera_db, TABLES) == sums


def test_a_certification_conflict_with_another_node_is_retried(galera_db, caplog):
    """A real Galera conflict: while the recorder's transaction holds the run row (its fence's lock),
    another node commits an update of that row; the writer node's applier aborts the local transaction
    (1213, "WSREP detected deadlock/conflict") and the recorder writes the decision again, once."""
    from audit.write import RunRecorder
    from diagnosis import services

    # A node that came back takes the writes back and the proxy closes the backup's sessions: a fresh one.
    connection.close()
    user = get_user_model().objects.create_user("galera-conflict", password="pw-galera-1")
    run = services.create_run(session=services.create_session(owner=user), query="Disk full?")
    rec = RunRecorder.for_run(run, group_commit=False)
    rec.run_started()
    other = next(n for n in galera_cluster.NODE_PORTS if n != galera_cluster.writer())
    conflicts = []

    def conflict(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if not conflicts and sql.lstrip().upper().startswith("INSERT") and "diagnosis_trace_event" in sql:
            conflicts.append(other)
            galera_cluster.sql(
                galera_cluster.NODE_PORTS[other],
                f"UPDATE `{galera_db}`.`diagnosis_run` SET `updated_at` = NOW(6) WHERE `run_id` = %s",
                (run.run_id,),
            )
            time.sleep(0.3)  # the other node's write-set reaches this node and its applier wins
        return result

    with connection.execute_wrapper(conflict):
        seq = rec.routing_decision(intent="DIAGNOSIS", confidence=0.9, reason="r", fallback=False)
    run.refresh_from_db()
    assert conflicts and seq == 2 and run.audit_write_failures == 0 and run.intent == "DIAGNOSIS"
    events = list(TraceEvent.objects.filter(run_id=run.run_id).order_by("sequence_no"))
    assert [e.sequence_no for e in events] == [1, 2] and verify_chain(events).valid
    assert "audit write retried" in caplog.text and "code=1213" in caplog.text
