"""The trace API builds its body without DRF serializers (surfaces/api/trace_render.py); it must be exactly
`TraceSerializer(trace).data`, key order included, for every kind of trace."""

import json

import pytest
from django.db import OperationalError, connection

from audit.read import get_trace
from audit.write import RunRecorder
from diagnosis import services
from diagnosis.models import RunStatus
from diagnosis.selectors import get_visible_run
from surfaces.api.audit_serializers import TraceSerializer
from surfaces.api.trace_render import TraceRenderer, trace_data, trace_json
from tests.factories import record_full_run

pytestmark = pytest.mark.django_db


def _dict_body(trace) -> bytes:
    """The body as it was written before the steps and tools were written directly: `{**head, **rest}`
    through DRF's encoder, the events' stored text spliced in last (`trace_json` must equal it)."""
    from django.conf import settings
    from django.utils import timezone
    from rest_framework.utils.encoders import JSONEncoder as DRFEncoder

    from surfaces.api import trace_render as r

    tz = timezone.get_current_timezone()
    head = {**r._head(trace, tz), **r._rest(trace, tz)}
    text = json.dumps(head, cls=DRFEncoder, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    utc_view = settings.USE_TZ and r._utc(tz)
    items = ",".join(r._event_json(e, tz, utc_view) for e in trace.timeline)
    text = f'{text[:-1]},"timeline":[{items}]}}'
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029").encode("utf-8")


def _same(trace):
    fast = json.dumps(trace_data(trace), ensure_ascii=False)
    drf = json.dumps(TraceSerializer(trace).data, ensure_ascii=False)
    assert fast == drf
    # The endpoint's body: the events' details as stored text, the timeline last; the same value.
    body = trace_json(trace)
    assert body == _dict_body(trace)
    assert json.loads(body) == json.loads(drf)
    assert TraceRenderer().render(trace) == body
    assert "\u2028" not in body.decode() and "\u2029" not in body.decode()
    indented = TraceRenderer().render(trace, "application/json; indent=2")
    assert json.loads(indented) == json.loads(drf) and indented.startswith(b'{\n  "sessionId"')


def test_complete_run_with_feedback(user, run):
    record_full_run(run, tools=3, extra_steps=1)
    services.submit_feedback(run=run, user=user, rating="up", comment="thanks — 谢谢")
    visible = get_visible_run(user=user, session_id=run.session_id, run_id=run.run_id, with_feedback=True)
    trace = get_trace(run=visible)
    assert trace.feedback is not None and len(trace.timeline) > 20
    _same(trace)


def test_event_times_from_the_chains_text_with_and_without_microseconds(user, run):
    """The endpoint writes a stored event's time from the text the chain hashed it by
    (`StoredEvent.created_text`); DRF leaves out zero microseconds, so a time on a whole second, or one
    changed after the text was made, must still render as DRF renders it."""
    import datetime as dt

    record_full_run(run)
    trace = get_trace(run=run)
    events = trace.timeline
    assert all(e.created_at.microsecond for e in events[:3])
    events[0].created_text()
    events[0].created_at = events[0].created_at.replace(microsecond=0)
    events[1].created_at = events[1].created_at.replace(microsecond=0, second=7)
    events[2].created_at = events[2].created_at.astimezone(dt.timezone(dt.timedelta(hours=2)))
    _same(trace)
    body = json.loads(trace_json(trace))
    assert body["timeline"][0]["createdAt"].endswith(f":{events[0].created_at.second:02d}Z")


class _FailEvents:
    def __call__(self, execute, sql, params, many, context):
        if "diagnosis_trace_event" in sql and sql.lstrip().upper().startswith("INSERT"):
            raise OperationalError(1114, "The table is full")
        return execute(sql, params, many, context)


def test_failed_incomplete_run_with_a_running_tool(run):
    rec = RunRecorder.for_run(run)
    rec.run_started()
    from audit.write import DeclaredToolCall
    from reasoning.capture import build_capture
    from tests.factories import usage

    rec.model_step(
        step_index=1,
        agent_name="diagnosis_agent",
        model="m",
        usage=usage(1, 1),
        reasoning=build_capture(reasoning=None, text=""),
        tool_calls=[DeclaredToolCall(tool_call_id="c1", name="lookup_knowledge", arguments="{}")],
    )
    rec.tool_started(tool_call_id="c1", tool_name="lookup_knowledge", input_params={"query": "日志 x" * 300})
    with connection.execute_wrapper(_FailEvents()):
        rec.release(decision="BLOCKED", reason="nope")
    run.refresh_from_db()
    trace = get_trace(run=run)  # run still RUNNING, tool RUNNING, a write failure: gaps
    assert trace.summary.gaps and not trace.summary.audit_complete
    _same(trace)
    rec.finish(status=RunStatus.FAILED, error_code="LLM_TIMEOUT", error_message="timed out after 2 attempts")
    run.refresh_from_db()
    trace = get_trace(run=run, viewer=None)
    assert trace.run.error_code == "LLM_TIMEOUT"
    _same(trace)


def test_pending_run_without_records(run):
    _same(get_trace(run=run))


def test_an_anchored_run_and_one_rewritten_after_anchoring(user, run, settings):
    from audit.transparency import keys, log
    from tests.audit.transparency.support import rewrite_tool_output

    settings.AUDIT_SIGNING_KEYS = [keys.generate_key_text()]
    record_full_run(run)
    run.refresh_from_db()
    assert get_trace(run=run).summary.anchor is None
    log.checkpoint()
    trace = get_trace(run=run)
    anchor = trace.summary.anchor
    # The run, then the governance chain migrate wrote: one leaf more in the first checkpoint.
    assert (anchor.leaf_index, anchor.tree_size) == (0, 2) and trace.summary.audit_complete
    _same(trace)
    rewrite_tool_output(run, preview="forged")
    trace = get_trace(run=run)
    assert not trace.summary.audit_complete and trace.summary.chain_valid and trace.summary.rows_verified
    assert any("differs from the anchored one (the run was rewritten)" in g for g in trace.summary.gaps)
    assert any(g.startswith("write authentication: sequence") for g in trace.summary.gaps)
    _same(trace)


def test_details_stored_in_another_spelling_render_as_their_value(run):
    """Details with non-ASCII text are stored ASCII-escaped, a line separator is escaped as DRF does, and
    details stored in a non-canonical spelling (an older writer) still verify and render as their value."""
    from audit.models import TraceEvent

    rec = RunRecorder.for_run(run)
    rec.run_started()
    rec.release(decision="BLOCKED", reason="原因\u2028next line")
    rec.finish(status=RunStatus.SUCCESS, content="")
    run.refresh_from_db()
    trace = get_trace(run=run)
    assert trace.summary.chain_valid
    _same(trace)
    first = TraceEvent.objects.get(run_id=run.run_id, sequence_no=1)
    spaced = json.dumps(first.details, indent=1)  # the same value, another spelling
    with connection.cursor() as cur:
        cur.execute("UPDATE diagnosis_trace_event SET details = %s WHERE id = %s", [spaced, first.pk])
    trace = get_trace(run=run)
    assert trace.timeline[0].details_text == spaced and trace.summary.chain_valid
    _same(trace)


def _orm_trace(run, viewer):
    """The same trace read through the ORM's model instances (the export's path, `iter_traces`), none of
    the endpoint's compiled queries (`core.compiled`) or stored-text shortcuts."""
    from audit.read import iter_traces
    from diagnosis.models import DiagnosisRun

    (trace,) = iter_traces(DiagnosisRun.objects.filter(pk=run.pk), viewer=viewer)
    return trace


def test_endpoint_body_is_byte_identical_to_the_orm_read_of_a_full_anchored_run(client, user, run, settings):
    """The endpoint's body (compiled queries, stored details text) is byte for byte the body of the same
    trace read through model instances, for a complete anchored run with feedback, a price override and a
    review; and an edit the ORM read finds is found by the endpoint too."""
    import datetime as dt
    from decimal import Decimal

    from audit.models import ReviewVerdict
    from audit.transparency import keys, log
    from audit.write.reviews import record_review
    from pricing.models import PriceOverride

    settings.AUDIT_SIGNING_KEYS = [keys.generate_key_text()]
    record_full_run(run, tools=3, extra_steps=1)
    services.submit_feedback(run=run, user=user, rating="down", comment="nope — 不对")
    PriceOverride.objects.create(
        model_pattern="*",
        provider="",
        input_per_mtok=Decimal("1.5"),
        output_per_mtok=Decimal("2"),
        effective_from=dt.datetime(2020, 1, 1, tzinfo=dt.UTC),
    )
    user.is_staff = user.is_superuser = True
    user.save()
    run.refresh_from_db()
    record_review(run=run, user=user, verdict=ReviewVerdict.values[0], note="checked")
    log.checkpoint()
    client.force_login(user)
    url = f"/api/diagnosis/{run.session_id}/trace?runId={run.run_id}"

    body = client.get(url).content
    reference = _orm_trace(run, user)
    assert reference.summary.audit_complete and reference.summary.anchor is not None
    assert reference.reviews and reference.feedback is not None and reference.call_costs
    assert body == trace_json(reference)
    assert json.loads(body) == json.loads(json.dumps(TraceSerializer(reference).data))

    with connection.cursor() as cur:
        cur.execute(
            "UPDATE tool_invocation SET output_preview = %s WHERE run_id = %s", ["edited", run.run_id]
        )
    body = client.get(url).content
    reference = _orm_trace(run, user)
    assert not reference.summary.rows_verified
    assert body == trace_json(reference)


@pytest.mark.parametrize("zone", ["UTC", "Asia/Shanghai"])
def test_steps_and_tools_written_directly_with_odd_values(run, settings, zone):
    """Steps and tools with values no recorder writes (None everywhere, text to escape, U+2028, a UTC
    and a non-UTC time, JSON with floats and nesting, integers as booleans) give the body the dict
    encoding gives, in UTC and in another time zone."""
    import dataclasses
    import datetime as dt
    from types import SimpleNamespace

    from django.utils import timezone

    record_full_run(run, tools=2)
    trace = get_trace(run=run)
    odd = 'quote" back\\ nl\n tab\t line\u2028 para\u2029 中文 😀 nul\x00'
    tool = dict(vars(trace.tools[0]))
    tools = [
        SimpleNamespace(**{**tool, **{k: None for k in tool if k not in ("pk", "id")}}),
        SimpleNamespace(
            **{
                **tool,
                "tool_call_id": odd,
                "agent_name": "",
                "output_preview": odd,
                "is_truncated": 1,
                "input_params": {"b": [1, 2.5, None, True], "a": {"ü": odd}},
                "retrieval_details": [odd, -(2**70), 1e300],
                "started_at": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
                "finished_at": dt.datetime(
                    2026, 1, 2, 3, 4, 5, 600, tzinfo=dt.timezone(dt.timedelta(hours=8))
                ),
            }
        ),
    ]
    step = dict(vars(trace.steps[0]))
    steps = [
        SimpleNamespace(**{**step, **{k: None for k in step if k not in ("pk", "id")}}),
        SimpleNamespace(**{**step, "agent_name": odd, "has_tool_call": 0, "usage_available": 1, "model": ""}),
    ]
    trace = dataclasses.replace(trace, tools=tools, steps=steps)
    settings.TIME_ZONE = zone
    with timezone.override(zone):
        assert trace_json(trace) == _dict_body(trace)
