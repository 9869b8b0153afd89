"""AI Ops conversations are titled by their alert (issue 50, item 4): the session an analysis starts reads
"HighLatency · critical · +1 more alert", not the first line of the generated question ("Alertmanager
alert group firing: …" / "Alert firing: Firing alerts: 1 …"); a free question keeps itself as the
title; a session that exists keeps its title; a secret in the alert name never reaches the title."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from agent.aiops import intake
from diagnosis import services
from diagnosis.models import ChatSession
from tests.agent.aiops.test_intake import ANALYSES, WEBHOOK, hook, notification  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db


def test_an_alertmanager_group_session_is_titled_by_alert_name_severity_and_count(hook):  # noqa: F811
    response = hook.post(WEBHOOK, notification(fingerprints=("fp1", "fp2")), format="json")
    assert response.status_code == 202
    session = ChatSession.objects.get(session_id=response.json()["run"]["sessionId"])
    assert session.title == "HighLatency · critical · +1 more alert"
    # A later firing of the same group lands in the same session, which keeps its title.
    ChatSession.objects.filter(pk=session.pk).update(title="renamed by its owner")
    again = hook.post(WEBHOOK, notification(fingerprints=("fp3",)), format="json")
    assert again.status_code == 202 and again.json()["run"]["sessionId"] == session.session_id
    session.refresh_from_db()
    assert session.title == "renamed by its owner"


def test_staff_analyses_are_titled_by_their_alert_and_a_question_by_itself(staff_user):
    client = APIClient()
    client.force_authenticate(staff_user)
    alert = {"labels": {"alertname": "DiskFull", "severity": "warning"}, "annotations": {"summary": "x"}}
    started = client.post(ANALYSES, {"alert": alert}, format="json").json()
    assert ChatSession.objects.get(session_id=started["sessionId"]).title == "DiskFull · warning"

    text = client.post(ANALYSES, {"alert": "HighLatency firing on api: p99 above 2 s"}, format="json").json()
    assert ChatSession.objects.get(session_id=text["sessionId"]).title == "HighLatency"

    question = "Why is the checkout API slow since 10:00?"
    asked = client.post(ANALYSES, {"query": question}, format="json").json()
    assert ChatSession.objects.get(session_id=asked["sessionId"]).title == question


def test_a_secret_in_the_alert_never_reaches_the_title(staff_user):
    key = "AKIA" + "Q" * 16
    run = intake.start_staff_analysis(
        user=staff_user, alert={"labels": {"alertname": "Leak", "severity": key}, "annotations": {}}
    )
    title = run.session.title
    assert title.startswith("Leak · ") and key not in title and "REDACTED" in title


def test_an_existing_session_keeps_its_title(staff_user):
    session = services.create_session(owner=staff_user, title="my own words")
    intake.start_analysis(
        query="HighLatency firing", source="staff", owner=staff_user, session=session,
        alert_fields={"alertname": "HighLatency", "severity": "critical", "alert_count": 1},
    )  # fmt: skip
    session.refresh_from_db()
    assert session.title == "my own words"
