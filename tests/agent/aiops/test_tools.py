"""`query_metrics` and `list_alerts` through the real tool boundary and recorder, against the real
Prometheus and Alertmanager: a result is one `prom:` evidence record in the run's canonical store that
the evidence guard accepts (and no other `prom:` id passes); a bad query, a Prometheus that is down and
a server that is not configured are FAILED tools with the error type recorded, never data."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time

import pytest

from agent.aiops.prometheus import EVIDENCE_ID_RE, POINTS_MAX, SERIES_MAX
from agent.runtime.cancel import CancelToken
from agent.runtime.canonical import CanonicalStore
from agent.runtime.context import RunContext
from agent.runtime.guards import UNKNOWN_CITATION, check_evidence, guard_evidence
from agent.runtime.tools.boundary import TOOL_ERROR, ToolBoundary
from agent.runtime.tools.registry import FLOW_AI_OPS, default_registry
from audit.models import ToolInvocation, ToolStatus
from audit.payloads import canonical_json
from audit.write import DeclaredToolCall
from reasoning.capture import build_capture
from tests.agent.aiops.servers import ALERT_DEADLINE, ALERT_NAME
from tests.agent.runtime.support import CollectingSink
from tests.factories import usage

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("runtime_pools")]


class Tools:
    """Declares each call in a recorded model step, then runs it through the run's ToolBoundary (a fresh
    context per call: each call runs in its own event loop, and a cancel token belongs to one loop)."""

    def __init__(self, run, recorder) -> None:
        self.run, self.recorder, self.step = run, recorder, 0
        self.canonical = CanonicalStore(run.run_id)

    def context(self) -> RunContext:
        return RunContext(
            run_id=self.run.run_id,
            session_id=self.run.session_id,
            query=self.run.query,
            recorder=self.recorder,
            sink=CollectingSink(),
            token=CancelToken(),
            client=None,
            registry=default_registry(flow=FLOW_AI_OPS),
            canonical=self.canonical,
        )

    def call(self, name: str, **arguments):
        self.step += 1
        call = DeclaredToolCall(tool_call_id=f"c{self.step}", name=name, arguments=json.dumps(arguments))
        self.recorder.model_step(  # the recorded step that declares the call (else the start is refused)
            step_index=self.step,
            agent_name="executor",
            model="m",
            usage=usage(1, 1),
            reasoning=build_capture(reasoning=None, text=""),
            tool_calls=[call],
        )
        [outcome] = asyncio.run(ToolBoundary(self.context()).run([call]))
        row = ToolInvocation.objects.get(run_id=self.run.run_id, tool_call_id=call.tool_call_id)
        return outcome, row

    def evidence_guard(self, text: str):
        return check_evidence(text=text, store=self.canonical, required=True)


@pytest.fixture
def tools(run, recorder):
    return Tools(run, recorder)


def test_an_instant_query_is_cited_evidence_in_the_canonical_store(aiops_settings, tools, prometheus):
    outcome, row = tools.call("query_metrics", query='up{job="prometheus"}')
    assert outcome.status == row.status == ToolStatus.SUCCEEDED
    model_view = json.loads(outcome.content)
    [item] = model_view["evidence"]
    evidence_id = item["id"]
    assert EVIDENCE_ID_RE.fullmatch(evidence_id)
    assert f"[{evidence_id}]" in model_view["note"]

    [stored] = tools.canonical.get_evidence([evidence_id]).values()
    assert stored["kind"] == "instant" and stored["resultType"] == "vector"
    [series] = stored["result"]
    assert series["metric"]["job"] == "prometheus" and series["value"][1] == "1"
    assert f'up{{instance="{prometheus.address}",job="prometheus"}} = 1' in stored["text"]
    # The id is recomputable from the stored payload: sha256 over (query, kind, time, resultType, result).
    core = {k: stored[k] for k in ("query", "kind", "time", "resultType", "result")}
    digest = hashlib.sha256(canonical_json(core).encode()).hexdigest()
    assert evidence_id == f"prom:{digest[:16]}"
    # The tool's canonical data and its audited output are that same result.
    assert tools.canonical.get_result("c1")["id"] == evidence_id
    assert evidence_id in row.output_preview

    verdict = tools.evidence_guard(f"Prometheus scrapes itself successfully [{evidence_id}].")
    assert verdict.passed and verdict.cited == (evidence_id,)
    [item] = guard_evidence(verdict.evidence, verdict.cited)
    assert item["id"] == evidence_id and item["heading"] == 'up{job="prometheus"}'
    assert "= 1" in item["text"]


def test_a_prom_id_not_in_this_run_is_refused(aiops_settings, tools):
    outcome, _row = tools.call("query_metrics", query="up")
    real = json.loads(outcome.content)["evidence"][0]["id"]
    forged = "prom:" + ("0" if real[5] != "0" else "1") + real[6:]
    for text in (
        f"Up [{forged}].",
        f"Up [{real}, {forged}].",
        "Up [prom:not-hex].",
        f"Up [{real}; kb:nope#1].",
    ):
        verdict = tools.evidence_guard(text)
        assert not verdict.passed and verdict.reasons == (UNKNOWN_CITATION,), text
        assert real not in verdict.unknown
    assert tools.evidence_guard(f"Up [{real}] and still up [{real}].").passed


def test_a_range_query_is_bounded_to_the_latest_points(aiops_settings, tools):
    outcome, row = tools.call("query_metrics", query="vector(1)", range_minutes=5, step_seconds=1)
    assert row.status == ToolStatus.SUCCEEDED
    data = tools.canonical.get_result("c1")
    assert data["kind"] == "range" and data["resultType"] == "matrix" and data["step"] == 1.0
    [series] = data["result"]
    assert len(series["values"]) == POINTS_MAX and data["pointsTotal"] == 301
    assert data["truncated"] is True
    assert series["values"][-1][0] == pytest.approx(data["end"], abs=1)  # the latest points are kept
    assert "truncated" in json.loads(outcome.content)["note"]

    _outcome, _row = tools.call("query_metrics", query="vector(1)", range_minutes=10)
    default_step = tools.canonical.get_result("c2")
    assert default_step["step"] == 11.0 and default_step["truncated"] is False  # 600 s in ≤ 60 points

    tools.call("query_metrics", query="vector(1)", range_minutes=1440, step_seconds=1)
    widened = tools.canonical.get_result("c3")
    assert widened["stepAdjusted"] is True and widened["step"] == 87.0  # ≤ 1000 points asked for


def test_many_series_are_cut_and_say_so(aiops_settings, tools):
    tools.call("query_metrics", query='{__name__=~"prometheus_.+"}')
    data = tools.canonical.get_result("c1")
    assert data["seriesTotal"] > SERIES_MAX
    assert len(data["result"]) == SERIES_MAX and data["truncated"] is True
    assert "(truncated)" in data["text"]


def test_a_bad_query_fails_with_prometheus_error_type(aiops_settings, tools):
    outcome, row = tools.call("query_metrics", query="rate(up[5m]")
    assert outcome.status == row.status == ToolStatus.FAILED
    assert row.error_code == TOOL_ERROR and row.error_message.startswith("BadQuery: bad_data: ")
    assert json.loads(outcome.content)["error"]["message"] == row.error_message
    assert tools.canonical.get_result("c1") is None  # nothing stored, nothing citable


def test_bad_arguments_never_reach_prometheus(aiops_settings, tools):
    _outcome, row = tools.call("query_metrics", query="up", range_minutes=0)
    assert row.status == ToolStatus.FAILED and row.error_code == "TOOL_BAD_ARGUMENTS"
    _outcome, row = tools.call("query_metrics", query="up", step_seconds=15)
    assert row.status == ToolStatus.FAILED and "step_seconds needs range_minutes" in row.error_message


def test_prometheus_down_mid_run_fails_the_tool_as_unreachable(aiops_settings, tools, prometheus):
    assert tools.call("query_metrics", query="up")[1].status == ToolStatus.SUCCEEDED
    with prometheus.stopped():
        outcome, row = tools.call("query_metrics", query="up")
        assert outcome.status == row.status == ToolStatus.FAILED
        assert row.error_message == "Unreachable: Prometheus is unreachable (ConnectError)"
    assert tools.call("query_metrics", query="vector(1)")[1].status == ToolStatus.SUCCEEDED


def test_not_configured_servers_fail_the_tools_with_no_data(settings, tools):
    settings.PROMETHEUS_URL = ""
    settings.ALERTMANAGER_URL = ""
    _outcome, row = tools.call("query_metrics", query="up")
    assert row.status == ToolStatus.FAILED
    assert row.error_message == "NotConfigured: Prometheus is not configured"
    _outcome, row = tools.call("list_alerts")
    assert row.status == ToolStatus.FAILED
    assert row.error_message == "NotConfigured: Alertmanager is not configured"


def test_list_alerts_shows_the_firing_rule(aiops_settings, tools):
    deadline = time.monotonic() + ALERT_DEADLINE
    while True:
        _outcome, row = tools.call("list_alerts", filter=[f'alertname="{ALERT_NAME}"'])
        assert row.status == ToolStatus.SUCCEEDED
        data = tools.canonical.get_result(row.tool_call_id)
        if data["alerts"] or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    [alert] = data["alerts"]
    assert alert["labels"]["alertname"] == ALERT_NAME and alert["labels"]["severity"] == "warning"
    assert alert["state"] == "active" and alert["annotations"]["summary"]
    assert data["activeOnly"] is True and data["alertsTotal"] == 1 and data["truncated"] is False

    _outcome, row = tools.call("list_alerts", filter=['alertname="NoSuchAlert"'])
    assert tools.canonical.get_result(row.tool_call_id)["alerts"] == []

    _outcome, row = tools.call("list_alerts", filter=["alertname=~("])
    assert row.status == ToolStatus.FAILED and row.error_message.startswith("BadQuery: bad_filter: ")

    _outcome, row = tools.call("list_alerts", filter=["x"] * 11)
    assert row.status == ToolStatus.FAILED and row.error_code == "TOOL_BAD_ARGUMENTS"


def test_the_model_sees_no_more_than_the_bounded_result(aiops_settings, tools):
    outcome, _row = tools.call("query_metrics", query='{__name__=~"prometheus_.+"}')
    [item] = json.loads(outcome.content)["evidence"]
    assert len(item["result"]) == SERIES_MAX and "(truncated)" in item["text"]
    assert re.fullmatch(r"prom:[0-9a-f]{16}", item["id"])
