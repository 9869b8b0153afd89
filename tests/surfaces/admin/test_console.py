"""The admin console: run list, one-page run view, gated reasoning panel, trace export, and the read-only
rules for audit, reasoning and access-log rows."""

from __future__ import annotations

import io
import json
import re

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.auth.models import Group, Permission
from django.core.management import call_command
from django.db import OperationalError, connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils.html import escape

from access.groups import WITHHELD_CODENAMES, create_role_groups
from access.reasoning_reads import record_reasoning_read
from audit.models import AgentStep, ToolInvocation, TraceEvent
from audit.read import get_trace
from audit.write import RunRecorder
from core.groups import STAFF_VIEWERS
from diagnosis import services
from diagnosis.models import DiagnosisRun, RunStatus
from reasoning.models import AccessChannel, AgentReasoningAudit, ReasoningAccessLog
from surfaces.admin.display import format_ms
from surfaces.admin.run_page import build_run_page
from surfaces.api.audit_serializers import serialize_trace
from tests.factories import REASONING_MARKER, make_recorded_run
from tests.surfaces.admin.support import (
    BLOCK_REASON,
    UNSUPPORTED_CLAIM,
    grant_console,
    make_blocked_run,
    make_run_with_unfinished_tool,
)

pytestmark = pytest.mark.django_db

READ_ONLY_MODELS = [TraceEvent, AgentStep, ToolInvocation, AgentReasoningAudit, ReasoningAccessLog]
# Session, user, the user's two permission sets, then: run, events, steps, tools, the reasoning rows'
# stored columns (for their digests, never decrypted), its reviews, the run's leaf in the transparency log,
# feedback, the price overrides (for each call's cost); the rows appended events bind (evaluation scores,
# `audit.verify.appended_rows`: one query per registered source), the run page's table of those scores, and
# every reader's feedback (one bounded query).
RUN_PAGE_MAX_QUERIES = 16
# Session, user, permissions (2), two counts, the page of runs, the date hierarchy (2).
CHANGELIST_MAX_QUERIES = 9


def _change_url(model, pk) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_change", args=[pk])


def _run_url(run) -> str:
    return reverse("admin:diagnosis_diagnosisrun_change", args=[run.pk])


def _reasoning_url(run) -> str:
    return reverse("admin:diagnosis_diagnosisrun_reasoning", args=[run.pk])


def _login(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


class _FailInserts:
    """Django's execute-wrapper hook: the database rejects INSERTs into `table` (a real failed write)."""

    def __init__(self, table):
        self.table = table

    def __call__(self, execute, sql, params, many, context):
        if sql.lstrip().upper().startswith("INSERT") and self.table in sql:
            raise OperationalError(1114, "The table is full")
        return execute(sql, params, many, context)


def _make_incomplete_run(owner) -> DiagnosisRun:
    """A run whose release event failed to write: fail-open, counted, and the audit is incomplete."""
    session = services.create_session(owner=owner)
    run = services.create_run(session=session, query="Why is the disk full on /var/log?")
    rec = RunRecorder.for_run(run)
    rec.run_started()
    rec.routing_decision(intent="DIAGNOSIS", confidence=0.8, reason="disk", fallback=False)
    with connection.execute_wrapper(_FailInserts("diagnosis_trace_event")):
        rec.release(decision="PUBLISHED", reason="guards passed")
    rec.finish(status=RunStatus.SUCCESS, content="Rotate the logs.")
    run.refresh_from_db()
    return run


@pytest.fixture
def console_staff(staff_user):
    return grant_console(staff_user)


@pytest.fixture
def console_auditor(auditor):
    return grant_console(auditor)


# --------------------------------------------------------------------------------------------------
# Read-only rules
# --------------------------------------------------------------------------------------------------
def _one_of_each(owner):
    run = make_recorded_run(owner)
    record_reasoning_read(
        user=owner,
        session_id=run.session_id,
        run_id=run.run_id,
        records_returned=2,
        client_address="127.0.0.1",
        user_agent="pytest",
        channel=AccessChannel.API,
    )
    return run, {model: model.objects.filter(run_id=run.run_id).first() for model in READ_ONLY_MODELS}


def test_audit_reasoning_and_access_log_admins_deny_every_write_to_superusers(superuser, rf):
    _, rows = _one_of_each(superuser)
    request = rf.get("/admin/")
    request.user = superuser
    for model, obj in rows.items():
        model_admin = admin.site._registry[model]
        assert model_admin.has_view_permission(request, obj), model
        assert not model_admin.has_add_permission(request), model
        assert not model_admin.has_change_permission(request, obj), model
        assert not model_admin.has_change_permission(request), model
        assert not model_admin.has_delete_permission(request, obj), model
        assert "delete_selected" not in model_admin.get_actions(request), model


def test_posting_to_add_change_and_delete_urls_is_refused_for_superusers(superuser):
    _, rows = _one_of_each(superuser)
    client = _login(superuser)
    for model, obj in rows.items():
        before = model.objects.filter(pk=obj.pk).values().get()
        meta = model._meta
        change = _change_url(model, obj.pk)
        delete = reverse(f"admin:{meta.app_label}_{meta.model_name}_delete", args=[obj.pk])
        add = reverse(f"admin:{meta.app_label}_{meta.model_name}_add")
        changelist = reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist")
        assert client.get(change).status_code == 200, model  # viewable, read-only
        assert client.post(change, {"run_id": "x", "status": "x", "username": "x"}).status_code == 403, model
        assert client.post(delete, {"post": "yes"}).status_code == 403, model
        assert client.post(add, {}).status_code == 403, model
        client.post(changelist, {"action": "delete_selected", "_selected_action": [obj.pk], "post": "yes"})
        assert model.objects.filter(pk=obj.pk).values().get() == before, model


def test_runs_cannot_be_added_changed_or_deleted_in_the_admin(superuser):
    run = make_recorded_run(superuser)
    client = _login(superuser)
    assert client.post(_run_url(run), {"status": "FAILED"}).status_code == 403
    delete = reverse("admin:diagnosis_diagnosisrun_delete", args=[run.pk])
    assert client.post(delete, {"post": "yes"}).status_code == 403
    assert client.get(reverse("admin:diagnosis_diagnosisrun_add")).status_code == 403
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS


def test_access_log_is_visible_to_superusers_only(superuser, console_staff):
    _one_of_each(superuser)
    # Even an explicit view permission does not open the log to a non-superuser.
    console_staff.user_permissions.add(Permission.objects.get(codename="view_reasoningaccesslog"))
    changelist = reverse("admin:reasoning_reasoningaccesslog_changelist")
    staff = _login(console_staff)
    assert staff.get(changelist).status_code == 403
    assert changelist not in staff.get(reverse("admin:index")).content.decode()
    root = _login(superuser)
    assert root.get(changelist).status_code == 200
    assert changelist in root.get(reverse("admin:index")).content.decode()


def test_reasoning_admin_never_shows_content_columns(superuser):
    run = make_recorded_run(superuser)
    row = AgentReasoningAudit.objects.filter(run_id=run.run_id, reasoning_available=True).first()
    client = _login(superuser)
    for url in (
        reverse("admin:reasoning_agentreasoningaudit_changelist"),
        _change_url(AgentReasoningAudit, row.pk),
    ):
        page = client.get(url).content.decode()
        assert run.run_id in page
        assert REASONING_MARKER not in page
        assert "Reasoning content" not in page and "Assistant text" not in page


# --------------------------------------------------------------------------------------------------
# Roles
# --------------------------------------------------------------------------------------------------
def test_staff_viewers_group_holds_view_permissions_only_and_is_idempotent():
    group = Group.objects.get(name=STAFF_VIEWERS)
    codenames = set(group.permissions.values_list("codename", flat=True))
    expected = set(
        Permission.objects.filter(
            content_type__app_label__in=("diagnosis", "audit", "reasoning"), codename__startswith="view_"
        )
        .exclude(codename__in=WITHHELD_CODENAMES)
        .values_list("codename", flat=True)
    )
    assert codenames == expected
    assert {"view_diagnosisrun", "view_chatsession", "view_traceevent", "view_agentstep"} <= codenames
    assert {"view_toolinvocation", "view_agentreasoningaudit", "view_runfeedback"} <= codenames
    assert "view_reasoning_content" not in codenames and "view_reasoningaccesslog" not in codenames
    assert all(c.startswith("view_") for c in codenames)
    create_role_groups(sender=apps.get_app_config("access"))
    assert set(group.permissions.values_list("codename", flat=True)) == codenames
    assert Group.objects.filter(name=STAFF_VIEWERS).count() == 1


def test_staff_need_the_view_permission_to_open_runs(staff_user, superuser):
    run = make_recorded_run(superuser)
    client = _login(staff_user)
    assert client.get(_run_url(run)).status_code == 403
    grant_console(staff_user)
    client = _login(staff_user)
    assert client.get(_run_url(run)).status_code == 200
    assert client.get(reverse("admin:diagnosis_diagnosisrun_changelist")).status_code == 200


# --------------------------------------------------------------------------------------------------
# Run list
# --------------------------------------------------------------------------------------------------
def _listed(response) -> set[str]:
    assert response.status_code == 200
    return {run.run_id for run in response.context["cl"].result_list}


def test_run_list_filters_and_search(console_staff, user):
    published = make_recorded_run(user, query="Why is MySQL replication lagging?")
    blocked = make_blocked_run(user)
    failed = make_run_with_unfinished_tool(user)
    incomplete = _make_incomplete_run(user)
    client = _login(console_staff)
    url = reverse("admin:diagnosis_diagnosisrun_changelist")
    everything = {published.run_id, blocked.run_id, failed.run_id, incomplete.run_id}

    page = client.get(url)
    assert _listed(page) == everything
    html = page.content.decode()
    for label in ("run · session", "query", "status", "intent", "release", "tokens", "reconciled"):
        assert f">{label}<" in html.lower() or f">{label}</a>" in html.lower(), label
    assert "audit complete" in html and "duration" in html and "created" in html

    assert _listed(client.get(url, {"release_decision__exact": "BLOCKED"})) == {blocked.run_id}
    assert _listed(client.get(url, {"status__exact": "FAILED"})) == {failed.run_id}
    assert _listed(client.get(url, {"intent__exact": "DIAGNOSIS"})) == everything - {
        failed.run_id
    }  # unrouted
    assert _listed(client.get(url, {"audit_complete": "no"})) == {incomplete.run_id}
    assert _listed(client.get(url, {"audit_complete": "yes"})) == everything - {incomplete.run_id}
    not_reconciled = _listed(client.get(url, {"tokens_reconciled__exact": "0"}))
    assert blocked.run_id in not_reconciled and published.run_id not in not_reconciled

    assert _listed(client.get(url, {"q": blocked.run_id})) == {blocked.run_id}
    assert _listed(client.get(url, {"q": failed.session_id})) == {failed.run_id}
    assert _listed(client.get(url, {"q": "replication"})) == {published.run_id}
    day = published.created_at
    dated = {"created_at__year": day.year, "created_at__month": day.month, "created_at__day": day.day}
    assert _listed(client.get(url, dated)) == everything


def test_audit_complete_column_agrees_with_the_trace_summary(user, console_staff):
    running = services.create_run(session=services.create_session(owner=user), query="still running")
    RunRecorder.for_run(running).run_started()
    runs = [make_recorded_run(user), _make_incomplete_run(user), make_run_with_unfinished_tool(user), running]
    response = _login(console_staff).get(reverse("admin:diagnosis_diagnosisrun_changelist"))
    listed = {run.run_id: run.audit_complete for run in response.context["cl"].result_list}
    for run in runs:
        assert listed[run.run_id] == get_trace(run=run).summary.audit_complete, run.run_id


def _changelist_queries(client) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(reverse("admin:diagnosis_diagnosisrun_changelist")).status_code == 200
    return len(ctx.captured_queries)


def test_changelist_query_count_is_bounded_and_independent_of_rows(
    console_staff, django_user_model, django_assert_max_num_queries
):
    owners = [django_user_model.objects.create_user(f"owner{i}") for i in range(3)]
    make_recorded_run(owners[0])
    make_blocked_run(owners[1])

    def add_runs(n):
        for i in range(n):
            session = services.create_session(owner=owners[i % 3])
            services.create_run(session=session, query=f"question {i}")

    add_runs(8)
    client = _login(console_staff)
    ten = _changelist_queries(client)
    add_runs(90)
    assert DiagnosisRun.objects.count() == 100
    with django_assert_max_num_queries(CHANGELIST_MAX_QUERIES):
        response = client.get(reverse("admin:diagnosis_diagnosisrun_changelist"))
    assert len(response.context["cl"].result_list) == 100
    assert _changelist_queries(client) == ten


# --------------------------------------------------------------------------------------------------
# Run page
# --------------------------------------------------------------------------------------------------
def test_demo_runs_are_labelled_demo_in_the_list_and_on_the_run_page(console_staff, user):
    demo = make_recorded_run(user, provider="demo")
    real = make_recorded_run(user, provider="openai", query="Disk full on /var/log")
    client = _login(console_staff)
    listing = client.get(reverse("admin:diagnosis_diagnosisrun_changelist")).content.decode()
    rows = {run.run_id: listing[listing.index(run.run_id) :] for run in (demo, real)}
    assert ">DEMO<" in rows[demo.run_id].split("</tr>")[0]
    assert (
        ">DEMO<" not in rows[real.run_id].split("</tr>")[0]
        and "openai" in rows[real.run_id].split("</tr>")[0]
    )
    demo_page = client.get(_run_url(demo)).content.decode()
    verdict = demo_page[demo_page.index('id="verdict"') : demo_page.index('id="summary"')]
    assert 'id="dc-demo-label"' in verdict and "offline demo model, not a real model" in verdict
    real_page = client.get(_run_url(real)).content.decode()
    assert 'id="dc-demo-label"' not in real_page and "offline demo model" not in real_page


def test_a_blocked_run_whose_draft_was_streamed_is_flagged_in_the_list_and_on_its_page(console_staff, user):
    shown = make_blocked_run(user, release_mode="draft", draft_chars=321)
    verified = make_blocked_run(user)
    client = _login(console_staff)
    url = reverse("admin:diagnosis_diagnosisrun_changelist")
    page = client.get(url)
    html = page.content.decode()
    assert html.count("draft shown") == 1 and "321 characters of draft were streamed" in html
    assert _listed(client.get(url, {"unverified": "blocked"})) == {shown.run_id}
    assert _listed(client.get(url, {"unverified": "yes"})) == {shown.run_id}
    assert _listed(client.get(url, {"unverified": "no"})) == {verified.run_id}
    top = client.get(_run_url(shown)).content.decode()
    top = top[top.index('id="verdict"') : top.index('id="summary"')]
    assert "unverified text shown: 321 characters of draft were streamed to the reader" in top
    top = client.get(_run_url(verified)).content.decode()
    top = top[top.index('id="verdict"') : top.index('id="summary"')]
    assert "verified release: no answer text reached a reader before the release decision" in top


def test_blocked_run_page_explains_why_near_the_top(console_staff, user):
    run = make_blocked_run(user)
    response = _login(console_staff).get(_run_url(run))
    assert response.status_code == 200
    html = response.content.decode()
    verdict = html.index('id="verdict"')
    assert verdict < html.index('id="waterfall"') < html.index('id="timeline"')
    top = html[verdict : html.index('id="summary"')]
    assert "BLOCKED" in top and BLOCK_REASON in top
    assert "Evidence guard" in top and "UNKNOWN_CITATION" in top and "kb:deploy-rollback#1" in top
    assert "Semantic guard" in top and UNSUPPORTED_CLAIM in top
    assert "FAIL" in top


def test_run_page_sections_render_the_api_trace(console_staff, user):
    run = make_blocked_run(user)
    trace = serialize_trace(get_trace(run=run, viewer=console_staff))
    html = _login(console_staff).get(_run_url(run)).content.decode()
    # Summary and timing
    assert run.query in html and run.content in html
    assert "first output latency" in html and format_ms(run.total_duration_ms) in html
    # Timeline: every event, in sequence order, phase-coloured
    rows = re.findall(r'<tr id="ev-(\d+)" class="dc-ev dc-ev-(\w+)">', html)
    assert [int(seq) for seq, _ in rows] == [e["sequenceNo"] for e in trace["timeline"]]
    assert [phase for _, phase in rows] == [e["phase"].lower() for e in trace["timeline"]]
    # Waterfall: both steps, the tool, the router attempt and the semantic guard on the axis
    assert html.count('class="dc-wf-row dc-wf-step') == 2
    assert html.count('class="dc-wf-row dc-wf-tool dc-wf-nested"') == 1
    assert 'class="dc-wf-row dc-wf-router' in html and 'class="dc-wf-row dc-wf-guard' in html
    assert 'class="dc-wf-bar dc-wf-measured' in html
    # Token ledger: every MODEL_TOKEN_USAGE event, the guard call without usage named, verdict shown
    usage_events = [e for e in trace["timeline"] if e["eventType"] == "MODEL_TOKEN_USAGE"]
    for event in usage_events:
        assert f'<a href="#ev-{event["sequenceNo"]}">{event["sequenceNo"]}</a>' in html
    assert "not reported" in html and "1 call(s) reported no usage" in html and "GUARD guard-m" in html
    assert "not reconciled" in html
    # Tool calls: input, bounded preview, length, sha256, retrieval layer and counts
    tool = trace["tools"][0]
    assert tool["outputSha256"][:16] in html and f"{tool['outputLength']} chars" in html
    assert "L0+L1" in html and "L0 1 · L1 4" in html
    assert escape(tool["outputPreview"][:40]) in html
    # Audit summary
    assert 'id="audit"' in html and "hash chain" in html and "dc-audit-alert" not in html
    # No reasoning anywhere on the page, and no reasoning panel for staff
    assert REASONING_MARKER not in html
    assert "dc-reasoning-form" not in html and _reasoning_url(run) not in html


def test_run_page_shows_an_incomplete_audit_prominently(console_staff, user):
    run = _make_incomplete_run(user)
    html = _login(console_staff).get(_run_url(run)).content.decode()
    alert = html[html.index('id="dc-audit-alert"') : html.index('id="verdict"')]
    assert "audit incomplete" in alert and "1 audit write failure(s)" in alert
    assert "1 timeline event expected but not stored" in alert
    assert 'class="dc-row-bad"><th>events</th>' in html


def test_run_page_shows_whether_every_row_matches_its_digest(console_staff, user):
    run = make_recorded_run(user)
    client = _login(console_staff)
    html = client.get(_run_url(run)).content.decode()
    rows = html[html.index('id="dc-rows-verified"') :].split("</dd>")[0]
    assert ">verified<" in rows and "7 rows match the chain" in rows

    ToolInvocation.objects.filter(run_id=run.run_id, tool_call_id="call_0").update(status="FAILED")
    html = client.get(_run_url(run)).content.decode()
    rows = html[html.index('id="dc-rows-verified"') :].split("</dd>")[0]
    assert ">not verified<" in rows and "6 rows match the chain" in rows
    alert = html[html.index('id="dc-audit-alert"') : html.index('id="verdict"')]
    assert "rows not verified against their digests" in alert
    assert "tool call call_0: stored row does not match its digest" in html


def test_tool_without_measured_duration_is_drawn_open_ended(console_staff, user):
    run = make_run_with_unfinished_tool(user)
    tool = ToolInvocation.objects.get(run_id=run.run_id)
    assert tool.duration_ms is None and tool.status == "FAILED"
    html = _login(console_staff).get(_run_url(run)).content.decode()
    assert "dc-wf-bar dc-wf-unknown" in html and "duration unknown" in html

    page = build_run_page(get_trace(run=run))
    (bar,) = [b for b in page.waterfall.bars if b.kind == "tool"]
    assert bar.mode == "unknown" and bar.duration == "duration unknown" and "another process" in bar.title
    (step,) = [b for b in page.waterfall.bars if b.kind == "step"]
    assert step.mode == "derived"  # no recorded start: the recorded end minus the recorded duration


def _run_page_queries(client, run) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(_run_url(run)).status_code == 200
    return len(ctx.captured_queries)


def test_run_page_query_count_does_not_depend_on_the_number_of_events(
    console_staff, user, django_assert_max_num_queries
):
    small = make_recorded_run(user, tools=0)
    large = make_recorded_run(user, tools=40, extra_steps=110)
    assert TraceEvent.objects.filter(run_id=small.run_id).count() < 15
    assert TraceEvent.objects.filter(run_id=large.run_id).count() >= 300
    client = _login(console_staff)
    _run_page_queries(client, small)  # warm the session and permission caches alike for both
    with django_assert_max_num_queries(RUN_PAGE_MAX_QUERIES):
        client.get(_run_url(large))
    assert _run_page_queries(client, small) == _run_page_queries(client, large)


def test_session_page_lists_its_runs(console_staff, user):
    first = make_recorded_run(user)
    second = services.create_run(session=first.session, query="And the replica on db-2?")
    other = make_recorded_run(user)
    url = reverse("admin:diagnosis_chatsession_change", args=[first.session.pk])
    html = _login(console_staff).get(url).content.decode()
    assert first.run_id in html and second.run_id in html and other.run_id not in html
    assert _run_url(first) in html


# --------------------------------------------------------------------------------------------------
# Reasoning panel
# --------------------------------------------------------------------------------------------------
def test_reasoning_panel_is_forbidden_without_the_permission(console_staff, user):
    run = make_recorded_run(user)
    client = _login(console_staff)
    assert client.post(_reasoning_url(run)).status_code == 403
    assert client.get(_reasoning_url(run)).status_code == 403
    assert not ReasoningAccessLog.objects.exists()


def test_auditor_reads_reasoning_and_the_read_is_logged(console_auditor, user):
    run = make_recorded_run(user)
    client = _login(console_auditor)
    page = client.get(_run_url(run)).content.decode()
    assert 'id="dc-reasoning-form"' in page and _reasoning_url(run) in page
    assert REASONING_MARKER not in page  # the run page itself never carries reasoning
    assert not ReasoningAccessLog.objects.exists()

    response = client.post(_reasoning_url(run), HTTP_X_REQUESTED_WITH="fetch", HTTP_USER_AGENT="pytest-ua")
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    body = response.content.decode()
    assert REASONING_MARKER in body and 'id="dc-reasoning-records"' in body and "<html" not in body
    (entry,) = ReasoningAccessLog.objects.all()
    assert (entry.user, entry.username, entry.channel) == (console_auditor, "auditor", AccessChannel.ADMIN)
    assert (entry.session_id, entry.run_id) == (run.session_id, run.run_id)
    assert entry.records_returned == AgentReasoningAudit.objects.filter(run_id=run.run_id).count() == 2
    assert entry.client_address == "127.0.0.1" and entry.user_agent == "pytest-ua"

    # Without JavaScript the same POST renders a whole page, and is logged the same way.
    full = client.post(_reasoning_url(run))
    assert full.status_code == 200 and "<html" in full.content.decode()
    assert ReasoningAccessLog.objects.count() == 2


def test_reasoning_view_needs_post_with_csrf_token(console_auditor, user):
    run = make_recorded_run(user)
    client = _login(console_auditor)
    assert client.get(_reasoning_url(run)).status_code == 405
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(console_auditor)
    assert strict.post(_reasoning_url(run)).status_code == 403
    assert not ReasoningAccessLog.objects.exists()


def test_reasoning_view_of_a_missing_run_is_404(console_auditor):
    response = _login(console_auditor).post(reverse("admin:diagnosis_diagnosisrun_reasoning", args=[999999]))
    assert response.status_code == 404
    assert not ReasoningAccessLog.objects.exists()


# --------------------------------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------------------------------
def test_export_action_streams_the_api_trace_of_each_selected_run(console_staff, user, api_client):
    published = make_recorded_run(user)
    blocked = make_blocked_run(user)
    make_recorded_run(user)  # not selected
    services.submit_feedback(run=blocked, user=console_staff, rating="down", comment="wrong citation")
    response = _login(console_staff).post(
        reverse("admin:diagnosis_diagnosisrun_changelist"),
        {"action": "export_traces", "_selected_action": [published.pk, blocked.pk]},
    )
    assert response.status_code == 200 and response.streaming
    assert response["Content-Type"] == "application/x-ndjson"
    assert response["Content-Disposition"].startswith('attachment; filename="traces-')
    body = b"".join(response.streaming_content).decode()
    assert REASONING_MARKER not in body
    traces = [json.loads(line) for line in body.splitlines()]
    assert [t["run"]["runId"] for t in traces] == [published.run_id, blocked.run_id]

    api_client.force_login(console_staff)
    for trace in traces:
        api = api_client.get(f"/api/diagnosis/{trace['sessionId']}/trace", {"runId": trace["run"]["runId"]})
        assert api.status_code == 200
        assert trace == api.json()
    assert traces[1]["run"]["feedback"]["comment"] == "wrong citation"


def test_export_action_with_select_all_exports_the_filtered_list(console_staff, user):
    blocked = [make_blocked_run(user), make_blocked_run(user)]
    make_recorded_run(user)  # published: filtered out
    response = _login(console_staff).post(
        reverse("admin:diagnosis_diagnosisrun_changelist") + "?release_decision__exact=BLOCKED",
        {"action": "export_traces", "select_across": "1", "_selected_action": [blocked[0].pk]},
    )
    assert response.status_code == 200
    lines = b"".join(response.streaming_content).decode().splitlines()
    assert [json.loads(line)["run"]["runId"] for line in lines] == [r.run_id for r in blocked]


def test_single_run_trace_download_equals_the_api(console_staff, user, api_client):
    run = make_blocked_run(user)
    response = _login(console_staff).get(reverse("admin:diagnosis_diagnosisrun_trace_json", args=[run.pk]))
    assert response.status_code == 200
    (trace,) = json.loads(response.content)["traces"]
    api_client.force_login(console_staff)
    assert trace == api_client.get(f"/api/diagnosis/{run.session_id}/trace", {"runId": run.run_id}).json()


# --------------------------------------------------------------------------------------------------
# Demo accounts
# --------------------------------------------------------------------------------------------------
def test_bootstrap_demo_gives_demo_staff_and_auditor_the_console(settings, user):
    settings.DEBUG = True
    make_recorded_run(user)  # a database with runs: bootstrap_demo adds no demo runs (tested elsewhere)
    call_command("bootstrap_demo", stdout=io.StringIO())
    call_command("bootstrap_demo", stdout=io.StringIO())  # idempotent
    viewers = Group.objects.get(name=STAFF_VIEWERS)
    assert sorted(viewers.user_set.values_list("username", flat=True)) == ["auditor", "staff"]
    staff = viewers.user_set.get(username="staff")
    run = DiagnosisRun.objects.get()
    client = _login(staff)
    assert client.get(reverse("admin:diagnosis_diagnosisrun_changelist")).status_code == 200
    page = client.get(_run_url(run)).content.decode()
    assert 'id="verdict"' in page and "dc-reasoning-form" not in page
    assert (
        "dc-reasoning-form"
        in _login(viewers.user_set.get(username="auditor")).get(_run_url(run)).content.decode()
    )
