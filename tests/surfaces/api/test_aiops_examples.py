"""What Swagger UI offers for `POST /api/aiops/analyses` works: every request example of the served
schema (the first is the body Swagger fills in by default), posted as it stands by a staff user, is
accepted (202) and starts an AI Ops analysis; an alert example names its alert."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from diagnosis.models import AgentFlow, AiOpsAlert, DiagnosisRun

pytestmark = pytest.mark.django_db


def _examples() -> dict:
    client = APIClient()
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    body = schema["paths"]["/api/aiops/analyses"]["post"]["requestBody"]["content"]["application/json"]
    return body["examples"]


def test_every_request_example_of_the_schema_is_accepted(staff_user):
    examples = _examples()
    assert len(examples) >= 2, examples
    client = APIClient()
    client.force_authenticate(staff_user)
    for name, example in examples.items():
        response = client.post("/api/aiops/analyses", example["value"], format="json")
        assert response.status_code == 202, (name, response.json())
        run = DiagnosisRun.objects.get(run_id=response.json()["runId"])
        assert run.agent_flow == AgentFlow.AI_OPS
        if "alert" in example["value"]:
            assert AiOpsAlert.objects.get(run_id=run.run_id).alertname == "HighLatency", name
