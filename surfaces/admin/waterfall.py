"""The run page's waterfall: model steps, tool calls, router and semantic-guard calls on one time axis,
one lane per agent (`router`, `planner`, `executor` or the chat's `diagnosis_agent`, `semantic_guard`):
each lane holds its agent's calls, a step's tools under it.

Built from the trace read model's rows (`audit.read.Trace`); pure, no query. Nothing here invents a
time: a bar whose start is derived from a recorded end minus a recorded duration is marked *derived*, a
call whose duration was not recorded is a *point*, and a tool without a measured duration is drawn
open-ended and hatched (*unknown*).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field

from audit.models import CHAT_AGENT_NAME, AgentStep, EventType, ToolInvocation, TraceEvent
from audit.read import Trace
from surfaces.admin.display import format_duration, format_instant, format_ms, ms_between, tone

# A bar narrower than this share of the axis is widened so that it stays visible (its label keeps the value).
MIN_BAR_PERCENT = 0.4
TICK_STEPS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 250, 500, 1000, 2000, 5000, 10_000, 15_000, 30_000, 60_000)
DERIVED_TITLE = "start derived from the recorded end minus the recorded duration"
UNKNOWN = "duration unknown"
# Events written when a model call outside the agent loop returned, with its duration in the details.
_MODEL_CALL_EVENTS = (EventType.ROUTING_ATTEMPT, EventType.SEMANTIC_GUARD_DECISION)


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
    lane: str = ""

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
class Lane:
    """One agent's calls, in time order."""

    name: str
    bars: list[Bar]


@dataclass(slots=True)
class Waterfall:
    bars: list[Bar]  # every lane's bars, lane after lane
    ticks: list[tuple[float, str]]
    markers: list[Marker]
    span: str
    origin: str
    notes: list[str]
    lanes: list[Lane] = field(default_factory=list)


# Lanes in pipeline order; an agent not named here comes after the known agents, before the guard.
LANE_ORDER = ("router", "planner", "executor", CHAT_AGENT_NAME)
GUARD_LANE = "semantic_guard"


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
    lane: str = ""


def step_anchor(agent_name: str, step_index: int) -> str:
    """The run page's anchor of a model step: `step-2` for the chat agent's, `step-executor-2` else."""
    if agent_name in ("", CHAT_AGENT_NAME):
        return f"step-{step_index}"
    return f"step-{agent_name}-{step_index}"


def _model_call_spans(timeline: list[TraceEvent]) -> list[_Span]:
    """Router attempts and semantic-guard calls: their events are written when the call returned."""
    spans = []
    for event in timeline:
        if event.event_type not in _MODEL_CALL_EVENTS:
            continue
        details = event.details or {}
        end = event.created_at
        duration_ms = details.get("durationMs")
        router = event.event_type == EventType.ROUTING_ATTEMPT
        known = duration_ms is not None and end is not None
        spans.append(
            _Span(
                kind="router" if router else "guard",
                label=f"router attempt {details.get('attempt', '')}".strip() if router else "semantic guard",
                sublabel=str(details.get("model") or ""),
                status=event.status or "",
                start=end - dt.timedelta(milliseconds=duration_ms) if known else end,
                end=end,
                duration_ms=duration_ms if known else None,
                mode="derived" if known else "point",
                title=DERIVED_TITLE if known else "the call's duration was not recorded",
                anchor=f"ev-{event.sequence_no}",
                lane="router" if router else GUARD_LANE,
            )
        )
    return spans


def _tool_span(tool: ToolInvocation, *, nested: bool) -> _Span:
    start, end, duration_ms = tool.started_at, tool.finished_at, tool.duration_ms
    status = tool.status or ""
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
        label=tool.tool_name or "tool",
        sublabel=tool.tool_call_id or "",
        status=status,
        start=start,
        end=end,
        duration_ms=duration_ms,
        mode=mode,
        title=title,
        anchor=f"tool-{tool.tool_call_id}",
        nested=nested,
        lane=tool.agent_name or CHAT_AGENT_NAME,
    )


def _approval_spans(timeline: list[TraceEvent]) -> dict[tuple[str, int | None], list[_Span]]:
    """The waits for a person: from each APPROVAL_REQUESTED to its call's APPROVAL_DECIDED (still waiting:
    open-ended), by the declaring step, so they are drawn under the call's step beside its tools."""
    decided = {}
    for event in timeline:
        if event.event_type == EventType.APPROVAL_DECIDED:
            decided[str((event.details or {}).get("toolCallId"))] = event
    spans: dict[tuple[str, int | None], list[_Span]] = {}
    for event in timeline:
        if event.event_type != EventType.APPROVAL_REQUESTED:
            continue
        details = event.details or {}
        call = str(details.get("toolCallId") or "")
        answer = decided.get(call)
        end = answer.created_at if answer is not None else None
        key = (str(details.get("agentName") or CHAT_AGENT_NAME), details.get("stepIndex"))
        spans.setdefault(key, []).append(
            _Span(
                kind="approval",
                label=f"waiting for approval ({details.get('toolName') or 'tool'})",
                sublabel=call,
                status=answer.status if answer is not None else "WAITING",
                start=event.created_at,
                end=end,
                duration_ms=ms_between(event.created_at, end) if end is not None else None,
                mode="measured" if end is not None else "unknown",
                title="from the request to the decision"
                if end is not None
                else "no decision yet: the run is interrupted",
                anchor=f"ev-{event.sequence_no}",
                nested=True,
                lane=key[0],
            )
        )
    return spans


def _step_span(step: AgentStep, event_at: dt.datetime | None) -> _Span:
    """`event_at`: when the step's AGENT_MODEL_STEP event was written (right after the call returned);
    the step row's own `created_at` is the same moment, and either stands in for an unrecorded end."""
    duration_ms = step.duration_ms
    start, end = step.started_at, step.finished_at
    recorded_end = end or step.created_at or event_at
    if start is not None and end is not None:
        mode, title = "measured", "recorded start and end"
        duration_ms = duration_ms if duration_ms is not None else ms_between(start, end)
    elif duration_ms is not None and recorded_end is not None:
        mode, title = "derived", DERIVED_TITLE
        end = recorded_end
        start = end - dt.timedelta(milliseconds=duration_ms)
    else:
        mode, title = "point", "the step's duration was not recorded"
        start = end = start or recorded_end
    return _Span(
        kind="step",
        label=f"step {step.step_index}",
        sublabel=f"{step.agent_name or ''} · {step.model or ''}",
        lane=step.agent_name or CHAT_AGENT_NAME,
        status="TOOL_CALLS" if step.has_tool_call else (step.finish_reason or "").upper(),
        start=start,
        end=end,
        duration_ms=duration_ms,
        mode=mode,
        title=title,
        anchor=step_anchor(step.agent_name, step.step_index),
    )


def build_waterfall(trace: Trace) -> Waterfall:
    """Model steps, tool calls, router and semantic-guard calls on one time axis from the run's creation.

    Times used, in order of preference: the recorded start and end; otherwise the recorded end (the row's
    or event's creation) minus the recorded duration, drawn as *derived*; a tool whose duration was not
    measured (closed by another process, or still running) is drawn from its start to its recorded close
    or to the end of the axis, hatched and labelled. Tools are listed under the step that declared them,
    and so is a call's wait for a person's approval (request → decision, open-ended while it waits), with
    markers where the run was interrupted and resumed.
    """
    run = trace.run
    origin = run.created_at or run.started_at
    finished = run.finished_at
    groups = _span_groups(trace)
    known = [t for group in groups for span in group for t in (span.start, span.end) if t is not None]
    if origin is None and known:
        origin = min(known)
    if origin is None:
        return Waterfall(bars=[], ticks=[], markers=[], span="—", origin="—", notes=["no recorded times"])
    axis = _Axis(origin, max([*known, *([finished] if finished else [])], default=origin))
    # Lanes in pipeline order; within a lane a group (a step and its tools, or one router/guard call)
    # sorts by its first span's start.
    groups.sort(
        key=lambda g: (
            _lane_rank(g[0].lane),
            g[0].lane,
            axis.offset_ms(g[0].start) if g[0].start is not None else float("inf"),
        )
    )
    bars, notes = _bars((s for group in groups for s in group), axis)
    lanes: list[Lane] = []
    for bar in bars:
        if not lanes or lanes[-1].name != bar.lane:
            lanes.append(Lane(name=bar.lane, bars=[]))
        lanes[-1].bars.append(bar)
    return Waterfall(
        bars=bars,
        ticks=_ticks(axis.span_ms),
        markers=_markers(trace, axis),
        span=format_ms(axis.span_ms),
        origin=format_instant(origin),
        notes=notes,
        lanes=lanes,
    )


def _span_groups(trace: Trace) -> list[list[_Span]]:
    """The spans to draw, in groups: each router or guard call alone; each model step with the tool
    calls it declared and their waits for approval; tool calls of no recorded step alone."""
    tools_by_step: dict[tuple[str, int | None], list[ToolInvocation]] = {}
    for tool in trace.tools:
        tools_by_step.setdefault((tool.agent_name or CHAT_AGENT_NAME, tool.step_index), []).append(tool)
    step_events = {
        (
            str((e.details or {}).get("agentName") or CHAT_AGENT_NAME),
            (e.details or {}).get("stepIndex"),
        ): e.created_at
        for e in trace.timeline
        if e.event_type == EventType.AGENT_MODEL_STEP
    }
    groups: list[list[_Span]] = [[span] for span in _model_call_spans(trace.timeline)]
    waits = _approval_spans(trace.timeline)
    for step in trace.steps:
        key = (step.agent_name or CHAT_AGENT_NAME, step.step_index)
        group = [_step_span(step, step_events.get(key))]
        group.extend(_tool_span(t, nested=True) for t in tools_by_step.pop(key, []))
        group.extend(waits.pop(key, []))
        groups.append(group)
    for leftover in tools_by_step.values():
        groups.extend([_tool_span(t, nested=False)] for t in leftover)
    return groups


class _Axis:
    """The time axis: from `origin` to `end` (at least 1 ms), positions in milliseconds and percent."""

    def __init__(self, origin: dt.datetime, end: dt.datetime) -> None:
        self.origin = origin
        self.end = end
        self.span_ms = max((end - origin).total_seconds() * 1000, 1.0)

    def offset_ms(self, value: dt.datetime) -> float:
        return (value - self.origin).total_seconds() * 1000

    def pct(self, value: dt.datetime) -> float:
        return max(0.0, min(100.0, self.offset_ms(value) / self.span_ms * 100))


def _lane_rank(lane: str) -> int:
    if lane == GUARD_LANE:
        return len(LANE_ORDER) + 1
    return LANE_ORDER.index(lane) if lane in LANE_ORDER else len(LANE_ORDER)


def _bars(spans: Iterable[_Span], axis: _Axis) -> tuple[list[Bar], list[str]]:
    """A bar per span with a recorded time (at least `MIN_BAR_PERCENT` wide unless a point), and a note
    for each span not drawn or drawn from the run's start."""
    bars: list[Bar] = []
    notes: list[str] = []
    for span in spans:
        if span.start is None:
            notes.append(f"{span.label} {span.sublabel}: no time recorded, not drawn")
            continue
        end = span.end if span.end is not None else (axis.end if span.mode == "unknown" else None)
        if span.start < axis.origin:
            before = format_ms(-axis.offset_ms(span.start))
            notes.append(
                f"{span.label} {span.sublabel}: its recorded duration reaches back "
                f"{before} before the run was created; drawn from the run's start"
            )
        left = axis.pct(span.start)
        width = axis.pct(end) - left if end is not None else 0.0
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
                start_ms=round(axis.offset_ms(span.start), 1),
                end_ms=round(axis.offset_ms(end), 1) if end is not None else None,
                duration=format_duration(span.duration_ms) if span.duration_ms is not None else UNKNOWN,
                mode=span.mode,
                title=span.title,
                nested=span.nested,
                anchor=span.anchor,
                lane=span.lane,
            )
        )
    return bars, notes


def _ticks(span_ms: float) -> list[tuple[float, str]]:
    step = _nice_step(span_ms)
    ticks = []
    t = 0.0
    while t <= span_ms + 1e-6:
        ticks.append((round(t / span_ms * 100, 3), format_ms(t)))
        t += step
    return ticks


def _markers(trace: Trace, axis: _Axis) -> list[Marker]:
    """The run's instants on the axis: first output, finish, interruptions and resumptions, release."""
    run = trace.run
    instants = [("first output", run.first_output_at, "good"), ("finished", run.finished_at, "neutral")]
    for event in trace.timeline:
        if event.event_type in (EventType.RUN_INTERRUPTED, EventType.RUN_RESUMED):
            instants.append((event.event_type.lower().replace("run_", ""), event.created_at, "warn"))
    release = next((e for e in trace.timeline if e.event_type == EventType.RELEASE_DECISION), None)
    if release is not None:
        instants.append((f"release {release.status}", release.created_at, tone(release.status)))
    return [
        Marker(label=label, left=round(axis.pct(at), 3), at=format_ms(axis.offset_ms(at)), tone=marker_tone)
        for label, at, marker_tone in instants
        if at is not None
    ]
