"""Shapes one run's trace for the admin run page: verdict, timing, token ledger, timeline, tools, audit.

Input is the trace read model (`audit.read.get_trace`: the run row, its events, steps and tools as
stored, and the summary), the same object the API and the export serialize. Everything here is pure: no
query, no request, no template. The admin view fetches; `build_run_page` shapes; the template draws.
The waterfall is drawn by `surfaces.admin.waterfall`, the token ledger and cost by `surfaces.admin.ledger`.

Nothing here invents a fact: a time or a count the record does not hold is shown as unknown.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.runtime.replay import NOT_EXECUTED_REPLAY
from audit.models import EventType, Phase, ToolInvocation
from audit.read import AnchorView, ReviewView, Trace
from diagnosis.models import DiagnosisRun, FeedbackRating, ReleaseDecision, RunStatus
from diagnosis.selectors import FeedbackView
from surfaces.admin.display import (
    compact_json,
    delivery_note,
    format_duration,
    format_instant,
    format_ms,
    ms_between,
    pretty_json,
    tone,
)
from surfaces.admin.ledger import Ledger, build_ledger
from surfaces.admin.waterfall import Waterfall, build_waterfall
from surfaces.answers import render_answer

PHASE_ORDER = {phase: n for n, phase in enumerate(Phase)}
GUARD_EVENT_LABELS = {
    EventType.EVIDENCE_GUARD_INITIAL: "Evidence guard",
    EventType.EVIDENCE_GUARD_RETRY: "Evidence guard (retry)",
    EventType.SEMANTIC_GUARD_DECISION: "Semantic guard",
}


def _text(value: Any) -> str:
    """A bounded details value as text (the recorder turns long strings into preview objects)."""
    if isinstance(value, Mapping) and "preview" in value:
        return f"{value['preview']}… ({value.get('length')} chars)"
    return str(value)


def _last(trace: Trace, event_type: EventType):
    return next((e for e in reversed(trace.timeline) if e.event_type == event_type), None)


# ---------------------------------------------------------------------------------------------------
# Verdict: why the run ended the way it did, for the top of the page
# ---------------------------------------------------------------------------------------------------
@dataclass(slots=True)
class GuardVerdict:
    label: str
    sequence_no: int
    status: str
    tone: str
    lines: list[str]


@dataclass(slots=True)
class Verdict:
    headline: str
    tone: str
    release_reason: str
    guards: list[GuardVerdict]
    routing: str
    error: str
    notes: list[str]
    provider: str = ""
    demo: bool = False


def _guard_lines(event_type: str, details: Mapping[str, Any]) -> list[str]:
    lines: list[str] = []
    if event_type == EventType.SEMANTIC_GUARD_DECISION:
        claims = details.get("unsupportedClaims") or []
        if claims:
            lines.append(f"{len(claims)} unsupported claim(s):")
            lines.extend(f"“{_text(c)}”" for c in claims)
        if details.get("reason"):
            lines.append(f"reason: {_text(details['reason'])}")
        if details.get("error"):
            lines.append(f"error: {_text(details['error'])}")
        if details.get("model"):
            lines.append(f"model {details['model']}")
        return lines
    if details.get("required") is False:
        lines.append("evidence not required for this intent")
    reasons = details.get("reasons") or []
    if reasons:
        lines.append("reasons: " + ", ".join(_text(r) for r in reasons))
    unknown = details.get("unknown") or []
    if unknown:
        lines.append("unknown citations: " + ", ".join(_text(u) for u in unknown))
    cited = details.get("cited") or []
    lines.append(f"{len(cited)} citation(s)" + (": " + ", ".join(_text(c) for c in cited) if cited else ""))
    return lines


DEMO_NOTE = (
    "DEMO run: answered by the offline demo model, not a real model; its text and reasoning are computed "
    "from the runbooks by the demo provider"
)


def build_verdict(trace: Trace) -> Verdict:
    run = trace.run
    decision, status = run.release_decision, run.status
    release = _last(trace, EventType.RELEASE_DECISION)
    routing = _last(trace, EventType.ROUTING_DECISION)
    cancelled = next((e for e in trace.timeline if e.event_type == EventType.RUN_CANCELLED), None)
    guards = [
        GuardVerdict(
            label=GUARD_EVENT_LABELS[e.event_type],
            sequence_no=e.sequence_no,
            status=e.status or "",
            tone=tone(e.status),
            lines=_guard_lines(e.event_type, e.details or {}),
        )
        for e in trace.timeline
        if e.event_type in GUARD_EVENT_LABELS
    ]
    release_reason = ""
    if release is not None:
        release_reason = _text((release.details or {}).get("reason") or release.summary or "")
    error_text = f"{run.error_code}: {run.error_message}" if run.error_code else ""
    notes: list[str] = []
    if decision:
        headline, verdict_tone = decision, tone(decision)
    elif status in (RunStatus.PENDING, RunStatus.RUNNING):
        headline, verdict_tone = f"{status} — no release decision yet", "warn"
    else:
        headline, verdict_tone = f"{status} — no release decision recorded", tone(status)
    if status == RunStatus.FAILED:
        verdict_tone = "bad"
    if cancelled is not None:
        notes.append(f"cancelled: {cancelled.summary}")
    if decision == ReleaseDecision.BLOCKED and not release_reason:
        notes.append("the release event is missing from the timeline: see the audit summary")
    delivered = delivery_note(run)
    if delivered is not None:
        notes.append(delivered[1])
    routing_text = ""
    if routing is not None:
        details = routing.details or {}
        routing_text = f"{details.get('intent') or run.intent}"
        if details.get("fallback"):
            routing_text += " (fallback: the router's answer was unusable)"
        elif details.get("confidence") is not None:
            routing_text += f" (confidence {details['confidence']})"
        if details.get("reason"):
            routing_text += f" — {_text(details['reason'])}"
    if trace.provider is not None and trace.provider.demo:
        notes.insert(0, DEMO_NOTE)
    return Verdict(
        provider=trace.provider.name if trace.provider is not None else "",
        demo=bool(trace.provider is not None and trace.provider.demo),
        headline=headline,
        tone=verdict_tone,
        release_reason=release_reason,
        guards=guards,
        routing=routing_text,
        error=error_text,
        notes=notes,
    )


# ---------------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------------
def build_timing(run: DiagnosisRun) -> list[tuple[str, str, str]]:
    """(label, value, title) rows: the latencies, then each recorded instant as an offset from creation
    (the absolute time is in the title)."""
    created, started = run.created_at, run.started_at
    first_request, first_output, finished = run.first_model_request_at, run.first_output_at, run.finished_at

    def offset(value: dt.datetime | None) -> str:
        if value is None:
            return "—"
        return "+" + format_ms(ms_between(created, value)) if created else format_instant(value)

    return [
        ("total", format_ms(run.total_duration_ms), "created → finished"),
        ("first output latency", format_ms(run.first_output_latency_ms), "created → first visible text"),
        ("release latency", format_ms(run.release_latency_ms), "answer's last token → release (the guards)"),
        ("queue wait", format_ms(ms_between(created, started)), "created → started"),
        ("start → model request", format_ms(ms_between(started, first_request)), "started → first request"),
        ("started", offset(started), format_instant(started)),
        ("first model request", offset(first_request), format_instant(first_request)),
        ("first output", offset(first_output), format_instant(first_output)),
        ("finished", offset(finished), format_instant(finished)),
    ]


# ---------------------------------------------------------------------------------------------------
# Self-evaluation (AI Ops)
# ---------------------------------------------------------------------------------------------------
@dataclass(slots=True)
class SelfEvaluation:
    """The run's stored self-evaluation as rows (signal, value, tone); `stated` is the model's own
    confidence, shown apart because it is a claim, not a measurement."""

    rows: list[tuple[str, str, str]]
    stated: str | None


def build_self_evaluation(run: DiagnosisRun) -> SelfEvaluation | None:
    data = run.self_evaluation
    if not isinstance(data, dict):
        return None

    def get(section: str) -> dict[str, Any]:
        value = data.get(section)
        return value if isinstance(value, dict) else {}

    ev, tools, guards, calls, plan = (get(k) for k in ("evidence", "tools", "guards", "modelCalls", "plan"))
    not_gathered = ev.get("citedNotGathered") or []
    rows = [
        (
            "evidence cited / gathered",
            f"{ev.get('cited', '—')} / {ev.get('gathered', '—')}"
            + (f" · cited but not gathered: {', '.join(map(str, not_gathered))}" if not_gathered else ""),
            "bad" if not_gathered or not ev.get("cited") else "good",
        ),
        (
            "tool calls failed / total",
            f"{tools.get('failed', '—')} / {tools.get('total', '—')}",
            "bad" if tools.get("failed") else "good",
        ),
        (
            "guards",
            f"evidence {guards.get('evidence') or '—'} · semantic {guards.get('semantic') or '—'} · "
            f"{guards.get('evidenceRetries', 0)} repair round(s)",
            "good" if guards.get("evidence") == "PASS" and guards.get("semantic") == "PASS" else "bad",
        ),
        (
            "model calls without usage",
            f"{calls.get('withoutUsage', '—')} of {calls.get('total', '—')}",
            "bad" if calls.get("withoutUsage") else "good",
        ),
        (
            "plan steps done / planned",
            f"{plan.get('done', '—')} / {plan.get('planned', '—')}"
            + (f" · {plan.get('withoutTool')} without a tool" if plan.get("withoutTool") else "")
            + (f" · {plan.get('revisions')} revision(s)" if plan.get("revisions") else "")
            + (" · default plan (the planner's was unusable)" if plan.get("fallback") else ""),
            "good" if plan.get("done") == plan.get("planned") else "warn",
        ),
    ]
    stated = data.get("statedByModel")
    confidence = stated.get("confidence") if isinstance(stated, dict) else None
    return SelfEvaluation(rows=rows, stated=str(confidence) if confidence else None)


# ---------------------------------------------------------------------------------------------------
# Timeline
# ---------------------------------------------------------------------------------------------------
@dataclass(slots=True)
class TimelineRow:
    sequence_no: int
    phase: str
    event_type: str
    status: str
    tone: str
    summary: str
    offset: str
    created_at: str
    hash: str
    details_json: str
    gap_before: list[int] = field(default_factory=list)


def build_timeline(trace: Trace, origin: dt.datetime | None) -> list[TimelineRow]:
    """Every returned event in sequence order; a row also names the sequence numbers missing before it."""
    rows: list[TimelineRow] = []
    expected_next = 1
    for event in trace.timeline:
        seq, created = event.sequence_no, event.created_at
        gap = list(range(expected_next, seq)) if seq > expected_next else []
        rows.append(
            TimelineRow(
                sequence_no=seq,
                phase=event.phase or "",
                event_type=event.event_type or "",
                status=event.status or "",
                tone=tone(event.status),
                summary=event.summary or "",
                offset=("+" + format_ms(ms_between(origin, created))) if origin and created else "—",
                created_at=format_instant(created),
                hash=event.hash or "",
                details_json=pretty_json(event.details or {}),
                gap_before=gap,
            )
        )
        expected_next = max(expected_next, seq + 1)
    return rows


# ---------------------------------------------------------------------------------------------------
# Tools and audit summary
# ---------------------------------------------------------------------------------------------------
@dataclass(slots=True)
class ToolRow:
    """A stored tool invocation with what the page shows beside it."""

    tool: ToolInvocation
    tone: str
    input_json: str
    retrieval_json: str
    duration: str
    started: str
    finished: str
    # A replay's call the sandbox did not execute (agent.runtime.replay): shown as such, not as failed.
    not_executed: bool = False


def build_tools(trace: Trace) -> list[ToolRow]:
    return [
        ToolRow(
            tool=tool,
            tone="warn" if tool.error_code == NOT_EXECUTED_REPLAY else tone(tool.status),
            input_json=compact_json(tool.input_params or {}),
            retrieval_json=pretty_json(tool.retrieval_details or {}),
            duration=format_duration(tool.duration_ms) if tool.duration_ms is not None else "unknown",
            started=format_instant(tool.started_at),
            finished=format_instant(tool.finished_at),
            not_executed=tool.error_code == NOT_EXECUTED_REPLAY,
        )
        for tool in trace.tools
    ]


@dataclass(slots=True)
class ReplayView:
    """A sandboxed replay, as its RUN_STARTED chained it: the run it replays (empty: not known) and its
    calls the sandbox did not execute."""

    source_run_id: str
    not_executed: list[ToolInvocation]


def build_replay(trace: Trace) -> ReplayView | None:
    started = next((e for e in trace.timeline if e.event_type == EventType.RUN_STARTED), None)
    replay = (started.details or {}).get("replay") if started is not None else None
    if not isinstance(replay, Mapping):
        return None
    calls = [t for t in trace.tools if t.error_code == NOT_EXECUTED_REPLAY]
    return ReplayView(source_run_id=str(replay.get("sourceRunId") or ""), not_executed=calls)


@dataclass(slots=True)
class AuditSummary:
    complete: bool
    chain_valid: bool
    write_failures: int
    rows: list[tuple[str, int, int, int, bool]]
    gaps: list[str]
    problems: list[str]
    rows_verified: bool = False
    rows_verified_count: int = 0
    fenced_writes: int = 0
    anchor: AnchorView | None = None  # where the transparency log anchors the run (None: not yet)
    # The run is interrupted, waiting for a person's decision: its record is not finished (so not
    # "complete") but nothing is missing from it either; the page says "waiting for approval".
    waiting: bool = False


def build_audit(trace: Trace) -> AuditSummary:
    summary = trace.summary
    rows = []
    for kind in ("events", "steps", "tools"):
        persisted = getattr(summary.persisted, kind)
        expected = getattr(summary.expected, kind)
        returned = getattr(summary.returned, kind)
        rows.append((kind, persisted, expected, returned, persisted == expected and returned == persisted))
    problems = []
    waiting = trace.run.status == RunStatus.INTERRUPTED and not summary.audit_complete
    if not summary.audit_complete and not waiting:
        problems.append("audit incomplete")
    if summary.audit_write_failures:
        problems.append(f"{summary.audit_write_failures} audit write failure(s)")
    if not summary.chain_valid:
        problems.append("hash chain invalid")
    if not summary.rows_verified:
        problems.append("rows not verified against their digests")
    return AuditSummary(
        rows_verified=summary.rows_verified,
        rows_verified_count=summary.rows_verified_count,
        fenced_writes=summary.fenced_writes,
        complete=summary.audit_complete,
        chain_valid=summary.chain_valid,
        write_failures=summary.audit_write_failures,
        rows=rows,
        gaps=list(summary.gaps),
        problems=problems,
        anchor=summary.anchor,
        waiting=waiting,
    )


def tools_left_out(trace: Trace) -> list[tuple[str, str]]:
    """`(tool, why)` of the tools the run's RUN_STARTED configuration left out (none: every tool of its
    flow was offered, or the run started before tools were left out)."""
    started = next((e for e in trace.timeline if e.event_type == EventType.RUN_STARTED), None)
    details = started.details if started is not None and isinstance(started.details, Mapping) else {}
    left = ((details.get("configuration") or {}).get("tools") or {}).get("leftOut")
    return sorted((str(k), str(v)) for k, v in left.items()) if isinstance(left, Mapping) else []


# ---------------------------------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------------------------------
@dataclass(slots=True)
class RunPage:
    """Everything the run page template draws. `run`, `feedback`, `step_count` and `tool_count` are the
    trace's own (the viewer's feedback; the returned step and tool rows); `content_html` is the released
    content as the chat page shows it (`surfaces.answers.render_answer`: sanitized, citations linked)."""

    run: DiagnosisRun
    content_html: str
    feedback: FeedbackView | None
    feedback_tone: str
    answer_blocked: bool
    step_count: int
    tool_count: int
    verdict: Verdict
    timing: list[tuple[str, str, str]]
    ledger: Ledger
    self_evaluation: SelfEvaluation | None
    timeline: list[TimelineRow]
    waterfall: Waterfall
    tools: list[ToolRow]
    # The flow's tools not offered to the run and why (its configuration's `tools.leftOut`).
    tools_left_out: list[tuple[str, str]]
    audit: AuditSummary
    phase_counts: list[tuple[str, int]]
    created_at: str
    # Human reviews, newest first (the latest is current; earlier ones are superseded, all kept).
    reviews: list[ReviewView] = field(default_factory=list)
    replay: ReplayView | None = None


def build_run_page(trace: Trace) -> RunPage:
    run = trace.run
    origin = run.created_at or run.started_at
    timeline = build_timeline(trace, origin)
    counts: dict[str, int] = {}
    for row in timeline:
        counts[row.phase] = counts.get(row.phase, 0) + 1
    feedback = trace.feedback
    return RunPage(
        run=run,
        content_html=render_answer(run.content or ""),
        feedback=feedback,
        feedback_tone="good" if feedback is not None and feedback.rating == FeedbackRating.UP else "bad",
        answer_blocked=run.release_decision == ReleaseDecision.BLOCKED,
        step_count=trace.summary.returned.steps,
        tool_count=trace.summary.returned.tools,
        verdict=build_verdict(trace),
        timing=build_timing(run),
        ledger=build_ledger(trace),
        self_evaluation=build_self_evaluation(run),
        timeline=timeline,
        waterfall=build_waterfall(trace),
        tools=build_tools(trace),
        tools_left_out=tools_left_out(trace),
        audit=build_audit(trace),
        phase_counts=sorted(counts.items(), key=lambda item: PHASE_ORDER.get(item[0], len(PHASE_ORDER))),
        created_at=format_instant(origin),
        reviews=list(reversed(trace.reviews)),
        replay=build_replay(trace),
    )
