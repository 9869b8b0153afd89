"""Issue 33 for AI Ops: an alert whose annotations carry pasted secrets, delivered to the webhook and held
by the real Alertmanager that the real `list_alerts` tool reads back during the analysis. The run's
query, the alert row, the tool's recorded output and canonical copy, the provider's requests, every
table, the logs and the OTel spans hold placeholders, never the originals; the HMACs verify with the key."""

from __future__ import annotations

import json
import logging
import time

import httpx
import pytest
from rest_framework.test import APIClient

from agent.redaction import verify_hmac
from agent.runtime.canonical import CanonicalStore
from audit.models import EventType, ToolInvocation, TraceEvent
from audit.read import get_trace
from audit.verify.runs import verify_run
from diagnosis.models import AiOpsAlert, DiagnosisRun
from telemetry.spans import project_trace
from tests.agent.leaks import found_in_logs, found_in_requests, found_in_spans, found_in_tables
from tests.agent.runtime.support import AGENT, execute
from tests.agent.secrets_corpus import (
    ALL_ORIGINALS,
    AWS_KEY_ID,
    CORPUS,
    DB_PASSWORD,
    GITHUB_TOKEN,
    SLACK_TOKEN,
)
from tests.fakes.openai_server import stream_answer, stream_tool_calls, usage

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("runtime_pools")]

TOKEN = "redaction-webhook-token"
KEY = "redaction-aiops-key-0123456789abcdef0123456789"
ALERT_NAME = "RedactionLeakCheck"


def _annotations() -> dict[str, str]:
    return {f"pasted_{label.replace('-', '_')}": text for label, text, _o, _k in CORPUS}


def _notification() -> dict:
    labels = {"alertname": ALERT_NAME, "severity": "critical", "job": "orders"}
    annotations = {"summary": f"orders DB refused {DB_PASSWORD}", **_annotations()}
    return {
        "version": "4",
        "groupKey": f'{{}}:{{alertname="{ALERT_NAME}"}}',
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "diagnosis",
        "groupLabels": {"alertname": ALERT_NAME},
        "commonLabels": labels,
        "commonAnnotations": annotations,
        "externalURL": "http://127.0.0.1:9093",
        "alerts": [
            {
                "status": "firing",
                "labels": labels,
                "annotations": annotations,
                "startsAt": "2026-12-01T10:00:00Z",
                "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": f"http://ops:{SLACK_TOKEN}@127.0.0.1:9090/graph",
                "fingerprint": "f00d5ec2e7",
            }
        ],
    }


def _hold_in_alertmanager(url: str) -> None:
    """The same alert, posted to the real Alertmanager, so that `list_alerts` returns its annotations."""
    alert = _notification()["alerts"][0]
    body = [{"labels": alert["labels"], "annotations": alert["annotations"], "startsAt": alert["startsAt"]}]
    httpx.post(f"{url}/api/v2/alerts", json=body, timeout=10).raise_for_status()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        held = httpx.get(f"{url}/api/v2/alerts", params={"filter": f'alertname="{ALERT_NAME}"'}, timeout=10)
        if held.json():
            return
        time.sleep(0.2)
    raise AssertionError("Alertmanager never listed the alert")


def test_alert_payload_and_tool_output_secrets_are_redacted_everywhere(
    llm, aiops_settings, user, settings, caplog
):
    caplog.set_level(logging.DEBUG)
    settings.REDACTION_HMAC_KEY = KEY
    settings.AIOPS_WEBHOOK_TOKEN = TOKEN
    settings.OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT = True
    _hold_in_alertmanager(aiops_settings.ALERTMANAGER_URL)

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    response = client.post("/api/aiops/alertmanager", _notification(), format="json")
    assert response.status_code in (200, 201, 202), response.content
    run = DiagnosisRun.objects.get()
    assert "[REDACTED:aws-access-key#1]" in run.query and AWS_KEY_ID not in run.query
    row = AiOpsAlert.objects.get(run=run)
    assert "[REDACTED:" in json.dumps(row.annotations)

    plan = json.dumps({"steps": [{"check": "What fires", "why": "the symptom", "tool": "list_alerts"}]})
    llm.add(AGENT, stream_answer(plan, usage=usage(200, 40)))
    llm.add(
        AGENT,
        stream_tool_calls(
            [("call_1", "list_alerts", json.dumps({"filter": [f'alertname="{ALERT_NAME}"']}))],
            usage=usage(300, 20),
        ),
        stream_answer("## Summary\nThe key [REDACTED:aws-access-key#1] leaked.", usage=usage(600, 20)),
        stream_answer("## Summary\nStill the key.", usage=usage(700, 20)),
    )
    outcome, _sink = execute(run.run_id)
    run.refresh_from_db()
    assert outcome.status == "SUCCESS", (run.error_code, run.error_message)

    # The tool really returned the alert (its annotations), redacted with the alert's placeholders.
    (tool,) = ToolInvocation.objects.filter(run_id=run.run_id, tool_name="list_alerts")
    result = CanonicalStore(run.run_id).get_result(tool.tool_call_id)
    annotations = result["alerts"][0]["annotations"]
    assert "[REDACTED:aws-access-key#1]" in json.dumps(annotations)
    tool_message = next(m for m in llm.requests[AGENT][2].messages if m["role"] == "tool")["content"]
    assert "[REDACTED:aws-access-key#1]" in tool_message

    assert found_in_requests(llm.requests, ALL_ORIGINALS) == []
    assert found_in_tables(ALL_ORIGINALS) == []
    assert found_in_logs(caplog.records, ALL_ORIGINALS) == []
    canonical = json.dumps(result)
    assert [o for o in ALL_ORIGINALS if o in canonical or json.dumps(o)[1:-1] in canonical] == []
    assert found_in_spans(project_trace(get_trace(run=run)), ALL_ORIGINALS) == []

    redactions = [
        e.details
        for e in TraceEvent.objects.filter(run_id=run.run_id).order_by("sequence_no")
        if e.event_type == EventType.REDACTION_APPLIED
    ]
    assert [d["source"] for d in redactions] == ["alert", "tool_output"]
    digests = [i["hmac"] for d in redactions for i in d["items"]]
    for original in (AWS_KEY_ID, GITHUB_TOKEN, SLACK_TOKEN, DB_PASSWORD):
        assert any(verify_hmac(KEY.encode(), original, d) for d in digests), original[:12]
    verdict = verify_run(run.run_id)
    assert verdict.ok and verdict.chain_valid, (verdict.invalid, verdict.incomplete)
