"""`python -m config.serve daphne …` (the shipped units' command line) starts the process's background
duties when the process starts and stops them on SIGTERM; a bare `daphne` waits for a first connection.
`/healthz` never starts them, so it tells the two apart (daphne subprocesses on the test database)."""

from __future__ import annotations

import httpx
import pytest

from tests.surfaces.chat.support import DaphneServer

pytestmark = pytest.mark.django_db(transaction=True)

ENV = {"AIOPS_WORKER_CONCURRENCY": "1", "AIOPS_POLL_INTERVAL_SECONDS": "0.5"}
DUTIES = {
    "runs:control",
    "runs:sweeper",
    "runs:queue-worker",
    "runs:adopt",
    "audit:checkpoint",
    "audit:purge",
    "evaluations:score",
}


def test_duties_start_with_the_process_and_stop_on_sigterm():
    server = DaphneServer(env=ENV, name="serve", serve=True).start()
    try:
        health = httpx.get(f"{server.url}/healthz", timeout=20)
        assert health.status_code == 200, health.text
        assert health.json()["duties"] == dict.fromkeys(sorted(DUTIES), "up")
        server.proc.terminate()
        assert server.proc.wait(20) == 0
        # What the first chats would wait for is built before the port opens (`supervisor.warm_up`).
        output = server.output()
        assert output.index("knowledge index built before the port opened") < output.index(
            "background duties started at process start"
        )
        assert "background duties stopped" in server.output()
    finally:
        server.stop()


def test_a_bare_daphne_has_none_until_its_first_connection_and_healthz_says_so():
    server = DaphneServer(env=ENV, name="bare").start()
    try:
        health = httpx.get(f"{server.url}/healthz", timeout=20)
        assert (health.status_code, health.json()["duties"]) == (503, {})
        httpx.get(f"{server.url}/api/schema/", timeout=20)  # any other request starts them
        health = httpx.get(f"{server.url}/healthz", timeout=20)
        assert health.status_code == 200 and set(health.json()["duties"]) == DUTIES
    finally:
        server.stop()
