"""Server processes serve the AI Ops queue: an alert posted to one daphne process is analysed with no
client connected, and two processes sharing the database share a burst of analyses without ever
executing one twice (demo provider, daphne subprocesses on the test database)."""

from __future__ import annotations

import time
from io import StringIO

import httpx
import pytest
from django.core.management import call_command

from agent.aiops import intake
from audit.verify.runs import verify_run
from diagnosis.models import DiagnosisRun, RunStatus
from tests.agent.aiops.test_intake import notification
from tests.surfaces.chat.support import DaphneServer

pytestmark = pytest.mark.django_db(transaction=True)
TOKEN = "process-webhook-token"


@pytest.fixture
def servers():
    started: list[DaphneServer] = []

    def start(name: str) -> DaphneServer:
        env = {
            "AIOPS_WEBHOOK_TOKEN": TOKEN,
            "AIOPS_WORKER_CONCURRENCY": "2",
            "AIOPS_POLL_INTERVAL_SECONDS": "0.2",
            "RUN_SWEEP_INTERVAL_SECONDS": "0",
            "AUDIT_CHECKPOINT_INTERVAL_SECONDS": "0",
        }
        server = DaphneServer(env=env, name=name).start()
        started.append(server)
        return server

    call_command("load_knowledge", "runbooks", stdout=StringIO())
    yield start
    for server in started:
        server.stop()


def wait_until_finished(run_ids: list[str], timeout: float = 60) -> list[DiagnosisRun]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = list(DiagnosisRun.objects.filter(run_id__in=run_ids))
        if len(runs) == len(run_ids) and all(r.is_terminal for r in runs):
            return runs
        time.sleep(0.2)
    raise AssertionError(f"runs not finished: {[(r.run_id, r.status) for r in runs]}")


def test_an_alert_posted_to_a_server_is_analysed_with_no_client_connected(servers):
    server = servers("hook")
    response = httpx.post(
        f"{server.url}/api/aiops/alertmanager",
        json=notification(),
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=20,
    )
    assert response.status_code == 202, response.text
    run_id = response.json()["run"]["runId"]
    (run,) = wait_until_finished([run_id])
    assert run.status == RunStatus.SUCCESS and run.release_decision and run.content
    assert verify_run(run_id).ok


def test_two_servers_share_a_burst_of_analyses_and_never_run_one_twice(servers, staff_user):
    first, second = servers("q1"), servers("q2")
    ids = [
        intake.start_staff_analysis(user=staff_user, query=f"Nginx returns 502 after deploy #{i}").run_id
        for i in range(10)
    ]
    for server in (first, second):  # any request starts a server's background duties
        httpx.get(f"{server.url}/api/schema/", timeout=20)
    runs = wait_until_finished(ids, timeout=90)
    assert {r.status for r in runs} == {RunStatus.SUCCESS}
    assert {r.lease_epoch for r in runs} == {1}  # one claim each: nobody claimed a run twice
    for run in runs:
        assert verify_run(run.run_id).ok
