"""The real stack: a daphne process of the app on the test database, a real Prometheus (Debian
`prometheus`) scraping its `/metrics` with the bearer token, and the same process's exporter duty
sending a finished run to a real Phoenix with no command run."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from telemetry.models import ExportState, TraceExport
from telemetry.spans import trace_id_of
from tests.agent.aiops.servers import PrometheusServer, ci_requires_servers, missing_binaries
from tests.surfaces.chat.support import DaphneServer
from tests.telemetry.support import make_recorded_run

pytestmark = pytest.mark.django_db(transaction=True)
TOKEN = "scrape-token-51d2"


@pytest.fixture
def app_server(phoenix_up):
    server = DaphneServer(
        env={
            "METRICS_TOKEN": TOKEN,
            "METRICS_CACHE_SECONDS": "0",
            "OTEL_EXPORTER_OTLP_ENDPOINT": phoenix_up.url,
            "OTEL_EXPORT_INTERVAL_SECONDS": "0.3",
            "AIOPS_WORKER_CONCURRENCY": "0",
            "RUN_SWEEP_INTERVAL_SECONDS": "0",
            "AUDIT_CHECKPOINT_INTERVAL_SECONDS": "0",
            "AUDIT_PURGE_INTERVAL_SECONDS": "0",
        },
        name="telemetry",
    ).start()
    yield server
    server.stop()


@pytest.fixture
def prometheus_of(tmp_path):
    if "prometheus" in missing_binaries():
        reason = "not installed: prometheus (scripts/setup.sh dev installs the Debian package)"
        if ci_requires_servers():
            pytest.fail(f"required (CI / AIOPS_REQUIRE_SERVERS) but {reason}", pytrace=False)
        pytest.skip(reason)
    started = []

    def start(target: str) -> PrometheusServer:
        server = PrometheusServer(tmp_path / "prometheus", rules="groups: []\n")
        config = json.loads(server.config_path.read_text())
        config["scrape_configs"].append(
            {
                "job_name": "diagnosis",
                "metrics_path": "/metrics",
                "authorization": {"type": "Bearer", "credentials": TOKEN},
                "static_configs": [{"targets": [target]}],
            }
        )
        server.config_path.write_text(json.dumps(config))
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()


def test_prometheus_scrapes_the_service_and_the_series_comes_back(user, app_server, prometheus_of):
    make_recorded_run(user, tools=1)
    assert httpx.get(f"{app_server.url}/metrics", timeout=10).status_code == 401
    prometheus = prometheus_of(f"127.0.0.1:{app_server.port}")
    query = 'diagnosis_runs{job="diagnosis",flow="DIAGNOSIS_AGENT",status="SUCCESS",release="PUBLISHED"}'
    prometheus.wait_for_samples(query, timeout=30)
    body = httpx.get(f"{prometheus.url}/api/v1/query", params={"query": query}, timeout=5).json()
    (series,) = body["data"]["result"]
    assert float(series["value"][1]) == 1.0
    up = httpx.get(
        f"{prometheus.url}/api/v1/query", params={"query": 'up{job="diagnosis"}'}, timeout=5
    ).json()
    assert up["data"]["result"][0]["value"][1] == "1"


def test_the_server_exports_finished_runs_to_phoenix_by_itself(user, app_server, phoenix_up):
    run = make_recorded_run(user, tools=2)
    # Any request starts the process's background duties (config.asgi); a scrape is one.
    httpx.get(f"{app_server.url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    deadline = time.monotonic() + 30
    row = None
    while time.monotonic() < deadline:
        row = TraceExport.objects.filter(run_id=run.run_id).first()
        if row is not None and row.state == ExportState.EXPORTED:
            break
        time.sleep(0.2)
    assert row is not None and row.state == ExportState.EXPORTED, (
        row,
        app_server.log_path.read_text()[-2000:],
    )
    spans = phoenix_up.wait_for_spans(trace_id_of(run.run_id), row.span_count)
    assert {s["name"] for s in spans} >= {"invoke_agent diagnosis_agent", "execute_tool lookup_knowledge"}
