"""How the admin writes a recorded value: a status word's colour, a duration, an instant, a JSON value.

Shared by the run list, the run page and its waterfall. Pure functions, no query.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django.utils.html import format_html

from audit.models import ToolStatus
from diagnosis.models import ReleaseDecision, RunStatus

# A run's question in a list cell is cut to this many characters.
QUERY_PREVIEW_CHARS = 80

# Statuses of single events are words the recorder writes (guard verdicts, routing and usage outcomes,
# a step's outcome); runs, release decisions and tools have enums.
_GOOD_EVENT_STATUSES = ("PASS", "OK", "DECIDED", "REPORTED", "ANSWER", "APPROVED")
_BAD_EVENT_STATUSES = ("FAIL", "ERROR", "REFUSED", "INVALID", "UNAVAILABLE", "REJECTED", "EXPIRED")
_WARN_EVENT_STATUSES = ("FALLBACK", "TOOL_CALLS", "WAITING", "AWAITING_APPROVAL", "INTERRUPTED")
GOOD_STATUSES = frozenset(
    {RunStatus.SUCCESS, ReleaseDecision.PUBLISHED, ToolStatus.SUCCEEDED, *_GOOD_EVENT_STATUSES}
)
BAD_STATUSES = frozenset(
    {
        RunStatus.FAILED,
        ReleaseDecision.BLOCKED,
        ToolStatus.FAILED,
        ToolStatus.INTERRUPTED,
        ToolStatus.ABANDONED,
        *_BAD_EVENT_STATUSES,
    }
)
WARN_STATUSES = frozenset(
    {RunStatus.CANCELLED, RunStatus.RUNNING, RunStatus.PENDING, ToolStatus.RUNNING, *_WARN_EVENT_STATUSES}
)


# Stored enum words in people's words. A word not named here reads lower-cased with spaces
# (`TOOL_CALLS` → "tool calls"); the stored word stays in the chip's `title`.
_LABELS = {
    RunStatus.SUCCESS: "succeeded",
    RunStatus.INTERRUPTED: "waiting for approval",
    "DIAGNOSIS_AGENT": "chat agent",
    "AI_OPS": "AI Ops analysis",
    "KNOWLEDGE": "knowledge question",
    "CHITCHAT": "small talk",
}


def label(value: str | None) -> str:
    """A stored enum word (run status, release decision, intent, flow, tool status, guard verdict) as
    people read it: "succeeded", "blocked", "AI Ops analysis", "out of scope"; "—" for none."""
    if not value:
        return "—"
    return _LABELS.get(value) or str(value).replace("_", " ").lower()


def chip(value: str | None, tone_name: str | None = None):
    """A status word as a coloured chip in people's words (`label`; the stored word is its title), its
    colour its `tone` unless given, or an em dash for none."""
    if not value:
        return "—"
    return format_html(
        '<span class="dc-chip dc-{}" title="{}">{}</span>', tone_name or tone(value), value, label(value)
    )


def provider_chip(provider: str | None):
    """A run's provider: the DEMO chip for the offline demo model (labelled wherever a run is listed),
    else its name."""
    from audit.read import DEMO_PROVIDER

    if provider == DEMO_PROVIDER:
        return format_html('<span class="dc-chip dc-warn" title="{}">DEMO</span>', "offline demo model")
    return provider or "—"


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


def ms_between(start: dt.datetime | None, end: dt.datetime | None) -> int | None:
    """Whole milliseconds from `start` to `end`; None when either is unknown."""
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


def format_instant(value: dt.datetime | None) -> str:
    """An instant in UTC to the millisecond (`2026-01-02 03:04:05.678 UTC`); an em dash when unknown."""
    if value is None:
        return "—"
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def compact_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(", ", ": "), default=str)


def delivery_note(run) -> tuple[str, str] | None:
    """(tone, sentence) saying what the reader could see before the release, or None for a run recorded
    before the release policy existed. A BLOCKED run whose draft was streamed is `bad`: a reader saw
    text the guards then withheld."""
    mode, chars = run.release_mode, run.draft_chars
    if not mode:
        return None
    if mode == "verified":
        return "good", "verified release: no answer text reached a reader before the release decision"
    if chars is None:
        return (
            "warn",
            "draft release: the drafts streamed were not recorded (another process finished the run)",
        )
    if not chars:
        return "good", "draft release: no draft text was streamed"
    if run.release_decision == ReleaseDecision.BLOCKED:
        return "bad", (
            f"unverified text shown: {chars} characters of draft were streamed to the reader, then the "
            "answer was blocked"
        )
    return "warn", f"draft release: {chars} characters of unverified draft were streamed before the release"


def column(text: str, explains: str):
    """A list column's header: its words, and what its cells hold as the header's title (shown on
    hover, read by screen readers as the abbreviation's expansion). The one way the console's lists
    label a column whose cells are bare numbers, flags or codes."""
    return format_html('<abbr class="dc-col" title="{}">{}</abbr>', explains, text)
