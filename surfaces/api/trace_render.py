"""The trace body built directly: exactly `TraceSerializer(trace).data`, without DRF's per-field machinery.

`surfaces.api.audit_serializers.TraceSerializer` stays the definition of the shape (OpenAPI schema, admin
export); this module produces the same keys, values and formats — date-times as DRF renders them (ISO 8601 in
the current time zone, `Z` for UTC), `None` for absent values — at a fraction of the cost for long runs (a
500-event trace spent most of its time in DRF field dispatch). `tests/audit/test_trace_render.py` holds
the two to equality on complete, failed, incomplete and feedback-carrying traces.
"""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.utils import timezone
from rest_framework.renderers import JSONRenderer
from rest_framework.utils.encoders import JSONEncoder as DRFEncoder

from audit.models import CHAT_AGENT_NAME
from audit.read import Counts, Trace
from pricing.rules import CURRENCY

_MONEY_PLACES = Decimal(
    "1e-10"
)  # surfaces.api.audit_serializers.MONEY: DRF quantizes to them and renders `{:f}`


def _utc(tz: dt.tzinfo) -> bool:
    return tz is dt.UTC or getattr(tz, "key", None) in ("UTC", "Etc/UTC")


def _dt(value: dt.datetime | None, tz: dt.tzinfo | None = None) -> str | None:
    """A date-time as DRF renders it; `tz`: the current time zone when the caller looked it up once."""
    if not value:
        return None
    if value.tzinfo is dt.UTC and settings.USE_TZ and _utc(tz or timezone.get_current_timezone()):
        # A stored time read back (UTC) shown in UTC: the same text as converting it first.
        text = value.isoformat()
        return text[:-6] + "Z"
    if settings.USE_TZ:
        tz = tz or timezone.get_current_timezone()
        value = value.astimezone(tz) if value.utcoffset() is not None else timezone.make_aware(value, tz)
    text = value.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _money(value: Decimal | None) -> str | None:
    return None if value is None else f"{Decimal(value).quantize(_MONEY_PLACES):f}"


def _cost(trace: Trace) -> dict[str, Any]:
    run = trace.run
    return {
        "amount": _money(run.cost),
        "currency": CURRENCY,
        "status": run.cost_status or "not_priced",
        "unpricedCalls": int(run.cost_unpriced_calls),
        "calls": [
            {
                "sequenceNo": int(v.event.sequence_no),
                "source": str((v.event.details or {}).get("source") or ""),
                "model": str((v.event.details or {}).get("model") or ""),
                "amount": _money(v.cost.amount),
                "status": str(v.cost.status),
                "priceSource": str(v.cost.source),
            }
            for v in trace.call_costs
        ],
    }


def _counts(c: Counts) -> dict[str, int]:
    return {"events": int(c.events), "steps": int(c.steps), "tools": int(c.tools)}


def _run(trace: Trace) -> dict[str, Any]:
    run = trace.run
    fb = trace.feedback
    ledger = trace.summary.ledger
    return {
        "runId": _str(run.run_id),
        "sessionId": _str(run.session_id),
        "query": _str(run.query),
        "status": _str(run.status),
        "agentFlow": _str(run.agent_flow),
        "intent": _str(run.intent),
        "releaseDecision": _str(run.release_decision),
        "content": _str(run.content),
        "error": (
            {"code": _str(run.error_code), "message": _str(run.error_message)} if run.error_code else None
        ),
        "provider": (
            {"name": _str(trace.provider.name), "demo": bool(trace.provider.demo)}
            if trace.provider is not None
            else None
        ),
        "timing": {
            "createdAt": _dt(run.created_at),
            "startedAt": _dt(run.started_at),
            "firstModelRequestAt": _dt(run.first_model_request_at),
            "firstOutputAt": _dt(run.first_output_at),
            "finishedAt": _dt(run.finished_at),
            "totalDurationMs": _int(run.total_duration_ms),
            "firstOutputLatencyMs": _int(run.first_output_latency_ms),
            "lastTokenAt": _dt(run.last_token_at),
            "releaseLatencyMs": _int(run.release_latency_ms),
        },
        "tokens": {
            "router": _int(run.tokens_router),
            "agent": _int(run.tokens_agent),
            "guard": _int(run.tokens_guard),
            "total": _int(run.tokens_total),
            "reasoning": _int(run.tokens_reasoning),
            "cachedInput": _int(run.tokens_cached_input),
            "usageAvailable": run.usage_unavailable_calls == 0,
            "reconciled": bool(ledger.reconciled),
            "unavailableCalls": _int(run.usage_unavailable_calls),
            "modelCalls": _int(run.model_calls),
            "reasoningUnreportedCalls": int(ledger.reasoning_unreported),
            "cachedUnreportedCalls": int(ledger.cached_unreported),
            "callsWithoutUsage": [str(n) for n in ledger.without_usage],
            "differences": [str(d) for d in ledger.differences],
            "byAgent": {str(k): int(v) for k, v in ledger.by_agent.items()},
        },
        "cost": _cost(trace),
        "delivery": {
            "releaseMode": run.release_mode or None,
            "unverifiedTextDelivered": run.unverified_text_delivered,
            "draftChars": _int(run.draft_chars),
        },
        "stepCount": trace.summary.returned.steps,
        "toolCallCount": trace.summary.returned.tools,
        "feedback": (
            {"rating": _str(fb.rating), "comment": _str(fb.comment), "createdAt": _dt(fb.created_at)}
            if fb is not None
            else None
        ),
        "selfEvaluation": run.self_evaluation,
    }


def trace_data(trace: Trace) -> dict[str, Any]:
    """The API body of `trace` (equal to `TraceSerializer(trace).data`)."""
    tz = timezone.get_current_timezone()
    return {**_head(trace, tz), "timeline": _timeline(trace, tz), **_rest(trace, tz)}


def trace_json(trace: Trace) -> bytes:
    """`trace_data(trace)` rendered as DRF's `JSONRenderer` renders it (compact, UTF-8 kept, U+2028 and
    U+2029 escaped, no NaN), with each event's details written as their stored text instead of being
    encoded again: the stored text is the canonical JSON the chain verified (or, for details stored in
    another spelling, valid JSON of the same value; `timeline_of` decoded it). The timeline comes last."""
    tz = timezone.get_current_timezone()
    utc_view = settings.USE_TZ and _utc(tz)
    head = _encode(_head(trace, tz))  # {"sessionId":…,"runResolution":…,"run":{…}}
    rest = _encode(_summary_reviews(trace))  # {"summary":{…},"reviews":[…]}
    steps = ",".join(map(_step_json, trace.steps))
    tools = ",".join(_tool_json(t, tz, utc_view) for t in trace.tools)
    items = ",".join(_event_json(e, tz, utc_view) for e in trace.timeline)
    text = f'{head[:-1]},"steps":[{steps}],"tools":[{tools}],{rest[1:-1]},"timeline":[{items}]}}'
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029").encode("utf-8")


# `json.dumps(value, cls=DRFEncoder, ensure_ascii=False, allow_nan=False, separators=(",", ":"))`: the
# encoder made once (what `JSONRenderer` makes per body).
_encode = DRFEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode
# The C encoder `_encode` builds per call for a value that is not a string, built once (as
# `audit.payloads` builds the canonical one): the same options, its default DRF's, without circular-
# reference markers (a JSON column's decoded value cannot be circular). Python's `_encode` without it.
_c_encode = (
    json.encoder.c_make_encoder(
        None, DRFEncoder().default, json.encoder.encode_basestring, None, ":", ",", False, False, False
    )
    if json.encoder.c_make_encoder is not None
    else None
)


def _value_json(value: Any) -> str:
    """`_encode(value)` of a JSON column's value."""
    if _c_encode is None or value.__class__ is str:
        return _encode(value)
    return "".join(_c_encode(value, 0))


def _jint(value: Any) -> str:
    return "null" if value is None else int.__repr__(int(value))


def _jbool(value: Any) -> str:
    return "true" if value else "false"


def _step_json(st: Any) -> str:
    """`_encode` of the step's item of `_rest(…)["steps"]`, written directly."""
    return (
        f'{{"stepIndex":{_jint(st.step_index)},"agentName":{_js(st.agent_name)},"model":{_js(st.model)},'
        f'"hasToolCall":{_jbool(st.has_tool_call)},"finishReason":{_js(st.finish_reason)},'
        f'"durationMs":{_jint(st.duration_ms)},"promptTokens":{_jint(st.prompt_tokens)},'
        f'"completionTokens":{_jint(st.completion_tokens)},"reasoningTokens":{_jint(st.reasoning_tokens)},'
        f'"cachedTokens":{_jint(st.cached_tokens)},"totalTokens":{_jint(st.total_tokens)},'
        f'"usageAvailable":{_jbool(st.usage_available)},'
        f'"reasoningAvailable":{_jbool(st.reasoning_available)},'
        f'"reasoningBytes":{_jint(st.reasoning_bytes)},"assistantBytes":{_jint(st.assistant_bytes)},'
        f'"contentSource":{_js(st.content_source)}}}'
    )


def _time_json(value: Any, tz: dt.tzinfo, utc_view: bool) -> str:
    """`_js(_dt(value, tz))`; a stored time shown in UTC as `isoformat()` with `Z`, which needs no escape."""
    if utc_view and value and value.tzinfo is dt.UTC:
        return '"' + value.isoformat()[:-6] + 'Z"'
    return _js(_dt(value, tz))


def _tool_json(t: Any, tz: dt.tzinfo, utc_view: bool) -> str:
    """`_encode` of the tool's item of `_rest(…)["tools"]`, written directly (its JSON columns through
    `_value_json`)."""
    return (
        f'{{"toolCallId":{_js(t.tool_call_id)},"providerToolCallId":{_js(t.provider_tool_call_id)},'
        f'"stepIndex":{_jint(t.step_index)},"agentName":{_js(t.agent_name or CHAT_AGENT_NAME)},'
        f'"toolName":{_js(t.tool_name)},"status":{_js(t.status)},"inputParams":{_value_json(t.input_params)},'
        f'"outputPreview":{_js(t.output_preview)},"outputLength":{_jint(t.output_length)},'
        f'"outputSha256":{_js(t.output_sha256)},"isTruncated":{_jbool(t.is_truncated)},'
        f'"retrievalLayer":{_js(t.retrieval_layer)},"l0MatchCount":{_jint(t.l0_match_count)},'
        f'"l1MatchCount":{_jint(t.l1_match_count)},"retrievalDetails":{_value_json(t.retrieval_details)},'
        f'"startedAt":{_time_json(t.started_at, tz, utc_view)},'
        f'"finishedAt":{_time_json(t.finished_at, tz, utc_view)},"durationMs":{_jint(t.duration_ms)},'
        f'"errorCode":{_js(t.error_code)},"errorMessage":{_js(t.error_message)}}}'
    )


_enc = json.encoder.encode_basestring


def _js(value: Any) -> str:
    return "null" if value is None else _enc(str(value))


def _event_time(e: Any, tz: dt.tzinfo, utc_view: bool) -> str | None:
    """`_dt(e.created_at, tz)`; for a stored time shown in UTC, from the text the chain verified it by
    (`StoredEvent.created_text`: microseconds always, where DRF's `isoformat()` leaves out zero ones)."""
    value = e.created_at
    stamp = getattr(e, "created_text", None)
    if stamp is None or not utc_view or not value or value.tzinfo is not dt.UTC:
        return _dt(value, tz)
    text = stamp()
    return (text if value.microsecond else text[:19] + text[26:])[:-6] + "Z"


def _event_json(e: Any, tz: dt.tzinfo, utc_view: bool) -> str:
    details = getattr(e, "details_text", None)
    if details is None or "NaN" in details or "Infinity" in details:
        details = json.dumps(e.details, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    created = _event_time(e, tz, utc_view)
    # `_js` of each text column, a plain string encoded without the call (as `_js` encodes it)
    phase, kind, status, summary, digest = e.phase, e.event_type, e.status, e.summary, e.hash
    return (
        f'{{"sequenceNo":{int(e.sequence_no)},'
        f'"phase":{_enc(phase) if phase.__class__ is str else _js(phase)},'
        f'"eventType":{_enc(kind) if kind.__class__ is str else _js(kind)},'
        f'"status":{_enc(status) if status.__class__ is str else _js(status)},'
        f'"summary":{_enc(summary) if summary.__class__ is str else _js(summary)},"details":{details},'
        f'"createdAt":{_js(created)},"hash":{_enc(digest) if digest.__class__ is str else _js(digest)}}}'
    )


def _head(trace: Trace, tz: dt.tzinfo) -> dict[str, Any]:
    return {
        "sessionId": _str(trace.session_id),
        "runResolution": _str(trace.run_resolution),
        "run": _run(trace),
    }


def _timeline(trace: Trace, tz: dt.tzinfo) -> list[dict[str, Any]]:
    return [
        {
            "sequenceNo": int(e.sequence_no),
            "phase": _str(e.phase),
            "eventType": _str(e.event_type),
            "status": _str(e.status),
            "summary": _str(e.summary),
            "details": e.details,
            "createdAt": _dt(e.created_at, tz),
            "hash": _str(e.hash),
        }
        for e in trace.timeline
    ]


def _rest(trace: Trace, tz: dt.tzinfo) -> dict[str, Any]:
    return {**_steps_tools(trace, tz), **_summary_reviews(trace)}


def _steps_tools(trace: Trace, tz: dt.tzinfo) -> dict[str, Any]:
    return {
        "steps": [
            {
                "stepIndex": _int(st.step_index),
                "agentName": _str(st.agent_name),
                "model": _str(st.model),
                "hasToolCall": bool(st.has_tool_call),
                "finishReason": _str(st.finish_reason),
                "durationMs": _int(st.duration_ms),
                "promptTokens": _int(st.prompt_tokens),
                "completionTokens": _int(st.completion_tokens),
                "reasoningTokens": _int(st.reasoning_tokens),
                "cachedTokens": _int(st.cached_tokens),
                "totalTokens": _int(st.total_tokens),
                "usageAvailable": bool(st.usage_available),
                "reasoningAvailable": bool(st.reasoning_available),
                "reasoningBytes": _int(st.reasoning_bytes),
                "assistantBytes": _int(st.assistant_bytes),
                "contentSource": _str(st.content_source),
            }
            for st in trace.steps
        ],
        "tools": [
            {
                "toolCallId": _str(t.tool_call_id),
                "providerToolCallId": _str(t.provider_tool_call_id),
                "stepIndex": _int(t.step_index),
                "agentName": _str(t.agent_name or CHAT_AGENT_NAME),
                "toolName": _str(t.tool_name),
                "status": _str(t.status),
                "inputParams": t.input_params,
                "outputPreview": _str(t.output_preview),
                "outputLength": _int(t.output_length),
                "outputSha256": _str(t.output_sha256),
                "isTruncated": bool(t.is_truncated),
                "retrievalLayer": _str(t.retrieval_layer),
                "l0MatchCount": _int(t.l0_match_count),
                "l1MatchCount": _int(t.l1_match_count),
                "retrievalDetails": t.retrieval_details,
                "startedAt": _dt(t.started_at, tz),
                "finishedAt": _dt(t.finished_at, tz),
                "durationMs": _int(t.duration_ms),
                "errorCode": _str(t.error_code),
                "errorMessage": _str(t.error_message),
            }
            for t in trace.tools
        ],
    }


def _summary_reviews(trace: Trace) -> dict[str, Any]:
    s = trace.summary
    return {
        "summary": {
            "persisted": _counts(s.persisted),
            "expected": _counts(s.expected),
            "returned": _counts(s.returned),
            "auditComplete": bool(s.audit_complete),
            "auditWriteFailures": int(s.audit_write_failures),
            "fencedWrites": int(s.fenced_writes),
            "chainValid": bool(s.chain_valid),
            "rowsVerified": bool(s.rows_verified),
            "rowsVerifiedCount": int(s.rows_verified_count),
            "anchor": (
                {
                    "checkpoint": _str(s.anchor.checkpoint),
                    "treeSize": int(s.anchor.tree_size),
                    "leafIndex": int(s.anchor.leaf_index),
                    "signedAt": _dt(s.anchor.signed_at),
                }
                if s.anchor is not None
                else None
            ),
            "gaps": [str(g) for g in s.gaps],
        },
        "reviews": [
            {
                "reviewId": _str(r.review_id),
                "verdict": _str(r.verdict),
                "note": _str(r.note),
                "reviewer": _str(r.reviewer),
                "sequenceNo": int(r.sequence_no),
                "createdAt": _dt(r.created_at),
                "superseded": bool(r.superseded),
            }
            for r in trace.reviews
        ],
    }


class TraceRenderer(JSONRenderer):
    """The trace endpoint's renderer: a `Trace` is rendered by `trace_json` (or, when the client asks for
    indentation, as `trace_data`); anything else (error bodies) as by `JSONRenderer`."""

    def render(self, data, accepted_media_type=None, renderer_context=None):
        if isinstance(data, Trace):
            if self.get_indent(accepted_media_type, renderer_context or {}) is None:
                return trace_json(data)
            data = trace_data(data)
        return super().render(data, accepted_media_type, renderer_context)
