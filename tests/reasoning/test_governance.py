"""Reasoning governance through the API: auditors read content, every read is logged once with who and
from where, the marker never leaks elsewhere, and retention purges erase content but keep the rows."""

import datetime as dt
import io
import json
import logging

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from access.reasoning_reads import record_reasoning_read
from audit.write.reasoning_changes import purge_reasoning
from reasoning.models import AccessChannel, AgentReasoningAudit, ReasoningAccessLog
from reasoning.selectors import get_reasoning_records
from tests.factories import REASONING_MARKER, make_recorded_run

pytestmark = pytest.mark.django_db

RECORD_KEYS = {
    "stepIndex", "agentName", "reasoningAvailable", "reasoningContent", "assistantText", "contentSource",
    "contentBytes", "purged", "createdAt",
}  # fmt: skip


def _reasoning_url(run):
    return f"/api/diagnosis/{run.session_id}/trace/reasoning?runId={run.run_id}"


def test_an_auditor_reads_reasoning_and_the_read_is_logged(api_client, auditor, traced_run):
    api_client.force_login(auditor)
    response = api_client.get(
        _reasoning_url(traced_run), HTTP_USER_AGENT="audit-script/1.0", REMOTE_ADDR="10.1.2.3"
    )
    assert response.status_code == 200
    body = response.json()
    assert body["sessionId"] == traced_run.session_id and body["runId"] == traced_run.run_id
    records = body["records"]
    assert [r["stepIndex"] for r in records] == [1, 2]
    assert all(set(r) >= RECORD_KEYS for r in records)
    first, answer = records
    assert first["reasoningAvailable"] is True and REASONING_MARKER in first["reasoningContent"]
    assert first["contentSource"] == "PROVIDER_REASONING+ASSISTANT_TEXT"
    assert first["assistantText"].startswith("tool_calls:")
    assert answer["assistantText"].startswith("Replication lags") and answer["purged"] is False
    assert first["contentBytes"] == len(first["reasoningContent"].encode()) + len(
        first["assistantText"].encode()
    )

    log = ReasoningAccessLog.objects.get()
    assert (log.user, log.username, log.session_id, log.run_id) == (
        auditor,
        "auditor",
        traced_run.session_id,
        traced_run.run_id,
    )
    assert log.records_returned == 2 and log.channel == AccessChannel.API
    assert log.client_address == "10.1.2.3" and log.user_agent == "audit-script/1.0"
    assert log.accessed_at is not None

    api_client.get(_reasoning_url(traced_run))
    assert ReasoningAccessLog.objects.count() == 2  # every read, not every reader


def test_a_run_without_provider_reasoning_is_explicit(api_client, auditor, user):
    run = make_recorded_run(user, extra_steps=1)
    api_client.force_login(auditor)
    records = api_client.get(_reasoning_url(run)).json()["records"]
    middle = records[1]
    assert middle["reasoningAvailable"] is False and middle["reasoningContent"] is None
    assert middle["assistantText"] == "thinking aloud" and middle["contentSource"] == "ASSISTANT_TEXT"


def test_refused_reads_write_no_log(api_client, user, other_user, staff_user, traced_run):
    for who, status in ((user, 403), (staff_user, 403), (other_user, 404)):
        api_client.force_login(who)
        assert api_client.get(_reasoning_url(traced_run)).status_code == status
    api_client.logout()
    assert api_client.get(_reasoning_url(traced_run)).status_code == 401
    assert not ReasoningAccessLog.objects.exists()


def test_forwarded_for_is_ignored_unless_a_proxy_is_trusted(api_client, auditor, traced_run, settings):
    api_client.force_login(auditor)
    forged = {"REMOTE_ADDR": "192.0.2.10", "HTTP_X_FORWARDED_FOR": "203.0.113.66, 198.51.100.7"}
    api_client.get(_reasoning_url(traced_run), **forged)
    settings.TRUSTED_PROXY_COUNT = 1
    api_client.get(_reasoning_url(traced_run), **forged)
    settings.TRUSTED_PROXY_COUNT = 3  # more proxies configured than the request passed: trust nothing
    api_client.get(_reasoning_url(traced_run), **forged)
    addresses = list(ReasoningAccessLog.objects.order_by("id").values_list("client_address", flat=True))
    assert addresses == ["192.0.2.10", "198.51.100.7", "192.0.2.10"]


def test_the_service_and_selector_the_admin_reuses(auditor, traced_run):
    records = get_reasoning_records(run_id=traced_run.run_id)
    assert [r.step_index for r in records] == [1, 2] and REASONING_MARKER in records[0].reasoning_content
    entry = record_reasoning_read(
        user=auditor,
        session_id=traced_run.session_id,
        run_id=traced_run.run_id,
        records_returned=len(records),
        client_address="not-an-ip",
        user_agent="x" * 600,
        channel=AccessChannel.ADMIN,
    )
    entry.refresh_from_db()
    assert entry.channel == "ADMIN" and entry.client_address is None and len(entry.user_agent) == 512
    with pytest.raises(ValueError):
        record_reasoning_read(
            user=auditor,
            session_id="s",
            run_id="r",
            records_returned=0,
            client_address=None,
            user_agent="",
            channel="EMAIL",
        )


def test_the_marker_appears_only_in_the_reasoning_response(
    api_client, auditor, superuser, traced_run, caplog
):
    """Trace, audits, runs, sessions, every error body and every log line stay free of reasoning text."""
    sid, rid = traced_run.session_id, traced_run.run_id
    with caplog.at_level(logging.DEBUG):
        api_client.force_login(superuser)
        bodies = [
            api_client.get(f"/api/diagnosis/{sid}/trace?runId={rid}"),
            api_client.get(f"/api/diagnosis/{sid}/trace"),
            api_client.get(f"/api/diagnosis/{sid}/audits"),
            api_client.get(f"/api/diagnosis/{sid}/runs/"),
            api_client.get("/api/diagnosis/sessions/"),
            api_client.get(f"/api/diagnosis/{sid}/trace/reasoning"),
            api_client.get(f"/api/diagnosis/{sid}/trace/reasoning?runId=run_absent"),
            api_client.post(f"/api/diagnosis/{sid}/runs/{rid}/feedback", {"rating": "x"}, format="json"),
        ]
        api_client.force_login(auditor)
        bodies.append(api_client.get(f"/api/diagnosis/{sid}/audits"))
        reasoning = api_client.get(_reasoning_url(traced_run))
        call_command("verify_audit", "--run", rid, stdout=io.StringIO())
        call_command("purge_reasoning", "--run", rid, stdout=io.StringIO())
    assert REASONING_MARKER in reasoning.content.decode()  # the one place it may appear
    for response in bodies:
        assert REASONING_MARKER not in response.content.decode(), response.request["PATH_INFO"]
    assert [r.status_code for r in bodies] == [200, 200, 200, 200, 200, 400, 404, 400, 403]
    assert REASONING_MARKER not in caplog.text
    assert any("reasoning read" in r.getMessage() for r in caplog.records)


# --------------------------------------------------------------------------------------------------
# Retention
# --------------------------------------------------------------------------------------------------
def _recorded_days_ago(owner, monkeypatch, days):
    """A run recorded `days` days ago: the clock is moved back while it is recorded, so every row and
    event carries that time as a real old run does (backdating its rows afterwards would be a database
    write that no digest covers, which the purge rightly refuses to re-bind)."""
    then = timezone.now() - dt.timedelta(days=days)
    with monkeypatch.context() as m:
        m.setattr(timezone, "now", lambda: then)
        return make_recorded_run(owner)


def test_purge_by_age_erases_content_and_keeps_the_rows(api_client, auditor, user, settings, monkeypatch):
    old = _recorded_days_ago(user, monkeypatch, settings.REASONING_RETENTION_DAYS + 1)
    recent = _recorded_days_ago(user, monkeypatch, settings.REASONING_RETENTION_DAYS - 1)
    before = {r.pk: (r.reasoning_available, r.content_bytes) for r in AgentReasoningAudit.objects.all()}

    out = io.StringIO()
    call_command("purge_reasoning", stdout=out)
    assert "purged 2 reasoning row(s)" in out.getvalue()

    rows = AgentReasoningAudit.objects.filter(run_id=old.run_id)
    assert rows.count() == 2
    for row in rows:
        assert row.reasoning_content is None and row.assistant_text is None and row.purged_at is not None
        assert (row.reasoning_available, row.content_bytes) == before[row.pk]
    assert not AgentReasoningAudit.objects.filter(run_id=recent.run_id, purged_at__isnull=False).exists()

    api_client.force_login(auditor)
    records = api_client.get(_reasoning_url(old)).json()["records"]
    assert all(
        r["purged"] is True and r["reasoningContent"] is None and r["assistantText"] is None for r in records
    )
    assert records[0]["reasoningAvailable"] is True and records[0]["purgedAt"]
    fresh = api_client.get(_reasoning_url(recent)).json()["records"]
    assert all(r["purged"] is False for r in fresh) and REASONING_MARKER in fresh[0]["reasoningContent"]

    out = io.StringIO()
    call_command("purge_reasoning", stdout=out)
    assert "purged 0 reasoning row(s)" in out.getvalue()  # idempotent


def test_purge_older_than_overrides_the_setting(user, monkeypatch):
    _recorded_days_ago(user, monkeypatch, 3)
    call_command("purge_reasoning", "--older-than", "5", stdout=io.StringIO())
    assert not AgentReasoningAudit.objects.filter(purged_at__isnull=False).exists()
    call_command("purge_reasoning", "--older-than", "2", stdout=io.StringIO())
    assert AgentReasoningAudit.objects.filter(purged_at__isnull=False).count() == 2
    with pytest.raises(CommandError):
        call_command("purge_reasoning", "--older-than", "-1", stdout=io.StringIO())


def test_purge_of_one_run_is_the_right_to_erasure(api_client, auditor, user):
    target, other = make_recorded_run(user), make_recorded_run(user)
    out = io.StringIO()
    call_command("purge_reasoning", "--run", target.run_id, stdout=out)
    assert f"purged 2 reasoning row(s) of run {target.run_id}" in out.getvalue()
    assert AgentReasoningAudit.objects.filter(run_id=target.run_id, purged_at__isnull=False).count() == 2
    assert not AgentReasoningAudit.objects.filter(run_id=other.run_id, purged_at__isnull=False).exists()
    api_client.force_login(auditor)
    body = api_client.get(_reasoning_url(target)).json()
    assert REASONING_MARKER not in json.dumps(body) and all(r["purged"] for r in body["records"])


def test_purge_in_small_batches_purges_everything(user):
    make_recorded_run(user, extra_steps=5)
    assert purge_reasoning(run_id=AgentReasoningAudit.objects.first().run_id, batch_size=2) == 7
    assert not AgentReasoningAudit.objects.filter(purged_at__isnull=True).exists()
    with pytest.raises(ValueError):
        purge_reasoning()
