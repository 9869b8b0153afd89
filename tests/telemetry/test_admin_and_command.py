"""The outbox in the admin (read-only list with lag, a line on the run page) and
`manage.py export_otel` backfilling into a real Phoenix."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from telemetry.models import ExportState, TraceExport
from telemetry.outbox import enqueue_finished_runs
from telemetry.spans import trace_id_of
from tests.telemetry.support import make_recorded_run

pytestmark = pytest.mark.django_db(transaction=True)


def test_outbox_admin_lists_state_and_lag_read_only(superuser, user):
    run = make_recorded_run(user)
    enqueue_finished_runs()
    client = Client()
    client.force_login(superuser)
    html = client.get(reverse("admin:telemetry_traceexport_changelist")).content.decode()
    assert run.run_id in html and "PENDING" in html and "(waiting)" in html
    row = TraceExport.objects.get(run_id=run.run_id)
    assert client.get(reverse("admin:telemetry_traceexport_change", args=[row.pk])).status_code == 200
    assert client.post(reverse("admin:telemetry_traceexport_delete", args=[row.pk])).status_code == 403


def test_run_page_shows_the_export_state_where_traces_are_exported(superuser, user, settings):
    run = make_recorded_run(user)
    client = Client()
    client.force_login(superuser)
    url = reverse("admin:diagnosis_diagnosisrun_change", args=[run.pk])
    assert 'id="dc-otel"' not in client.get(url).content.decode()
    settings.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT = "http://127.0.0.1:9/v1/traces"
    assert "the exporter enqueues finished runs" in client.get(url).content.decode()
    enqueue_finished_runs()
    TraceExport.objects.filter(run_id=run.run_id).update(
        state=ExportState.FAILED, attempts=2, last_error="x-y"
    )
    html = client.get(url).content.decode()
    assert "failed" in html and "2 attempts" in html and "x-y" in html


def test_export_otel_needs_an_endpoint(settings):
    settings.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT = ""
    with pytest.raises(CommandError, match="No OTLP endpoint"):
        call_command("export_otel")


def test_export_otel_backfills_and_reexports(user, phoenix_up):
    first, second = make_recorded_run(user), make_recorded_run(user)
    out = io.StringIO()
    call_command("export_otel", "--endpoint", phoenix_up.otlp_endpoint, stdout=out)
    assert "exported 2 run(s)" in out.getvalue()
    row = TraceExport.objects.get(run_id=first.run_id)
    assert row.state == ExportState.EXPORTED
    phoenix_up.wait_for_spans(trace_id_of(first.run_id), row.span_count)

    out = io.StringIO()
    call_command("export_otel", "--endpoint", phoenix_up.otlp_endpoint, "--run", second.run_id, stdout=out)
    assert "exported 1 run(s)" in out.getvalue()
    assert TraceExport.objects.get(run_id=second.run_id).attempts == 2

    out = io.StringIO()
    since = first.finished_at.isoformat()
    call_command("export_otel", "--endpoint", phoenix_up.otlp_endpoint, "--since", since, stdout=out)
    assert "exported 2 run(s)" in out.getvalue()
    with pytest.raises(CommandError, match="ISO 8601"):
        call_command("export_otel", "--endpoint", phoenix_up.otlp_endpoint, "--since", "yesterday")
