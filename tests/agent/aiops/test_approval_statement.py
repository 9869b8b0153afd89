"""What an approval request states and what is checked again before the approved call runs (issue 45,
item 2), on runs the real runtime executes against the real Alertmanager: the request says who creates
the silence, on which Alertmanager, before when and until when it lasts (chained, listed by the API,
shown by the admin's pages); an approval whose deadline passed, whose approver was deactivated or whose
Alertmanager is no longer the one stated is not executed — no silence exists — and the record says why."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from django.test import Client
from django.urls import reverse

from agent.aiops.alertmanager import AlertmanagerClient
from agent.aiops.http import host_of
from agent.runtime.approval_checks import APPROVAL_DEADLINE_PASSED, APPROVAL_REVOKED, APPROVAL_STALE
from agent.runtime.tools.create_silence import CREATED_BY
from audit.models import EventType, ToolInvocation, ToolStatus, TraceEvent
from audit.verify.runs import verify_run
from diagnosis.models import RunStatus
from tests.agent.aiops import test_approvals as base
from tests.agent.aiops.test_approvals import client_for, decide, drain, interrupted_run, silence_call

# The same fixtures: an approver in the Approvers group; silences a test made are expired afterwards.
approver = base.approver
_expire_new_silences = base._expire_new_silences

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("chat_settings", "runtime_pools", "aiops_settings"),
]


def _silences(settings) -> list:
    return AlertmanagerClient(settings.ALERTMANAGER_URL, timeout=5, max_bytes=1 << 22).silences()


def _page(user, name: str, *args) -> str:
    client = Client()
    client.force_login(user)
    response = client.get(reverse(f"admin:diagnosis_diagnosisrun_{name}", args=args))
    assert response.status_code == 200
    return response.content.decode()


def test_an_approval_request_states_who_executes_it_where_and_until_when(
    staff_user, approver, aiops_settings
):
    run = interrupted_run(staff_user, "statement")
    call = silence_call(run)
    where = f"Alertmanager at {host_of(aiops_settings.ALERTMANAGER_URL)}"
    requested = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.APPROVAL_REQUESTED).details
    assert requested["action"] == {"executedBy": CREATED_BY, "where": where, "lastsMinutes": 30}
    expires = dt.datetime.fromisoformat(requested["expiresAt"])

    [item] = [a for a in client_for(approver).get("/api/diagnosis/approvals/").json()["approvals"]]
    action = item["action"]
    assert (action["executedBy"], action["where"]) == (CREATED_BY, where)
    assert dt.datetime.fromisoformat(action["executeBefore"]) == expires
    assert dt.datetime.fromisoformat(action["endsBy"]) == expires + dt.timedelta(minutes=30)
    utc = expires.astimezone(dt.UTC)
    text = action["text"]
    assert f"“{CREATED_BY}” on {where}" in text
    assert f"started before {utc:%Y-%m-%d %H:%M} UTC" in text
    ends = utc + dt.timedelta(minutes=30)
    assert f"lasts 30 min from its creation: it ends by {ends:%Y-%m-%d %H:%M} UTC at the latest" in text

    escaped = text.replace("“", "&ldquo;").replace("”", "&rdquo;")
    run_page = _page(approver, "change", run.pk)
    assert f'id="approval-action-{call.tool_call_id}"' in run_page
    assert text in run_page or escaped in run_page
    approvals_page = _page(approver, "approvals")
    assert text in approvals_page or escaped in approvals_page
    assert verify_run(run.run_id).ok


def _approved_then(staff_user, approver, marker: str, change) -> ToolInvocation:
    """An interrupted run's silence approved through the API, `change()` made, then the worker resumes
    the run; the call as recorded."""
    run = interrupted_run(staff_user, marker)
    call = silence_call(run)
    answer = decide(client_for(approver), run, call.tool_call_id, decision="approve")
    assert answer.status_code == 200, answer.json()
    change(call)
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS, (run.status, run.error_code)
    assert verify_run(run.run_id).ok
    return ToolInvocation.objects.get(pk=call.pk)


def test_an_approval_whose_deadline_passed_before_execution_is_not_made(staff_user, approver, aiops_settings):
    aiops_settings.APPROVAL_TIMEOUT_SECONDS = 8
    before = len(_silences(aiops_settings))

    def wait_for_the_deadline(call):
        expires = call.created_at + dt.timedelta(seconds=8)
        time.sleep(max(0.0, (expires - dt.datetime.now(dt.UTC)).total_seconds()) + 0.2)

    call = _approved_then(staff_user, approver, "late", wait_for_the_deadline)
    assert (call.status, call.error_code) == (ToolStatus.FAILED, APPROVAL_DEADLINE_PASSED)
    assert call.error_message.startswith("the approval deadline (")
    assert call.error_message.endswith("passed before the call could start; the call was not made")
    assert call.started_at is None
    assert len(_silences(aiops_settings)) == before


def test_an_approver_deactivated_before_execution_releases_nothing(staff_user, approver, aiops_settings):
    before = len(_silences(aiops_settings))

    def deactivate(_call):
        approver.is_active = False
        approver.save(update_fields=["is_active"])

    call = _approved_then(staff_user, approver, "deactivated", deactivate)
    assert (call.status, call.error_code) == (ToolStatus.FAILED, APPROVAL_REVOKED)
    assert call.error_message == (
        "the approver (approver) no longer holds diagnosis.approve_tool_call (by the database or the "
        "governance chain); the call was not made"
    )
    assert call.started_at is None and len(_silences(aiops_settings)) == before


def test_an_approval_for_another_alertmanager_than_stated_is_not_made(staff_user, approver, aiops_settings):
    stated = aiops_settings.ALERTMANAGER_URL
    before = len(_silences(aiops_settings))
    # The same server under another name: the approver was told one host, the call would use another.
    other = stated.replace("127.0.0.1", "localhost")

    def repoint(_call):
        aiops_settings.ALERTMANAGER_URL = other

    call = _approved_then(staff_user, approver, "repointed", repoint)
    assert (call.status, call.error_code) == (ToolStatus.FAILED, APPROVAL_STALE)
    assert call.error_message == (
        f"approved to act on Alertmanager at {host_of(stated)}, but it would act on Alertmanager at "
        f"{host_of(other)}; the call was not made"
    )
    assert call.started_at is None
    aiops_settings.ALERTMANAGER_URL = stated
    assert len(_silences(aiops_settings)) == before
