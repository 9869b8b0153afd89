"""The AI Ops queue: workers claim queued runs under the run lease (never the same run twice, never a chat
run), execute them with no client connected, and an unserved queue fails visibly (QUEUE_EXPIRED)."""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import itertools
import threading
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.db import close_old_connections, connection
from django.utils import timezone

from agent.aiops import intake
from agent.runtime import supervisor
from agent.runtime.llm import aclose_clients
from agent.runtime.sweeper import QUEUE_EXPIRED, sweep_expired_runs
from agent.runtime.worker import work
from audit.verify.runs import verify_run
from diagnosis import services
from diagnosis.models import AgentFlow, DiagnosisRun, RunStatus

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("chat_settings", "runtime_pools"),
]
RUNBOOKS = Path(django_settings.BASE_DIR) / "runbooks"


def queue(user, n: int, text: str = "Nginx returns 502 Bad Gateway after the deploy") -> list[str]:
    return [intake.start_staff_analysis(user=user, query=f"{text} (#{i})").run_id for i in range(n)]


def drain(*, concurrency: int = 2) -> int:
    async def main() -> int:
        try:
            return await work(
                launch=supervisor.launch, concurrency=concurrency, poll_interval=0.05, until_idle=True
            )
        finally:
            await supervisor.stop_background()
            await aclose_clients()

    return asyncio.run(main())


def test_claims_take_the_oldest_queued_run_and_never_a_chat_run(staff_user):
    chat = services.create_run(session=services.create_session(owner=staff_user), query="chat question")
    first, second = queue(staff_user, 2)
    claimed = services.claim_next_queued(owner="w1")
    assert claimed.run_id == first and claimed.lease_owner == "w1" and claimed.lease_epoch == 1
    assert services.claim_next_queued(owner="w2").run_id == second
    assert services.claim_next_queued(owner="w3") is None
    chat.refresh_from_db()
    assert chat.lease_owner == "" and chat.agent_flow == AgentFlow.DIAGNOSIS_AGENT
    # A run cancelled while it waits is not handed to a worker.
    (third,) = queue(staff_user, 1)
    services.request_run_cancel(run_id=third)
    assert services.claim_next_queued(owner="w4") is None


def test_concurrent_workers_never_claim_the_same_run(staff_user):
    runs = set(queue(staff_user, 24))
    claims: dict[str, list[str]] = {}
    lock = threading.Lock()
    start = threading.Barrier(6)

    def worker(name: str) -> None:
        try:
            start.wait()
            while True:
                run = services.claim_next_queued(owner=name)
                if run is None:
                    # SQLite: a locked database may make a claim give up; the queue decides when done.
                    if not services.queued_runs().exists():
                        return
                    continue
                with lock:
                    claims.setdefault(run.run_id, []).append(name)
        finally:
            close_old_connections()
            connection.close()

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert set(claims) == runs
    assert all(len(owners) == 1 for owners in claims.values()), claims
    stored = dict(DiagnosisRun.objects.filter(run_id__in=runs).values_list("run_id", "lease_owner"))
    assert all(stored[r] == owners[0] for r, owners in claims.items())
    assert set(DiagnosisRun.objects.filter(run_id__in=runs).values_list("lease_epoch", flat=True)) == {1}


def test_a_worker_executes_queued_analyses_with_no_client_connected(staff_user):
    call_command("load_knowledge", str(RUNBOOKS), stdout=io.StringIO())
    ids = queue(staff_user, 3)
    assert drain(concurrency=2) == 3
    runs = list(DiagnosisRun.objects.filter(run_id__in=ids))
    assert {r.status for r in runs} == {RunStatus.SUCCESS}
    for run in runs:
        assert run.agent_flow == AgentFlow.AI_OPS and run.lease_epoch == 1 and run.lease_owner == ""
        assert run.release_decision and run.content
        assert verify_run(run.run_id).ok


@pytest.mark.parametrize("concurrency", [1, 2])
def test_the_next_run_is_claimed_while_one_finishes_and_calls_no_model_before_it_ended(
    monkeypatch, staff_user, concurrency
):
    """The hand-over overlaps the end of a run: the worker claims (and launches) its next run once the
    finishing one has made its last model call, and the new run's first model call waits until a slot
    is free. So at no moment do more than `concurrency` of the worker's runs call models, and every
    claimed run is executed."""
    from agent.runtime import worker
    from audit.write import RunRecorder

    call_command("load_knowledge", str(RUNBOOKS), stdout=io.StringIO())
    ids = queue(staff_user, 5)
    log: list[tuple[str, str]] = []  # list.append is atomic: written from the loop and pool threads
    real_db, real_started, real_finish = worker.db, RunRecorder.model_call_started, RunRecorder.finish

    claims = iter(range(100))

    async def logged_db(fn, /, *args, **kwargs):
        if fn is services.claim_next_queued:
            log.append(("claiming", next(claims)))  # asked for, on the loop
        result = await real_db(fn, *args, **kwargs)
        if fn is services.claim_next_queued and result is not None:
            log.append(("claimed", result.run_id))
        return result

    def started(self):
        log.append(("model call", self.run_id))
        return real_started(self)

    def finish(self, **kwargs):
        log.append(("finishing", self.run_id))
        try:
            return real_finish(self, **kwargs)
        finally:
            log.append(("finished", self.run_id))

    monkeypatch.setattr(worker, "db", logged_db)
    monkeypatch.setattr(RunRecorder, "model_call_started", started)
    monkeypatch.setattr(RunRecorder, "finish", finish)
    assert drain(concurrency=concurrency) == 5

    assert {r.status for r in DiagnosisRun.objects.filter(run_id__in=ids)} == {RunStatus.SUCCESS}
    assert [run for what, run in log if what == "claimed"] == ids  # each claimed once, oldest first
    calling: set[str] = set()
    for what, run in log:
        if what == "model call":
            calling.add(run)
            assert len(calling) <= concurrency, log  # never more runs calling models than slots
        elif what == "finished":
            calling.discard(run)
    # With one slot, each later run was asked for before the one before it began its terminal write,
    # and made its first model call only after that one's end.
    if concurrency == 1:
        for n, (before, after) in enumerate(itertools.pairwise(ids), start=1):
            assert log.index(("claiming", n)) < log.index(("finishing", before)), log
            assert log.index(("finished", before)) < log.index(("model call", after)), log
    assert all(verify_run(run_id).ok for run_id in ids)


def test_a_queued_run_waits_for_a_worker_and_fails_only_after_the_queue_timeout(settings, staff_user):
    settings.RUN_LEASE_SECONDS = 1
    settings.AIOPS_QUEUE_TIMEOUT_SECONDS = 60
    (run_id,) = queue(staff_user, 1)
    chat = services.create_run(session=services.create_session(owner=staff_user), query="chat question")
    later = timezone.now() + dt.timedelta(seconds=30)
    # A chat run nobody claimed within a lease is swept; the queued analysis keeps waiting.
    assert sweep_expired_runs(now=later) == [chat.run_id]
    assert DiagnosisRun.objects.get(run_id=run_id).status == RunStatus.PENDING
    assert sweep_expired_runs(now=timezone.now() + dt.timedelta(seconds=61)) == [run_id]
    run = DiagnosisRun.objects.get(run_id=run_id)
    assert (run.status, run.error_code) == (RunStatus.FAILED, QUEUE_EXPIRED)
    assert verify_run(run_id).ok


def test_manage_aiops_runs_an_analysis_and_queue_leaves_it_to_run_worker(superuser):
    call_command("load_knowledge", str(RUNBOOKS), stdout=io.StringIO())
    out = io.StringIO()
    call_command("aiops", "HighLatency firing on api: p99 latency above 2 s", stdout=out)
    text = out.getvalue()
    run = DiagnosisRun.objects.get()
    assert run.agent_flow == AgentFlow.AI_OPS and run.status == RunStatus.SUCCESS
    assert f"Queued AI Ops run {run.run_id}" in text and "Report (SUCCESS, release" in text
    assert run.aiops_alert.source == "shell" and f"Run {run.run_id}" in text

    out = io.StringIO()
    call_command("aiops", "DiskFull on db-1", "--queue", stdout=out)
    queued = DiagnosisRun.objects.exclude(pk=run.pk).get()
    assert queued.status == RunStatus.PENDING and queued.run_id in out.getvalue()
    out = io.StringIO()
    call_command("run_worker", "--until-idle", "--poll", "0.05", stdout=out)
    queued.refresh_from_db()
    assert queued.status == RunStatus.SUCCESS and "worker stopped after 1 run(s)" in out.getvalue()


def test_queued_analyses_do_not_count_against_the_users_active_chats(settings, staff_user):
    from surfaces.chat.service import active_run_count, start_chat

    settings.CHAT_MAX_ACTIVE_RUNS_PER_USER = 1
    queue(staff_user, 3)
    assert active_run_count(user=staff_user) == 0
    assert start_chat(user=staff_user, query="Nginx 502 after deploy").agent_flow == AgentFlow.DIAGNOSIS_AGENT
