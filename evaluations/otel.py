"""Scores as OpenTelemetry: one `gen_ai.evaluation.result` span per score, parented to the run's root
span (the trace and span ids of `telemetry.spans`), exported when the score is recorded if an OTLP
endpoint is configured.

The span follows the GenAI conventions' evaluation result and adds the evaluator's version and kind,
the score's id and event, and a judge's model and usage. A judge's explanation is exported only with
content capture on, as a bounded preview; reasoning never. Export is best effort: the score is
recorded and chained first, and a failed export is logged and counted (`EXPORT_FAILURES`), never retried.
Details: docs/evaluations.md, *Where scores show* (OpenTelemetry).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from audit.payloads import clip
from evaluations.models import EvaluationScore, EvaluatorKind
from telemetry.outbox import make_exporter
from telemetry.selectors import exporter_enabled
from telemetry.spans import SCOPE, capture_content, resource, span_id_of, trace_id_of

logger = logging.getLogger("evaluations.otel")
EVENT_NAME = "gen_ai.evaluation.result"
EXPLANATION_CHARS = 500
EXPORT_FAILURES = {"count": 0}


def _ns(moment: dt.datetime) -> int:
    return int(moment.timestamp() * 1_000_000) * 1000


def attributes_of(score: EvaluationScore) -> dict[str, Any]:
    judged = score.kind == EvaluatorKind.LLM_JUDGE
    attributes: dict[str, Any] = {
        "gen_ai.evaluation.name": score.evaluator_name,
        "gen_ai.evaluation.score.label": score.label,
        "diagnosis.evaluation.evaluator.version": score.evaluator_version,
        "diagnosis.evaluation.evaluator.kind": score.kind,
        "diagnosis.evaluation.score.id": score.score_id,
        "diagnosis.sequence_no": score.sequence_no,
        "diagnosis.run.id": score.run_id,
    }
    if score.value is not None:
        attributes["gen_ai.evaluation.score.value"] = float(score.value)
    if score.fingerprint:
        attributes["diagnosis.run.config_fingerprint"] = score.fingerprint
    if score.explanation and (not judged or capture_content()):
        attributes["gen_ai.evaluation.explanation"] = clip(score.explanation, EXPLANATION_CHARS)
    if judged:
        attributes["gen_ai.request.model"] = score.judge_model
        for key, value in (
            ("gen_ai.usage.input_tokens", score.judge_input_tokens),
            ("gen_ai.usage.output_tokens", score.judge_output_tokens),
            ("gen_ai.usage.reasoning.output_tokens", score.judge_reasoning_tokens),
        ):
            if value is not None:
                attributes[key] = int(value)
        if score.judge_cost_usd is not None:
            attributes["diagnosis.evaluation.judge.cost_usd"] = float(score.judge_cost_usd)
    return attributes


def evaluation_spans(*, run_id: str, scores: Sequence[EvaluationScore]) -> list[ReadableSpan]:
    """One `gen_ai.evaluation.result` span per score, child of the run's root span."""
    trace_id = trace_id_of(run_id)
    parent = SpanContext(
        trace_id=trace_id, span_id=span_id_of(run_id, "run"), is_remote=False, trace_flags=TraceFlags(1)
    )
    res = resource()
    spans = []
    for score in scores:
        attributes = attributes_of(score)
        end = score.created_at
        start = end - dt.timedelta(milliseconds=score.judge_duration_ms or 0)
        spans.append(
            ReadableSpan(
                name=EVENT_NAME,
                context=SpanContext(
                    trace_id=trace_id,
                    span_id=span_id_of(run_id, f"evaluation:{score.score_id}"),
                    is_remote=False,
                    trace_flags=TraceFlags(1),
                ),
                parent=parent,
                resource=res,
                attributes=attributes,
                events=(Event(name=EVENT_NAME, attributes=attributes, timestamp=_ns(end)),),
                kind=SpanKind.INTERNAL,
                status=Status(StatusCode.ERROR, "judge_error")
                if score.label == "judge_error"
                else Status(StatusCode.UNSET),
                start_time=_ns(start),
                end_time=_ns(end),
                instrumentation_scope=SCOPE,
            )
        )
    return spans


def export_scores(*, run: Any, scores: Sequence[EvaluationScore], exporter: Any = None) -> bool:
    """Export `scores` of `run` now (see the module docstring); true when exported, false when no
    endpoint is configured or the export failed."""
    if not scores or (exporter is None and not exporter_enabled()):
        return False
    from opentelemetry.sdk.trace.export import SpanExportResult

    try:
        exporter = exporter or make_exporter()
        result = exporter.export(evaluation_spans(run_id=run.run_id, scores=scores))
    except Exception as exc:
        EXPORT_FAILURES["count"] += 1
        logger.warning("evaluation export raised run=%s error=%s", run.run_id, type(exc).__name__)
        return False
    if result != SpanExportResult.SUCCESS:
        EXPORT_FAILURES["count"] += 1
        logger.warning("evaluation export failed run=%s", run.run_id)
        return False
    return True
