"""Only what can run is offered (issue 45, item 2), on runs the real runtime executes against the real
Prometheus and Alertmanager: a tool whose server is not configured, refuses connections or does not
answer within the probe's bound is left out of the run's tools, and its configuration (chained in
RUN_STARTED, kept by fingerprint, shown on the run page) says why; the probe is bounded and cached."""

from __future__ import annotations

import socket
import time

import pytest
from django.test import Client
from django.urls import reverse

from agent.aiops import http, intake
from agent.aiops.http import forget_probes, unavailable
from agent.runtime.configuration import fingerprint_of
from agent.runtime.tools.registry import ToolRegistry
from audit.models import EventType, ToolInvocation, ToolStatus, TraceEvent
from audit.verify.runs import verify_run
from diagnosis import services
from diagnosis.models import AgentFlow, DiagnosisRun, RunConfiguration, RunStatus
from tests.agent.aiops.test_approvals import alert_text, drain, interrupted_run
from tests.agent.runtime.support import execute

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("runtime_pools")]

NOT_CONFIGURED = "NotConfigured: Alertmanager is not configured"


def started(run_id: str) -> dict:
    return TraceEvent.objects.get(run_id=run_id, event_type=EventType.RUN_STARTED).details


def _run_page(user, run: DiagnosisRun) -> str:
    client = Client()
    client.force_login(user)
    response = client.get(reverse("admin:diagnosis_diagnosisrun_change", args=[run.pk]))
    assert response.status_code == 200
    return response.content.decode()


@pytest.mark.usefixtures("chat_settings")
def test_without_alertmanager_an_analysis_is_not_offered_its_tools_and_its_configuration_says_why(
    staff_user, admin_user, aiops_settings
):
    configured, aiops_settings.ALERTMANAGER_URL = aiops_settings.ALERTMANAGER_URL, ""
    # The alert asks for a silence: with Alertmanager offered, the demo executor would propose one.
    run_id = intake.start_staff_analysis(user=staff_user, query=alert_text("unconfigured")).run_id
    assert drain() == 1
    run = DiagnosisRun.objects.get(run_id=run_id)
    assert run.status == RunStatus.SUCCESS, (run.status, run.error_code)
    details = started(run_id)
    assert details["tools"] == ["lookup_knowledge", "query_metrics", "read_runbook"]
    tools = details["configuration"]["tools"]
    assert tools["names"] == details["tools"]
    assert tools["leftOut"] == {"create_silence": NOT_CONFIGURED, "list_alerts": NOT_CONFIGURED}
    assert fingerprint_of(details["configuration"]) == details["configFingerprint"] == run.config_fingerprint
    kept = RunConfiguration.objects.get(fingerprint=run.config_fingerprint)
    assert kept.document["tools"]["leftOut"] == tools["leftOut"]
    # Nothing was asked of Alertmanager, nor of a person.
    names = set(ToolInvocation.objects.filter(run_id=run_id).values_list("tool_name", flat=True))
    assert "query_metrics" in names and not names & {"create_silence", "list_alerts"}
    assert not TraceEvent.objects.filter(run_id=run_id, event_type=EventType.APPROVAL_REQUESTED).exists()
    assert verify_run(run_id).ok
    page = _run_page(admin_user, run)
    assert 'id="dc-tools-left-out"' in page
    assert "create_silence</span>: NotConfigured: Alertmanager is not configured" in page

    # Configured again: every tool is offered, the document has no `leftOut`, the fingerprint differs.
    aiops_settings.ALERTMANAGER_URL = configured
    forget_probes()
    again = interrupted_run(staff_user, "configured")  # the silence is proposed and waits
    config = started(again.run_id)["configuration"]
    assert "leftOut" not in config["tools"] and "create_silence" in config["tools"]["names"]
    assert again.config_fingerprint != run.config_fingerprint
    assert 'id="dc-tools-left-out"' not in _run_page(admin_user, again)


class SilentServer:
    """A local port that accepts connections and never answers (a hung server); `attempts()` counts the
    connections made to it so far (the kernel completes them in the backlog; nothing reads them)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.setblocking(False)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted = 0

    def attempts(self) -> int:
        while True:
            try:
                conn, _peer = self.sock.accept()
            except BlockingIOError:
                return self.accepted
            conn.close()
            self.accepted += 1


@pytest.fixture
def silent_server():
    server = SilentServer()
    yield server
    server.sock.close()


def _refused_url() -> str:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now: connections are refused
    return f"http://127.0.0.1:{port}"


def test_the_model_is_not_offered_a_tool_whose_server_refuses_or_hangs(
    llm, chat_session, settings, silent_server
):
    settings.PROMETHEUS_URL = silent_server.url
    settings.ALERTMANAGER_URL = _refused_url()
    settings.AIOPS_PROBE_TIMEOUT_SECONDS = 0.5
    run = services.create_run(session=chat_session, query="Why is the API slow?", agent_flow=AgentFlow.AI_OPS)
    began = time.monotonic()
    execute(run.run_id)  # the provider is unscripted: the run ends at the planner's model call
    first = time.monotonic() - began
    details = started(run.run_id)
    assert details["tools"] == ["lookup_knowledge", "read_runbook"]
    assert details["configuration"]["tools"]["leftOut"] == {
        "create_silence": "Unreachable: Alertmanager is unreachable (ConnectError)",
        "list_alerts": "Unreachable: Alertmanager is unreachable (ConnectError)",
        "query_metrics": "RequestTimeout: Prometheus did not answer within 0.5 s (ReadTimeout)",
    }
    # The planner's instructions list only the offered tools.
    [planner] = llm.requests["fake-agent"][:1]
    system = planner.messages[0]["content"]
    assert "lookup_knowledge" in system
    assert not any(name in system for name in ("query_metrics", "list_alerts", "create_silence"))
    # The probes ran concurrently and within their bound; the next start reuses their answers.
    second_run = services.create_run(session=chat_session, query="And now?", agent_flow=AgentFlow.AI_OPS)
    began = time.monotonic()
    execute(second_run.run_id)
    second = time.monotonic() - began
    assert (
        started(second_run.run_id)["configuration"]["tools"]["leftOut"]
        == (details["configuration"]["tools"]["leftOut"])
    )
    # The second start asked the hung server nothing: the first probe's answer was cached (no timing
    # is asserted: the machine is shared; the times are printed).
    assert silent_server.attempts() == 1
    print(f"run start to first model call: probing {first:.3f} s, cached {second:.3f} s")


def test_the_probe_is_cached_for_its_lifetime_and_never_names_the_url(settings, prometheus, aiops_settings):
    settings.AIOPS_PROBE_CACHE_SECONDS = 60
    url = "http://reader:s3cret@" + prometheus.url.removeprefix("http://")
    assert unavailable("Prometheus", url) is None
    with prometheus.stopped():
        assert unavailable("Prometheus", url) is None  # cached: a run start pays no probe
        settings.AIOPS_PROBE_CACHE_SECONDS = 0
        forget_probes()
        reason = unavailable("Prometheus", url)
        assert reason == "Unreachable: Prometheus is unreachable (ConnectError)"
        assert "s3cret" not in reason and "127.0.0.1" not in reason
    deadline = time.monotonic() + 10
    while unavailable("Prometheus", url) is not None:  # not cached: seen as soon as it is ready
        assert time.monotonic() < deadline, "Prometheus did not answer ready after its restart"
        time.sleep(0.1)
    assert http.host_of(url) == prometheus.url.removeprefix("http://")


def test_a_resumed_run_keeps_the_tools_it_started_with(staff_user, aiops_settings, chat_settings):
    run = interrupted_run(staff_user, "resume-tools")
    offered = started(run.run_id)["tools"]
    aiops_settings.PROMETHEUS_URL = ""  # after the start: the resumed run is not offered fewer tools
    forget_probes()
    from agent.runtime import approvals

    approvals.decide(
        run=run,
        tool_call_id=ToolInvocation.objects.get(run_id=run.run_id, tool_name="create_silence").tool_call_id,
        decision=approvals.REJECTED,
        user=_approver(),
    )
    drain()
    resumed = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.RUN_RESUMED).details
    assert resumed["tools"] == offered
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS
    assert (
        ToolInvocation.objects.get(run_id=run.run_id, tool_name="create_silence").status == ToolStatus.FAILED
    )


def _approver():
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    from agent.runtime import approvals

    user = get_user_model().objects.create_user("approver2", password="pw", is_staff=True)
    user.groups.add(Group.objects.get(name=approvals.APPROVERS_GROUP))
    return user


def test_a_check_that_raises_leaves_its_tool_out_and_a_registry_without_checks_is_itself():
    registry = ToolRegistry()
    schema = {"type": "object", "properties": {}}

    def broken() -> str | None:
        raise RuntimeError("secret detail")

    registry.tool(name="plain", description="d", parameters=schema)(lambda: 1)
    registry.tool(name="ready", description="d", parameters=schema, available=lambda: None)(lambda: 2)
    registry.tool(name="down", description="d", parameters=schema, available=lambda: "Down: why")(lambda: 3)
    registry.tool(name="broken", description="d", parameters=schema, available=broken)(lambda: 4)
    offered, left_out = registry.offered()
    assert offered.names() == ["plain", "ready"]
    assert left_out == {"broken": "RuntimeError: the availability check failed", "down": "Down: why"}
    unchecked = registry.only(["plain", "ready"])
    assert unchecked.offered() == (unchecked, {})
    assert registry.only(registry.names()) is registry
    # Only a registry with a check blocks (the executor then runs `offered` on the tool pool).
    plain = registry.only(["plain"])
    assert registry.checks_availability() and unchecked.checks_availability()
    assert not plain.checks_availability() and plain.offered() == (plain, {})
