"""AI Ops entry points: Alertmanager's webhook (auth, one run per firing, dedupe, resolution), the staff
analyses endpoint and list, and the contract's error shape for bad input."""

from __future__ import annotations

import copy

import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from agent.aiops import intake
from diagnosis.models import AgentFlow, AiOpsAlert, AlertSource, ChatSession, DiagnosisRun, RunStatus

pytestmark = pytest.mark.django_db
TOKEN = "s3cret-webhook-token"
WEBHOOK = "/api/aiops/alertmanager"
ANALYSES = "/api/aiops/analyses"


def notification(*, fingerprints=("a1b2c3",), status="firing", group='{}:{alertname="HighLatency"}'):
    """Alertmanager's webhook payload (version 4), as Alertmanager 0.25 sends it."""
    return {
        "version": "4",
        "groupKey": group,
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "diagnosis",
        "groupLabels": {"alertname": "HighLatency"},
        "commonLabels": {"alertname": "HighLatency", "severity": "critical", "job": "api"},
        "commonAnnotations": {"summary": "p99 latency above 2 s"},
        "externalURL": "http://127.0.0.1:9093",
        "alerts": [
            {
                "status": status,
                "labels": {"alertname": "HighLatency", "severity": "critical", "job": "api", "instance": fp},
                "annotations": {"summary": "p99 latency above 2 s", "description": f"instance {fp} is slow"},
                "startsAt": "2026-12-01T10:00:00Z",
                "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "http://127.0.0.1:9090/graph",
                "fingerprint": fp,
            }
            for fp in fingerprints
        ],
    }


@pytest.fixture
def hook(settings):
    settings.AIOPS_WEBHOOK_TOKEN = TOKEN
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    return client


def test_webhook_refuses_requests_without_the_right_bearer_token(settings, staff_user):
    settings.AIOPS_WEBHOOK_TOKEN = TOKEN
    client = APIClient()
    for header in (None, f"Token {TOKEN}", "Bearer wrong", f"Bearer {TOKEN} extra", "Bearer"):
        client.credentials(**({"HTTP_AUTHORIZATION": header} if header else {}))
        response = client.post(WEBHOOK, notification(), format="json")
        assert response.status_code == 401, header
        assert response["WWW-Authenticate"] == 'Bearer realm="aiops"'
        assert set(response.json()["error"]) == {"code", "message"}
    # A signed-in staff member is not Alertmanager: sessions do not authenticate the webhook.
    client.credentials()
    client.force_login(staff_user)
    assert client.post(WEBHOOK, notification(), format="json").status_code == 401
    assert not DiagnosisRun.objects.exists()


def test_webhook_is_closed_while_no_token_is_configured(settings):
    settings.AIOPS_WEBHOOK_TOKEN = ""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer ")
    assert client.post(WEBHOOK, notification(), format="json").status_code == 401
    client.credentials(HTTP_AUTHORIZATION="Bearer anything")
    assert client.post(WEBHOOK, notification(), format="json").status_code == 401
    assert not DiagnosisRun.objects.exists()


def test_a_firing_group_queues_one_ai_ops_run_in_the_group_session(hook, settings):
    response = hook.post(WEBHOOK, notification(fingerprints=("fp1", "fp2")), format="json")
    assert response.status_code == 202
    body = response.json()["run"]
    assert body["deduplicated"] is False and body["status"] == RunStatus.PENDING
    run = DiagnosisRun.objects.get(run_id=body["runId"])
    assert run.agent_flow == AgentFlow.AI_OPS and run.status == RunStatus.PENDING and run.lease_owner == ""
    session = ChatSession.objects.get(session_id=body["sessionId"])
    assert session.session_id == intake.group_session_id('{}:{alertname="HighLatency"}')
    assert session.owner.username == settings.AIOPS_SERVICE_USER and not session.owner.has_usable_password()
    assert "HighLatency [severity critical] since 2026-12-01T10:00:00Z" in run.query
    assert "instance fp1 is slow" in run.query and "Firing alerts: 2" in run.query
    alert = AiOpsAlert.objects.get(run=run)
    assert (alert.source, alert.alertname, alert.severity, alert.alert_count) == (
        AlertSource.ALERTMANAGER,
        "HighLatency",
        "critical",
        2,
    )
    assert alert.notifications == 1 and alert.labels["job"] == "api"


def test_a_resent_notification_starts_no_second_run(hook):
    first = hook.post(WEBHOOK, notification(fingerprints=("fp1", "fp2")), format="json").json()["run"]
    # Alertmanager re-sends the same firing (repeat_interval, or a retry): alerts in another order.
    again = hook.post(WEBHOOK, notification(fingerprints=("fp2", "fp1")), format="json")
    assert again.status_code == 202
    second = again.json()["run"]
    assert second["deduplicated"] is True and second["runId"] == first["runId"]
    assert DiagnosisRun.objects.count() == 1
    assert AiOpsAlert.objects.get().notifications == 2


def test_a_new_alert_in_the_group_or_a_new_firing_starts_a_new_run_in_the_same_session(hook):
    first = hook.post(WEBHOOK, notification(fingerprints=("fp1",)), format="json").json()["run"]
    grown = hook.post(WEBHOOK, notification(fingerprints=("fp1", "fp3")), format="json").json()["run"]
    assert grown["deduplicated"] is False and grown["runId"] != first["runId"]
    assert grown["sessionId"] == first["sessionId"]
    refired = notification(fingerprints=("fp1",))
    refired["alerts"][0]["startsAt"] = "2026-12-01T12:00:00Z"  # resolved meanwhile, firing again
    again = hook.post(WEBHOOK, refired, format="json").json()["run"]
    assert again["deduplicated"] is False
    assert DiagnosisRun.objects.filter(session_id=first["sessionId"]).count() == 3


def test_a_resolved_group_starts_nothing_and_marks_the_group_resolved(hook):
    hook.post(WEBHOOK, notification(), format="json")
    response = hook.post(WEBHOOK, notification(status="resolved"), format="json")
    assert response.status_code == 200 and response.json() == {"run": None}
    assert DiagnosisRun.objects.count() == 1
    assert AiOpsAlert.objects.get().resolved_at is not None


@pytest.mark.parametrize(
    "change",
    [
        lambda p: p.update(version="3"),
        lambda p: p.pop("groupKey"),
        lambda p: p.update(alerts="not a list"),
        lambda p: p["alerts"][0].update(status="pending"),
        lambda p: p["alerts"][0].update(labels={"alertname": ["not", "a", "string"]}),
        # More than the stored alert count holds (a 32-bit column; MariaDB refuses it, SQLite would not).
        lambda p: p.update(truncatedAlerts=75_723_659_067_727),
    ],
    ids=["version", "groupKey", "alerts", "alert-status", "labels", "truncatedAlerts"],
)
def test_a_malformed_notification_is_a_400_in_the_error_shape(hook, change):
    payload = copy.deepcopy(notification())
    change(payload)
    response = hook.post(WEBHOOK, payload, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_request"
    assert not DiagnosisRun.objects.exists()


def test_a_concurrent_duplicate_loses_on_the_unique_key_and_returns_the_first_run(hook, monkeypatch):
    first = hook.post(WEBHOOK, notification(), format="json").json()["run"]
    # As if the other request's lookup ran before this one committed: the insert hits the unique key.
    monkeypatch.setattr(intake, "_existing", _existing_only_on_retry(intake._existing))
    again = hook.post(WEBHOOK, notification(), format="json").json()["run"]
    assert again == {**first, "deduplicated": True}
    assert DiagnosisRun.objects.count() == 1 and ChatSession.objects.count() == 1


def _existing_only_on_retry(real):
    calls = {"n": 0}

    def lookup(key):
        calls["n"] += 1
        return None if calls["n"] == 1 else real(key)

    return lookup


# --------------------------------------------------------------------------------------------------
# Staff analyses
# --------------------------------------------------------------------------------------------------
def test_staff_start_an_analysis_of_a_question_or_an_alert(staff_user):
    client = APIClient()
    client.force_authenticate(staff_user)
    response = client.post(ANALYSES, {"query": "Why is the checkout API slow since 10:00?"}, format="json")
    assert response.status_code == 202
    body = response.json()
    run = DiagnosisRun.objects.get(run_id=body["runId"])
    assert body == {
        "sessionId": run.session_id,
        "runId": run.run_id,
        "status": "PENDING",
        "agentFlow": "AI_OPS",
    }
    assert run.session.owner == staff_user and run.aiops_alert.source == AlertSource.STAFF

    alert = {
        "labels": {"alertname": "DiskFull", "severity": "warning"},
        "annotations": {"summary": "/var 95%"},
    }
    response = client.post(ANALYSES, {"alert": alert}, format="json")
    assert response.status_code == 202
    run = DiagnosisRun.objects.get(run_id=response.json()["runId"])
    assert "DiskFull [severity warning]" in run.query and "summary: /var 95%" in run.query
    assert (run.aiops_alert.alertname, run.aiops_alert.severity) == ("DiskFull", "warning")

    listed = client.get(ANALYSES, {"alertname": "DiskFull"}).json()
    assert [r["runId"] for r in listed["results"]] == [run.run_id]
    assert listed["results"][0]["alert"]["severity"] == "warning"
    assert client.get(ANALYSES).json()["count"] == 2
    assert client.get(ANALYSES, {"status": "NOPE"}).status_code == 400


@pytest.mark.parametrize(
    "body",
    [{}, {"query": "a", "alert": "b"}, {"query": "   "}, {"alert": 5}, {"alert": {"annotations": {}}}],
    ids=["none", "both", "blank", "number", "no-labels"],
)
def test_an_invalid_analysis_request_is_a_400(staff_user, body):
    client = APIClient()
    client.force_authenticate(staff_user)
    response = client.post(ANALYSES, body, format="json")
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_request"
    assert not DiagnosisRun.objects.exists()


def test_analyses_are_for_staff_only(user):
    client = APIClient()
    assert client.post(ANALYSES, {"query": "x"}, format="json").status_code == 401
    assert client.get(ANALYSES).status_code == 401
    client.force_authenticate(user)
    assert client.post(ANALYSES, {"query": "x"}, format="json").status_code == 403
    assert client.get(ANALYSES).status_code == 403
    assert not DiagnosisRun.objects.exists()


def test_the_admin_lists_analyses_filtered_by_alert_name_and_severity(client, superuser, hook):
    paged = hook.post(WEBHOOK, notification(), format="json").json()["run"]["runId"]
    disk = intake.start_staff_analysis(
        user=superuser, alert={"labels": {"alertname": "DiskFull", "severity": "warning"}}
    ).run_id
    client.force_login(superuser)
    url = reverse("admin:diagnosis_aiopsalert_changelist")
    page = client.get(url).content.decode()
    assert "AI Ops analyses" in page and paged in page and disk in page
    page = client.get(url, {"severity": "warning"}).content.decode()
    assert disk in page and paged not in page
    page = client.get(url, {"alertname": "HighLatency"}).content.decode()
    assert paged in page and disk not in page
    page = client.get(url, {"q": disk}).content.decode()
    assert disk in page and paged not in page


def test_a_blank_alert_text_is_a_400_not_a_server_error(staff_user):
    client = APIClient()
    client.force_authenticate(staff_user)
    for body in ({"alert": ""}, {"alert": " "}, {"query": "x", "alert": ""}):
        response = client.post(ANALYSES, body, format="json")
        assert response.status_code == 400, body
    assert not DiagnosisRun.objects.exists()


def test_guessing_the_webhook_token_is_locked_out_like_any_token(settings):
    settings.AIOPS_WEBHOOK_TOKEN = TOKEN
    settings.LOCKOUT_ANONYMOUS_FAILURE_LIMIT = 3  # the webhook counter has the address-only limit
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer guess")
    statuses = [client.post(WEBHOOK, notification(), format="json").status_code for _ in range(3)]
    assert statuses == [401, 401, 429]
    # Locked out: even the right token is refused now, so no guess is ever confirmed.
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    response = client.post(WEBHOOK, notification(), format="json")
    assert response.status_code == 429 and response.json()["error"]["code"] == "locked_out"
    assert not DiagnosisRun.objects.exists()
