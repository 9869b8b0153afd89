"""End to end on real components: a Prometheus rule fires, the real Alertmanager notifies the product's
webhook on a daphne server process, and that process's queue worker runs the AI Ops analysis against
the live Prometheus and Alertmanager, with no client connected (test database). Once with the offline
demo model, once with the local OpenAI-compatible server through the real `openai` SDK (the bench's
scripted AI Ops provider). And Prometheus down when an analysis starts: the metric tool is not offered
(the run's configuration says why), and no report cites a metric it never got."""

from __future__ import annotations

import time
from io import StringIO

import pytest
from django.core.management import call_command

from agent.runtime.guards import extract_citations
from audit.models import AgentStep, EventType, ToolInvocation, ToolStatus, TraceEvent
from audit.verify.runs import verify_run
from bench.b7_aiops import AiOpsBenchProvider
from diagnosis.models import AgentFlow, AiOpsAlert, DiagnosisRun, ReleaseDecision, RunStatus
from tests.agent.aiops import servers
from tests.fakes.openai_server import FakeLLMServer
from tests.surfaces.chat.support import DaphneServer

pytestmark = pytest.mark.django_db(transaction=True)
TOKEN = "e2e-webhook-token"


@pytest.fixture(params=["demo", "openai-sdk"])
def product(request, prometheus, alertmanager):
    call_command("load_knowledge", "runbooks", stdout=StringIO())
    llm: dict[str, str] = {}
    fake = None
    if request.param == "openai-sdk":
        provider = AiOpsBenchProvider(call_seconds=0.01, chunk_interval=0.0)
        fake = FakeLLMServer(handler=provider).__enter__()
        llm = provider.env(fake.base_url)
    server = DaphneServer(
        env={
            **llm,
            "AIOPS_WEBHOOK_TOKEN": TOKEN,
            "AIOPS_WORKER_CONCURRENCY": "2",
            "AIOPS_POLL_INTERVAL_SECONDS": "0.2",
            "PROMETHEUS_URL": prometheus.url,
            "ALERTMANAGER_URL": alertmanager.url,
            "RUN_SWEEP_INTERVAL_SECONDS": "0",
            "AUDIT_CHECKPOINT_INTERVAL_SECONDS": "0",
        },
        name=f"aiops-e2e-{request.param}",
    ).start()
    server.provider = request.param
    yield server
    server.stop()
    if fake is not None:
        fake.__exit__(None, None, None)
        assert not fake.errors


def wait_for(predicate, *, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_firing_rule_reaches_the_webhook_and_is_analysed_against_live_metrics(
    product, alertmanager_webhook
):
    alertmanager_webhook(f"{product.url}/api/aiops/alertmanager", bearer_token=TOKEN)
    alert = wait_for(
        lambda: AiOpsAlert.objects.filter(alertname=servers.ALERT_NAME).select_related("run").first(),
        timeout=servers.ALERT_DEADLINE,
        what="Alertmanager's notification",
    )
    assert alert.source == "alertmanager" and alert.severity == "warning" and alert.receiver
    run = wait_for(
        lambda: DiagnosisRun.objects.filter(run_id=alert.run_id, status__in=["SUCCESS", "FAILED"]).first(),
        timeout=60,
        what="the analysis to finish",
    )
    assert run.agent_flow == AgentFlow.AI_OPS and run.status == RunStatus.SUCCESS, run.error_code
    assert servers.ALERT_NAME in run.query
    assert run.release_decision == ReleaseDecision.PUBLISHED and run.content
    assert run.provider == ("demo" if product.provider == "demo" else "openai")
    assert "[prom:" in run.content and "[kb:" in run.content
    agents = set(AgentStep.objects.filter(run_id=run.run_id).values_list("agent_name", flat=True))
    assert agents == {"planner", "executor"}
    tools = list(ToolInvocation.objects.filter(run_id=run.run_id))
    assert tools and all(t.status == ToolStatus.SUCCEEDED for t in tools)
    # The planner, then the executor, each counting its own steps; the plan is on the timeline.
    steps = list(
        AgentStep.objects.filter(run_id=run.run_id).order_by("id").values_list("agent_name", "step_index")
    )
    assert steps[0] == ("planner", 1) and steps[1] == ("executor", 1), steps
    assert {t.agent_name for t in tools} == {"executor"} and {t.tool_name for t in tools} >= {"query_metrics"}
    assert TraceEvent.objects.filter(run_id=run.run_id, event_type=EventType.PLAN_DECISION).exists()
    assert run.self_evaluation["tools"]["failed"] == 0
    if run.release_decision == ReleaseDecision.PUBLISHED:
        assert any(c.startswith("prom:") for c in extract_citations(run.content)), run.content
    assert verify_run(run.run_id).ok
    # Alertmanager re-sends the group (a new receiver notifies again): the same firing, no second run.
    alertmanager_webhook(f"{product.url}/api/aiops/alertmanager", bearer_token=TOKEN)
    wait_for(
        lambda: AiOpsAlert.objects.filter(pk=alert.pk, notifications__gte=2).exists(),
        timeout=servers.ALERT_DEADLINE,
        what="the re-sent notification",
    )
    assert DiagnosisRun.objects.filter(session_id=run.session_id).count() == 1


def test_prometheus_down_when_an_analysis_starts_leaves_the_metric_tool_out_and_invents_no_metric(
    aiops_settings, prometheus, staff_user, settings
):
    import asyncio

    from agent.aiops import intake
    from agent.runtime import supervisor
    from agent.runtime.llm import aclose_clients
    from agent.runtime.worker import work

    call_command("load_knowledge", "runbooks", stdout=StringIO())
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    run = intake.start_staff_analysis(
        user=staff_user, alert={"labels": {"alertname": servers.ALERT_NAME, "severity": "warning"}}
    )

    async def drain():
        supervisor.ensure_background(serve_queue=False)
        try:
            return await work(launch=supervisor.launch, concurrency=1, poll_interval=0.05, until_idle=True)
        finally:
            await supervisor.stop_background()
            await aclose_clients()

    with prometheus.stopped():
        assert asyncio.run(drain()) == 1
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS
    started = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.RUN_STARTED)
    assert "query_metrics" not in started.details["tools"] and "list_alerts" in started.details["tools"]
    assert started.details["configuration"]["tools"]["leftOut"] == {
        "query_metrics": "Unreachable: Prometheus is unreachable (ConnectError)"
    }
    assert not ToolInvocation.objects.filter(run_id=run.run_id, tool_name="query_metrics").exists()
    # Nothing cites a metric result that was never stored: the report either says so or was blocked.
    assert "[prom:" not in run.content
    assert verify_run(run.run_id).ok
