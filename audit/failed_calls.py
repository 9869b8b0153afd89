"""The failed-calls section of a released answer: one rule for what the release appends and the verifier.

A run whose tool calls FAILED (an approved action that could not run, a rejected or expired approval, a
tool error or timeout) says so in what it releases: `section(calls, language=…, body=…)` is fixed text
listing each failed call from the run's chain (`from_events`: the FAILED terminals, and whether the call
was an action, i.e. asked for approval), with the model's `Confidence:` lowered to low when it stated more.
The release appends it and records `failedCalls` (ids, language); `problems` recomputes it from the chain.
Details: docs/runtime.md, *Failed calls in the released answer*.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from audit.models import EventType, ToolStatus, TraceEvent

# The error code of a replay's call that was not executed (its row is FAILED: the action did not happen;
# `agent.runtime.replay`).
NOT_EXECUTED_REPLAY = "NOT_EXECUTED_REPLAY"
MARKER = {"en": "**Failed tool calls**", "zh": "**失败的工具调用**"}
_CONFIDENCE = re.compile(r"^[\s>*_-]*confidence[\s*_]*[:：][\s*_]*(high|medium|low)\b", re.I | re.M)


@dataclass(frozen=True, slots=True)
class FailedCall:
    tool_call_id: str
    tool_name: str
    error_code: str
    action: bool  # the call asked for a person's approval: it would have changed something


def from_events(events: Iterable[Any]) -> list[FailedCall]:
    """The run's failed calls as its chain records them (TOOL_INVOCATION terminals with status FAILED;
    an APPROVAL_REQUESTED for the same call makes it an action), ordered by tool call id."""
    events = list(events)
    actions = {
        str((e.details or {}).get("toolCallId"))
        for e in events
        if e.event_type == EventType.APPROVAL_REQUESTED
    }
    failed: dict[str, FailedCall] = {}
    for e in events:
        d = e.details or {}
        failed_terminal = e.event_type == EventType.TOOL_INVOCATION and e.status == ToolStatus.FAILED
        if not failed_terminal or not d.get("toolCallId"):
            continue
        call_id = str(d["toolCallId"])
        name, code = str(d.get("toolName") or ""), str(d.get("errorCode") or "")
        failed.setdefault(call_id, FailedCall(call_id, name, code, call_id in actions))
    return [failed[k] for k in sorted(failed)]


def failed_calls_of(run_id: str) -> list[FailedCall]:
    """`from_events` over the run's stored tool and approval events (one query)."""
    return from_events(
        TraceEvent.objects.filter(
            run_id=run_id, event_type__in=(EventType.TOOL_INVOCATION, EventType.APPROVAL_REQUESTED)
        ).only("event_type", "status", "details")
    )


def stated_confidence(text: str) -> str | None:
    """The last `Confidence: high|medium|low` line of `text` (lower case), or None."""
    found = _CONFIDENCE.findall(text or "")
    return found[-1].lower() if found else None


_WORDS = {
    "en": {
        "intro": " (listed by the service from the run's record, not written by the model):",
        "item": "- `{tool}` (call `{call}`): {what}, error {code}.",
        "action": "the action was not carried out",
        "read": "no result was obtained",
        "replay": "not executed: this run is an offline replay",
        "unknown": "unknown",
        "lowered": (
            "Confidence: low (lowered by the service: {n} tool call(s) failed; the model stated {stated})"
        ),
    },
    "zh": {
        "intro": "（由服务根据运行记录列出，并非模型所写）：",
        "item": "- `{tool}`（调用 `{call}`）：{what}，错误 {code}。",
        "action": "操作未执行",
        "read": "没有取得结果",
        "replay": "未执行：本次运行是离线重放",
        "unknown": "未知",
        "lowered": "Confidence: low（由服务下调：{n} 个工具调用失败；模型原称 {stated}）",
    },
}


def _kind(call: FailedCall) -> str:
    if call.error_code == NOT_EXECUTED_REPLAY:
        return "replay"
    return "action" if call.action else "read"


def section(calls: Sequence[FailedCall], *, language: str, body: str) -> str:
    """The section appended to `body` (the released text before it); empty when nothing failed."""
    if not calls:
        return ""
    language = language if language in _WORDS else "en"
    words = _WORDS[language]
    lines = ["", "", "---", MARKER[language] + words["intro"]]
    for call in sorted(calls, key=lambda c: c.tool_call_id):
        lines.append(
            words["item"].format(
                tool=call.tool_name,
                call=call.tool_call_id,
                what=words[_kind(call)],
                code=call.error_code or words["unknown"],
            )
        )
    stated = stated_confidence(body)
    if stated in ("high", "medium"):
        lines += ["", words["lowered"].format(n=len(calls), stated=stated)]
    return "\n".join(lines)


def split(content: str) -> tuple[str, str]:
    """(body, section) of released `content`: the section starts at the last marker's `---` line."""
    for marker in MARKER.values():
        at = content.rfind("\n\n---\n" + marker)
        if at >= 0:
            return content[:at], content[at:]
    return content, ""


def problems(*, content: str, release_details: dict[str, Any], events: Sequence[Any]) -> list[str]:
    """What the chain says failed against what the release recorded and the released content shows
    (worded without content). A release recorded before this rule (no `failedCalls`) is not checked."""
    recorded = release_details.get("failedCalls")
    if not isinstance(recorded, dict):
        return []
    calls = from_events(events)
    out = []
    if list(recorded.get("ids") or []) != [c.tool_call_id for c in calls]:
        out.append("the release's failed calls are not the chain's failed tool calls")
    body, shown = split(content or "")
    expected = section(calls, language=str(recorded.get("language") or "en"), body=body)
    if shown != expected:
        out.append("the released content's failed-calls section does not match the chain")
    return out
