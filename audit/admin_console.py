"""Shapes one run's trace for the admin run page: verdict, timing, token ledger, waterfall, tools, audit.

Input is the API's trace dict (the contract's camelCase shape, exactly what `GET …/trace?runId=` returns
and what the admin export downloads) plus the recorded start/end times of the agent's model steps, which
the contract's step shape does not carry. Everything here is pure: no query, no request, no template. The
admin view fetches; `build_run_console` shapes; the template draws.

Nothing here invents a fact. A time the record does not hold is shown as unknown, a bar whose start is
derived from a recorded end minus a recorded duration is marked as derived, and a tool without a measured
duration is drawn open-ended and hatched.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

USAGE_SOURCES = ("ROUTER", "AGENT", "GUARD")
PHASE_ORDER = {phase: n for n, phase in enumerate(("RUN", "ROUTING", "AGENT", "TOOL", "GUARD", "RELEASE"))}
GUARD_EVENT_LABELS = {
    "EVIDENCE_GUARD_INITIAL": "Evidence guard",
    "EVIDENCE_GUARD_RETRY": "Evidence guard (retry)",
    "SEMANTIC_GUARD_DECISION": "Semantic guard",
}
GOOD_STATUSES = frozenset(
    {"PASS", "PUBLISHED", "SUCCEEDED", "SUCCESS", "OK", "DECIDED", "REPORTED", "ANSWER"}
)
BAD_STATUSES = frozenset(
    {"FAIL", "BLOCKED", "FAILED", "ERROR", "REFUSED", "INVALID", "UNAVAILABLE", "ABANDONED", "INTERRUPTED"}
)
WARN_STATUSES = frozenset({"FALLBACK", "CANCELLED", "RUNNING", "PENDING", "TOOL_CALLS"})
# A bar narrower than this share of the axis is widened so that it stays visible (its label keeps the value).
MIN_BAR_PERCENT = 0.4
TICK_STEPS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 250, 500, 1000, 2000, 5000, 10_000, 15_000, 30_000, 60_000)


def tone(status: str | None) -> str:
    """The colour family of a status word: good, bad, warn or neutral."""
    if not status:
        return "neutral"
    status = str(status).upper()
    if status in BAD_STATUSES:
        return "bad"
    if status in GOOD_STATUSES:
        return "good"
    if status in WARN_STATUSES:
        return "warn"
    return "neutral"


def parse_time(value: Any) -> dt.datetime | None:
    """An aware datetime from the trace's ISO 8601 string (or a datetime), None when absent."""
    if value is None or value == "":
        return None
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    parsed = dt.datetime.fromisoformat(str(value))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def _ms_between(start: dt.datetime | None, end: dt.datetime | None) -> int | None:
    if start is None or end is None:
        return None
    return round((end - start).total_seconds() * 1000)


def format_ms(ms: float | int | None) -> str:
    """Compact human duration: `840 ms`, `2.35 s`, `1 m 05 s`; an em dash when unknown."""
    if ms is None:
        return "—"
    ms = float(ms)
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.2f} s"
    minutes, seconds = divmod(round(ms / 1000), 60)
    return f"{minutes} m {seconds:02d} s"


def format_duration(ms: int | None) -> str:
    """A recorded duration: like `format_ms`, but a whole-millisecond 0 reads `<1 ms` (it was measured)."""
    if ms is not None and 0 <= ms < 1:
        return "<1 ms"
    return format_ms(ms)


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def compact_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(", ", ": "), default=str)


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


def _guard_lines(event: Mapping[str, Any]) -> list[str]:
    details = event.get("details") or {}
    lines: list[str] = []
    if event.get("eventType") == "SEMANTIC_GUARD_DECISION":
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


def _text(value: Any) -> str:
    """A bounded details value as text (the recorder turns long strings into preview objects)."""
    if isinstance(value, Mapping) and "preview" in value:
        return f"{value['preview']}… ({value.get('length')} chars)"
    return str(value)


def build_verdict(trace: Mapping[str, Any]) -> Verdict:
    run = trace["run"]
    timeline = trace.get("timeline") or []
    decision = run.get("releaseDecision")
    status = run.get("status")
    release = next((e for e in reversed(timeline) if e.get("eventType") == "RELEASE_DECISION"), None)
    routing = next((e for e in reversed(timeline) if e.get("eventType") == "ROUTING_DECISION"), None)
    cancelled = next((e for e in timeline if e.get("eventType") == "RUN_CANCELLED"), None)
    guards = [
        GuardVerdict(
            label=GUARD_EVENT_LABELS[e["eventType"]],
            sequence_no=e.get("sequenceNo"),
            status=e.get("status") or "",
            tone=tone(e.get("status")),
            lines=_guard_lines(e),
        )
        for e in timeline
        if e.get("eventType") in GUARD_EVENT_LABELS
    ]
    release_reason = ""
    if release is not None:
        release_reason = _text((release.get("details") or {}).get("reason") or release.get("summary") or "")
    error = run.get("error") or None
    error_text = f"{error.get('code')}: {error.get('message')}" if error else ""
    notes: list[str] = []
    if decision:
        headline, verdict_tone = decision, tone(decision)
    elif status in ("PENDING", "RUNNING"):
        headline, verdict_tone = f"{status} — no release decision yet", "warn"
    else:
        headline, verdict_tone = f"{status} — no release decision recorded", tone(status)
    if status == "FAILED":
        verdict_tone = "bad"
    if cancelled is not None:
        notes.append(f"cancelled: {cancelled.get('summary')}")
    if decision == "BLOCKED" and not release_reason:
        notes.append("the release event is missing from the timeline: see the audit summary")
    routing_text = ""
    if routing is not None:
        details = routing.get("details") or {}
        routing_text = f"{details.get('intent') or run.get('intent')}"
        if details.get("fallback"):
            routing_text += " (fallback: the router's answer was unusable)"
        elif details.get("confidence") is not None:
            routing_text += f" (confidence {details['confidence']})"
        if details.get("reason"):
            routing_text += f" — {_text(details['reason'])}"
    return Verdict(
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
def build_timing(run: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(label, value, title) rows: the latencies, then each recorded instant as an offset from creation
    (the absolute time is in the title)."""
    timing = run.get("timing") or {}
    created = parse_time(timing.get("createdAt"))
    started = parse_time(timing.get("startedAt"))
    first_request = parse_time(timing.get("firstModelRequestAt"))
    first_output = parse_time(timing.get("firstOutputAt"))
    finished = parse_time(timing.get("finishedAt"))

    def offset(value: dt.datetime | None) -> str:
        if value is None:
            return "—"
        return "+" + format_ms(_ms_between(created, value)) if created else _iso(value)

    return [
        ("total", format_ms(timing.get("totalDurationMs")), "created → finished"),
        (
            "first output latency",
            format_ms(timing.get("firstOutputLatencyMs")),
            "created → first visible text",
        ),
        ("queue wait", format_ms(_ms_between(created, started)), "created → started"),
        ("start → model request", format_ms(_ms_between(started, first_request)), "started → first request"),
        ("started", offset(started), _iso(started)),
        ("first model request", offset(first_request), _iso(first_request)),
        ("first output", offset(first_output), _iso(first_output)),
        ("finished", offset(finished), _iso(finished)),
    ]


def _iso(value: dt.datetime | None) -> str:
    if value is None:
        return "—"
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


# ---------------------------------------------------------------------------------------------------
# Token ledger
# ---------------------------------------------------------------------------------------------------
@dataclass(slots=True)
class LedgerCall:
    sequence_no: int
    source: str
    model: str
    step_index: int | None
    available: bool
    prompt: int | None
    completion: int | None
    reasoning: int | None
    cached: int | None
    total: int | None


@dataclass(slots=True)
class LedgerRow:
    label: str
    ledger: int | None
    from_calls: int
    matches: bool


@dataclass(slots=True)
class Ledger:
    rows: list[LedgerRow]
    calls: list[LedgerCall]
    unavailable: list[LedgerCall]
    reconciled: bool
    usage_available: bool
    verdict: str
    problems: list[str]


def build_ledger(trace: Mapping[str, Any]) -> Ledger:
    """Per-call usage from every MODEL_TOKEN_USAGE event (router, agent and guard), summed per source and
    compared with the run's ledger; the recorder's own verdict (`reconciled`) is shown with the reasons."""
    tokens = trace["run"].get("tokens") or {}
    calls = []
    for event in trace.get("timeline") or []:
        if event.get("eventType") != "MODEL_TOKEN_USAGE":
            continue
        d = event.get("details") or {}
        calls.append(
            LedgerCall(
                sequence_no=event.get("sequenceNo"),
                source=str(d.get("source") or "?"),
                model=str(d.get("model") or ""),
                step_index=d.get("stepIndex"),
                available=bool(d.get("usageAvailable")),
                prompt=d.get("promptTokens"),
                completion=d.get("completionTokens"),
                reasoning=d.get("reasoningTokens"),
                cached=d.get("cachedTokens"),
                total=d.get("totalTokens"),
            )
        )
    reported = [c for c in calls if c.available]
    unavailable = [c for c in calls if not c.available]
    by_source = {s: sum(c.total or 0 for c in reported if c.source == s) for s in USAGE_SOURCES}
    sums = {
        "router": by_source["ROUTER"],
        "agent": by_source["AGENT"],
        "guard": by_source["GUARD"],
        "total": sum(c.total or 0 for c in reported),
        "reasoning": sum(c.reasoning or 0 for c in reported),
        "cachedInput": sum(c.cached or 0 for c in reported),
    }
    labels = {
        "router": "router",
        "agent": "agent",
        "guard": "guard",
        "total": "total",
        "reasoning": "↳ reasoning",
        "cachedInput": "↳ cached input",
    }
    rows = [
        LedgerRow(
            label=labels[key],
            ledger=tokens.get(key),
            from_calls=sums[key],
            matches=tokens.get(key) == sums[key],
        )
        for key in labels
    ]
    problems: list[str] = []
    unavailable_count = tokens.get("unavailableCalls")
    if unavailable:
        problems.append(
            f"{len(unavailable)} call(s) reported no usage: "
            + ", ".join(f"#{c.sequence_no} {c.source} {c.model}" for c in unavailable)
            + " — counted as unknown, never as 0"
        )
    if unavailable_count is not None and unavailable_count != len(unavailable):
        problems.append(
            f"the run counts {unavailable_count} call(s) without usage but the timeline holds "
            f"{len(unavailable)} such record(s)"
        )
    mismatched = [r.label for r in rows if not r.matches]
    if mismatched:
        problems.append(
            "per-call records do not add up to the run's ledger for: "
            + ", ".join(mismatched)
            + " (a usage record may be missing — see the audit summary)"
        )
    reconciled = bool(tokens.get("reconciled"))
    if reconciled:
        verdict = (
            f"reconciled: {len(calls)} model call(s), each reported usage, and they add up to the totals"
        )
    elif problems:
        verdict = "not reconciled"
    else:
        verdict = "not reconciled (the run has no terminal ledger yet, or a usage write failed)"
    return Ledger(
        rows=rows,
        calls=calls,
        unavailable=unavailable,
        reconciled=reconciled,
        usage_available=bool(tokens.get("usageAvailable", not unavailable)),
        verdict=verdict,
        problems=problems,
    )


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


def build_timeline(trace: Mapping[str, Any], origin: dt.datetime | None) -> list[TimelineRow]:
    rows: list[TimelineRow] = []
    expected_next = 1
    for event in trace.get("timeline") or []:
        seq = event.get("sequenceNo")
        created = parse_time(event.get("createdAt"))
        gap = list(range(expected_next, seq)) if isinstance(seq, int) and seq > expected_next else []
        rows.append(
            TimelineRow(
                sequence_no=seq,
                phase=event.get("phase") or "",
                event_type=event.get("eventType") or "",
                status=event.get("status") or "",
                tone=tone(event.get("status")),
                summary=event.get("summary") or "",
                offset=("+" + format_ms(_ms_between(origin, created))) if origin and created else "—",
                created_at=_iso(created),
                hash=event.get("hash") or "",
                details_json=pretty_json(event.get("details") or {}),
                gap_before=gap,
            )
        )
        if isinstance(seq, int):
            expected_next = max(expected_next, seq + 1)
    return rows


# ---------------------------------------------------------------------------------------------------
# Waterfall
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StepTimes:
    """What `agent_step` recorded about when a model call ran (`created_at` is when its row was built,
    right after the call returned)."""

    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    created_at: dt.datetime | None


@dataclass(slots=True)
class Bar:
    kind: str  # router | step | tool | guard
    label: str
    sublabel: str
    status: str
    tone: str
    left: float = 0.0
    width: float = 0.0
    start_ms: float | None = None
    end_ms: float | None = None
    duration: str = "—"
    mode: str = "measured"  # measured | derived | unknown | point
    title: str = ""
    nested: bool = False
    anchor: str = ""

    @property
    def label_pos(self) -> str:
        """Where the duration label goes: after the bar, before it, or inside it (long bars)."""
        if self.left + self.width <= 78:
            return "after"
        if self.left >= 22:
            return "before"
        return "inside"

    @property
    def label_at(self) -> float:
        return self.left + self.width if self.label_pos == "after" else self.left


@dataclass(slots=True)
class Marker:
    label: str
    left: float
    at: str
    tone: str


@dataclass(slots=True)
class Waterfall:
    bars: list[Bar]
    ticks: list[tuple[float, str]]
    markers: list[Marker]
    span: str
    origin: str
    notes: list[str]


def _nice_step(span_ms: float) -> float:
    for step in TICK_STEPS_MS:
        if span_ms / step <= 8:
            return float(step)
    step = 60_000.0
    while span_ms / step > 8:
        step *= 2
    return step


@dataclass(slots=True)
class _Span:
    """A model call or tool call placed in time, before it is projected onto the axis."""

    kind: str
    label: str
    sublabel: str
    status: str
    start: dt.datetime | None
    end: dt.datetime | None
    duration_ms: int | None
    mode: str
    title: str
    anchor: str
    nested: bool = False


DERIVED_TITLE = "start derived from the recorded end minus the recorded duration"
UNKNOWN = "duration unknown"


def _model_call_spans(timeline: list[Mapping[str, Any]]) -> list[_Span]:
    """Router attempts and semantic-guard calls: their events are written when the call returned."""
    spans = []
    for event in timeline:
        etype = event.get("eventType")
        if etype not in ("ROUTING_ATTEMPT", "SEMANTIC_GUARD_DECISION"):
            continue
        details = event.get("details") or {}
        end = parse_time(event.get("createdAt"))
        duration_ms = details.get("durationMs")
        router = etype == "ROUTING_ATTEMPT"
        known = duration_ms is not None and end is not None
        spans.append(
            _Span(
                kind="router" if router else "guard",
                label=f"router attempt {details.get('attempt', '')}".strip() if router else "semantic guard",
                sublabel=str(details.get("model") or ""),
                status=event.get("status") or "",
                start=end - dt.timedelta(milliseconds=duration_ms) if known else end,
                end=end,
                duration_ms=duration_ms if known else None,
                mode="derived" if known else "point",
                title=DERIVED_TITLE if known else "the call's duration was not recorded",
                anchor=f"ev-{event.get('sequenceNo')}",
            )
        )
    return spans


def _tool_span(tool: Mapping[str, Any], *, nested: bool) -> _Span:
    start = parse_time(tool.get("startedAt"))
    end = parse_time(tool.get("finishedAt"))
    duration_ms = tool.get("durationMs")
    status = tool.get("status") or ""
    if start is None:
        mode, title, start = "point", "no start time recorded", end
    elif duration_ms is not None:
        mode, title = "measured", "duration measured in the executing process"
        end = end or start + dt.timedelta(milliseconds=duration_ms)
    elif end is not None:
        mode, title = "unknown", f"duration not measured: closed {status} by another process"
    else:
        mode, title = "unknown", "duration unknown: no end recorded"
    return _Span(
        kind="tool",
        label=tool.get("toolName") or "tool",
        sublabel=tool.get("toolCallId") or "",
        status=status,
        start=start,
        end=end,
        duration_ms=duration_ms,
        mode=mode,
        title=title,
        anchor=f"tool-{tool.get('toolCallId')}",
        nested=nested,
    )


def _step_span(step: Mapping[str, Any], times: StepTimes | None, event_at: dt.datetime | None) -> _Span:
    """`event_at`: when the step's AGENT_MODEL_STEP event was written (right after the call returned)."""
    index = step.get("stepIndex")
    duration_ms = step.get("durationMs")
    start = parse_time(step.get("startedAt")) or (times.started_at if times else None)
    end = parse_time(step.get("finishedAt")) or (times.finished_at if times else None)
    recorded_end = end or (times.created_at if times else None) or event_at
    if start is not None and end is not None:
        mode, title = "measured", "recorded start and end"
        duration_ms = duration_ms if duration_ms is not None else _ms_between(start, end)
    elif duration_ms is not None and recorded_end is not None:
        mode, title = "derived", DERIVED_TITLE
        end = recorded_end
        start = end - dt.timedelta(milliseconds=duration_ms)
    else:
        mode, title = "point", "the step's duration was not recorded"
        start = end = start or recorded_end
    return _Span(
        kind="step",
        label=f"step {index}",
        sublabel=f"{step.get('agentName') or ''} · {step.get('model') or ''}",
        status="TOOL_CALLS" if step.get("hasToolCall") else (step.get("finishReason") or "").upper(),
        start=start,
        end=end,
        duration_ms=duration_ms,
        mode=mode,
        title=title,
        anchor=f"step-{index}",
    )


def build_waterfall(trace: Mapping[str, Any], step_times: Mapping[int, StepTimes]) -> Waterfall:
    """Model steps, tool calls, router and semantic-guard calls on one time axis from the run's creation.

    Times used, in order of preference: the recorded start and end; otherwise the recorded end (the row's
    or event's creation) minus the recorded duration, drawn as *derived*; a tool whose duration was not
    measured (closed by another process, or still running) is drawn from its start to its recorded close
    or to the end of the axis, hatched and labelled. Tools are listed under the step that declared them.
    """
    run = trace["run"]
    timing = run.get("timing") or {}
    timeline = trace.get("timeline") or []
    origin = parse_time(timing.get("createdAt")) or parse_time(timing.get("startedAt"))
    finished = parse_time(timing.get("finishedAt"))

    tools_by_step: dict[Any, list[Mapping[str, Any]]] = {}
    for tool in trace.get("tools") or []:
        tools_by_step.setdefault(tool.get("stepIndex"), []).append(tool)
    step_events = {
        (e.get("details") or {}).get("stepIndex"): parse_time(e.get("createdAt"))
        for e in timeline
        if e.get("eventType") == "AGENT_MODEL_STEP"
    }
    groups: list[list[_Span]] = [[span] for span in _model_call_spans(timeline)]
    for step in trace.get("steps") or []:
        index = step.get("stepIndex")
        group = [_step_span(step, step_times.get(index), step_events.get(index))]
        group.extend(_tool_span(t, nested=True) for t in tools_by_step.pop(index, []))
        groups.append(group)
    for leftover in tools_by_step.values():
        groups.extend([_tool_span(t, nested=False)] for t in leftover)

    spans = [span for group in groups for span in group]
    known = [t for span in spans for t in (span.start, span.end) if t is not None]
    if origin is None and known:
        origin = min(known)
    if origin is None:
        return Waterfall(bars=[], ticks=[], markers=[], span="—", origin="—", notes=["no recorded times"])
    axis_end = max([*known, *([finished] if finished else [])], default=origin)
    span_ms = max((axis_end - origin).total_seconds() * 1000, 1.0)

    def offset_ms(value: dt.datetime) -> float:
        return (value - origin).total_seconds() * 1000

    def pct(value: dt.datetime) -> float:
        return max(0.0, min(100.0, offset_ms(value) / span_ms * 100))

    # A group (a step and its tools, or one router/guard call) sorts by its first span's start.
    groups.sort(key=lambda g: offset_ms(g[0].start) if g[0].start is not None else float("inf"))
    bars: list[Bar] = []
    notes: list[str] = []
    for span in (s for group in groups for s in group):
        if span.start is None:
            notes.append(f"{span.label} {span.sublabel}: no time recorded, not drawn")
            continue
        end = span.end if span.end is not None else (axis_end if span.mode == "unknown" else None)
        if span.start < origin:
            notes.append(
                f"{span.label} {span.sublabel}: its recorded duration reaches back "
                f"{format_ms(-offset_ms(span.start))} before the run was created; drawn from the run's start"
            )
        left = pct(span.start)
        width = pct(end) - left if end is not None else 0.0
        if span.mode != "point" and width < MIN_BAR_PERCENT:
            width = MIN_BAR_PERCENT
            left = min(left, 100.0 - MIN_BAR_PERCENT)
        bars.append(
            Bar(
                kind=span.kind,
                label=span.label,
                sublabel=span.sublabel,
                status=span.status,
                tone=tone(span.status),
                left=round(left, 3),
                width=round(width, 3),
                start_ms=round(offset_ms(span.start), 1),
                end_ms=round(offset_ms(end), 1) if end is not None else None,
                duration=format_duration(span.duration_ms) if span.duration_ms is not None else UNKNOWN,
                mode=span.mode,
                title=span.title,
                nested=span.nested,
                anchor=span.anchor,
            )
        )

    step = _nice_step(span_ms)
    ticks = []
    t = 0.0
    while t <= span_ms + 1e-6:
        ticks.append((round(t / span_ms * 100, 3), format_ms(t)))
        t += step
    instants = [
        ("first output", parse_time(timing.get("firstOutputAt")), "good"),
        ("finished", finished, "neutral"),
    ]
    release = next((e for e in timeline if e.get("eventType") == "RELEASE_DECISION"), None)
    if release is not None:
        instants.append(
            (
                f"release {release.get('status')}",
                parse_time(release.get("createdAt")),
                tone(release.get("status")),
            )
        )
    markers = [
        Marker(label=label, left=round(pct(at), 3), at=format_ms(offset_ms(at)), tone=marker_tone)
        for label, at, marker_tone in instants
        if at is not None
    ]
    return Waterfall(
        bars=bars, ticks=ticks, markers=markers, span=format_ms(span_ms), origin=_iso(origin), notes=notes
    )


# ---------------------------------------------------------------------------------------------------
# Tools and audit summary
# ---------------------------------------------------------------------------------------------------
def build_tools(trace: Mapping[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for tool in trace.get("tools") or []:
        rows.append(
            {
                **tool,
                "tone": tone(tool.get("status")),
                "input_json": compact_json(tool.get("inputParams") or {}),
                "retrieval_json": pretty_json(tool.get("retrievalDetails") or {}),
                "duration": format_duration(tool.get("durationMs"))
                if tool.get("durationMs") is not None
                else "unknown",
                "started": _iso(parse_time(tool.get("startedAt"))),
                "finished": _iso(parse_time(tool.get("finishedAt"))),
            }
        )
    return rows


@dataclass(slots=True)
class AuditSummary:
    complete: bool
    chain_valid: bool
    write_failures: int
    rows: list[tuple[str, Any, Any, Any, bool]]
    gaps: list[str]
    problems: list[str]


def build_audit(trace: Mapping[str, Any]) -> AuditSummary:
    summary = trace.get("summary") or {}
    persisted = summary.get("persisted") or {}
    expected = summary.get("expected") or {}
    returned = summary.get("returned") or {}
    rows = []
    for key in ("events", "steps", "tools"):
        p, e, r = persisted.get(key), expected.get(key), returned.get(key)
        rows.append((key, p, e, r, p == e and r == p))
    complete = bool(summary.get("auditComplete"))
    chain_valid = bool(summary.get("chainValid"))
    failures = summary.get("auditWriteFailures") or 0
    problems = []
    if not complete:
        problems.append("audit incomplete")
    if failures:
        problems.append(f"{failures} audit write failure(s)")
    if not chain_valid:
        problems.append("hash chain invalid")
    return AuditSummary(
        complete=complete,
        chain_valid=chain_valid,
        write_failures=failures,
        rows=rows,
        gaps=[str(g) for g in summary.get("gaps") or []],
        problems=problems,
    )


# ---------------------------------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------------------------------
@dataclass(slots=True)
class RunConsole:
    trace: Mapping[str, Any]
    verdict: Verdict
    timing: list[tuple[str, str, str]]
    ledger: Ledger
    timeline: list[TimelineRow]
    waterfall: Waterfall
    tools: list[dict[str, Any]]
    audit: AuditSummary
    phase_counts: list[tuple[str, int]]
    created_at: str


def build_run_console(
    trace: Mapping[str, Any], *, step_times: Mapping[int, StepTimes] | None = None
) -> RunConsole:
    run = trace["run"]
    timing = run.get("timing") or {}
    origin = parse_time(timing.get("createdAt")) or parse_time(timing.get("startedAt"))
    timeline = build_timeline(trace, origin)
    counts: dict[str, int] = {}
    for row in timeline:
        counts[row.phase] = counts.get(row.phase, 0) + 1
    return RunConsole(
        trace=trace,
        verdict=build_verdict(trace),
        timing=build_timing(run),
        ledger=build_ledger(trace),
        timeline=timeline,
        waterfall=build_waterfall(trace, step_times or {}),
        tools=build_tools(trace),
        audit=build_audit(trace),
        phase_counts=sorted(counts.items(), key=lambda item: PHASE_ORDER.get(item[0], len(PHASE_ORDER))),
        created_at=_iso(origin),
    )
