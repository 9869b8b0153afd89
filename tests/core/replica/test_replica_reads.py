"""Reads on a real MariaDB replica (`core.db_router`, `core.replica`; docs/reliability.md, *Reads on a
replica*): which database each kind of query reads, that the replica's answers are replicated data, and
that a replica lagging past `DATABASE_REPLICA_MAX_LAG_SECONDS` or stopped sends reads back to the primary,
and a replica started again takes them back, with no error under a small concurrent load.

The pair is scripts/mariadb-replica.sh's (primary :3307 with its binary log, replica :3308 read-only,
GTID replication); the runs are executed by the real runtime against the fake OpenAI-compatible server."""

from __future__ import annotations

import threading
import time

import pytest
from django.contrib.auth import get_user_model
from django.db import connections, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext

from bench import replica_pair
from core import db_router
from core.replica import monitor
from tests.agent.runtime.support import ask, script_reasoned_diagnosis

# No `db` fixture here (nor `django_user_model`, which requests it): the tests run on the pair's own
# database (tests/core/replica/conftest.py), outside pytest-django's test database and its transaction.
pytestmark = pytest.mark.replica


def _usable(*, after: float | None = None) -> bool:
    state = monitor.state()
    return state.usable(1.5) and (after is None or (state.watermark or 0) >= after)


def _finished_run(llm, username: str):
    """A run executed to its end by the runtime on the pair's primary, visible on the replica."""
    user = get_user_model().objects.create_user(username, password="pw-replica-1", is_staff=True)
    script_reasoned_diagnosis(llm)
    run, _outcome, _sink = ask(user, "Disk full on /var/log: what now?")
    assert run.is_terminal
    replica_pair.wait_replicated()
    # The trace goes to the replica once its watermark passes the run's end (plus the commit margin).
    after = run.finished_at.timestamp() + db_router.COMMIT_MARGIN_SECONDS
    assert replica_pair.wait_for(lambda: _usable(after=after), timeout=10)
    return user, run


def _queries(fn):
    """(result, queries on the primary, queries on the replica) of `fn()`."""
    with (
        CaptureQueriesContext(connections["default"]) as primary,
        CaptureQueriesContext(connections["replica"]) as replica,
    ):
        result = fn()
    return result, len(primary.captured_queries), len(replica.captured_queries)


def _reads(database: str, reason: str) -> int:
    return db_router.read_counts().get((database, reason), 0)


def test_the_router_sends_each_kind_of_query_where_it_belongs(replica_up, llm, corpus, runtime_pools):
    from audit.read.trace import get_trace
    from audit.transparency.evidence import build_bundle
    from diagnosis.models import ChatSession, DiagnosisRun
    from reasoning.selectors import get_reasoning_records
    from telemetry.metrics import record_metrics

    _user, run = _finished_run(llm, "replica-kinds")
    assert replica_pair.replica_port_of_alias("replica") == replica_pair.REPLICA_PORT
    assert replica_pair.replica_port_of_alias("default") == replica_pair.PRIMARY_PORT

    # The read paths: all their queries on the replica, none on the primary.
    trace, on_primary, on_replica = _queries(lambda: get_trace(run=run))
    assert (on_primary, on_replica > 0) == (0, True)
    assert trace.timeline and trace.summary.audit_complete and trace.summary.chain_valid
    records, on_primary, on_replica = _queries(lambda: get_reasoning_records(run_id=run.run_id))
    assert len(records) == 4 and on_primary == 0 and on_replica > 0
    bundle, on_primary, on_replica = _queries(lambda: build_bundle(run=run))
    assert bundle["runId"] == run.run_id and on_primary == 0 and on_replica > 0
    _families, on_primary, on_replica = _queries(record_metrics)
    assert on_primary == 0 and on_replica > 0

    # Everything else reads the primary: plain ORM reads outside a scope (the lease, the services)...
    _, on_primary, on_replica = _queries(lambda: DiagnosisRun.objects.get(run_id=run.run_id))
    assert (on_primary, on_replica) == (1, 0)

    # ... a read inside a transaction (select_for_update: what must read its own writes) ...
    def locked():
        with transaction.atomic():
            DiagnosisRun.objects.select_for_update().get(run_id=run.run_id)
            return get_trace(run=run)

    _, on_primary, on_replica = _queries(locked)
    assert on_primary > 0 and on_replica == 0

    # ... a write inside a replica scope (and the replica account could not write anyway) ...
    def write_in_scope():
        with db_router.replica_reads() as alias:
            assert alias == "replica"
            ChatSession.objects.filter(session_id=run.session_id).update(title="renamed")

    _, on_primary, on_replica = _queries(write_in_scope)
    assert (on_primary, on_replica) == (1, 0)
    # ... and the trace of a run still running (live attach reads what was just written).
    live = DiagnosisRun.objects.get(run_id=run.run_id)
    live.status = "RUNNING"
    before = _reads("primary", "fresh")
    _, on_primary, on_replica = _queries(lambda: get_trace(run=live))
    assert on_replica == 0 and on_primary > 0 and _reads("primary", "fresh") == before + 1


def test_admin_pages_read_the_replica_and_a_user_who_wrote_reads_the_primary(
    replica_up, llm, corpus, runtime_pools
):
    user, run = _finished_run(llm, "replica-admin")
    user.is_superuser = True
    user.save()
    replica_pair.wait_replicated()
    client = Client()
    client.force_login(user)
    for url in ("/admin/diagnosis/diagnosisrun/", f"/admin/diagnosis/diagnosisrun/{run.pk}/change/"):
        before = _reads("replica", "replica")
        response, _p, on_replica = _queries(lambda url=url: client.get(url))
        assert response.status_code == 200 and run.run_id in response.content.decode()
        assert on_replica > 0 and _reads("replica", "replica") > before
    # A POST (whatever it changed) pins this user's reads to the primary for DATABASE_REPLICA_PIN_SECONDS.
    client.post("/admin/diagnosis/diagnosisrun/", {})
    before = _reads("primary", "pinned")
    response, _on_primary, on_replica = _queries(lambda: client.get("/admin/diagnosis/diagnosisrun/"))
    assert response.status_code == 200 and on_replica == 0 and _reads("primary", "pinned") == before + 1
    time.sleep(2.1)
    response, _p, on_replica = _queries(lambda: client.get("/admin/diagnosis/diagnosisrun/"))
    assert response.status_code == 200 and on_replica > 0


def test_reads_see_replicated_data_and_metrics_show_the_lag(replica_up):
    from diagnosis import services
    from diagnosis.models import ChatSession

    owner = get_user_model().objects.create_user("replica-data", password="pw-replica-1")
    session = services.create_session(owner=owner, title="replicated")
    replica_pair.wait_replicated()
    with db_router.replica_reads() as alias:
        assert alias == "replica"
        assert ChatSession.objects.get(session_id=session.session_id).title == "replicated"
    # Written on the primary, not yet on the replica: the replica really is another server.
    replica_pair.sql(replica_pair.REPLICA_PORT, "STOP SLAVE SQL_THREAD")
    try:
        services.create_session(owner=owner, title="later", session_id="ses_replica_later")
        with db_router.replica_reads(), pytest.raises(ChatSession.DoesNotExist):
            ChatSession.objects.get(session_id="ses_replica_later")
    finally:
        replica_pair.sql(replica_pair.REPLICA_PORT, "START SLAVE SQL_THREAD")
    replica_pair.wait_replicated()
    monitor.reset()
    assert replica_pair.wait_for(_usable, timeout=10)
    client = Client()
    body = client.get("/metrics").content.decode()
    assert "diagnosis_db_replica_healthy 1.0" in body
    assert "diagnosis_db_replica_lag_seconds" in body
    assert 'diagnosis_db_replica_reads_total{database="replica",reason="replica"}' in body


def test_a_lagging_replica_sends_reads_to_the_primary_until_it_catches_up(
    replica_up, llm, corpus, runtime_pools
):
    from audit.read.trace import get_trace

    _user, run = _finished_run(llm, "replica-lag")
    replica_pair.sql(replica_pair.REPLICA_PORT, "STOP SLAVE SQL_THREAD")
    try:
        # The heartbeat written on the primary ages on the replica: past 1.5 s the replica is lagging.
        state = replica_pair.wait_for(lambda: monitor.state().state == "lagging" and monitor.peek(), 10)
        assert state and state.lag > 1.5
        before = _reads("primary", "lagging")
        trace, on_primary, on_replica = _queries(lambda: get_trace(run=run))
        assert on_replica == 0 and on_primary > 0 and trace.summary.chain_valid
        assert _reads("primary", "lagging") == before + 1
        body = Client().get("/metrics").content.decode()
        assert "diagnosis_db_replica_healthy 0.0" in body
    finally:
        replica_pair.sql(replica_pair.REPLICA_PORT, "START SLAVE SQL_THREAD")
    assert replica_pair.wait_for(_usable, timeout=10)
    _trace, on_primary, on_replica = _queries(lambda: get_trace(run=run))
    assert on_primary == 0 and on_replica > 0


def test_a_replica_stopped_and_started_under_load_costs_no_error(replica_up, llm, corpus, runtime_pools):
    """Four threads read traces and the run list while the replica server is stopped and started again:
    no read fails; reads move to the primary while it is down and come back once it answers."""
    from audit.read.trace import get_trace

    user, run = _finished_run(llm, "replica-load")
    user.is_superuser = True
    user.save()
    replica_pair.wait_replicated()
    errors: list[BaseException] = []
    served = {"trace": 0, "list": 0}
    stop = threading.Event()

    def reader(kind: str) -> None:
        client = Client()
        if kind == "list":
            client.force_login(user)
        try:
            while not stop.is_set():
                try:
                    if kind == "trace":
                        assert get_trace(run=run).summary.chain_valid
                    else:
                        assert client.get("/admin/diagnosis/diagnosisrun/").status_code == 200
                    served[kind] += 1
                except BaseException as exc:
                    errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=reader, args=(k,)) for k in ("trace", "trace", "list", "list")]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        on_replica_before = _reads("replica", "replica")
        replica_pair.stop_replica()
        down_before = _reads("primary", "down") + _reads("primary", "failover")
        time.sleep(2.0)
        assert monitor.peek().state == "down"
        assert _reads("primary", "down") + _reads("primary", "failover") > down_before
        replica_pair.start_replica()
        replica_pair.wait_replicated()
        back = _reads("replica", "replica")
        assert replica_pair.wait_for(lambda: _reads("replica", "replica") > back + 5, timeout=15)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert errors == []
    assert served["trace"] > 10 and served["list"] > 10
    assert _reads("replica", "replica") > on_replica_before
