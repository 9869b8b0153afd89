"""Sandboxed replays: a run that is not production work (an experiment's replay, any offline replay)
never executes a tool that changes something outside the service and never asks for an approval.

`sandbox_of(run, replay_of=…)` gives such a run its `ReplaySandbox` (None for production). The boundary
records the world-changing call RUNNING, then FAILED with `NOT_EXECUTED_REPLAY` and a message naming what
the model got instead: the outcome the source run recorded for the same tool and arguments
(`ReplaySandbox.recorded`), or a plain "not executed". Read-only tools run live.
Details: docs/experiments.md, *Replays are sandboxed*.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from agent.runtime.canonical import CanonicalStore, CanonicalUnavailable
from audit.failed_calls import NOT_EXECUTED_REPLAY as NOT_EXECUTED_REPLAY  # its home: the record's rule
from audit.models import TERMINAL_TOOL_STATUSES, ToolInvocation
from audit.payloads import canonical_json, clip, sha256_hex
from diagnosis.models import DiagnosisRun, RunPurpose

MESSAGE_CHARS = 300


@dataclass(frozen=True, slots=True)
class RecordedCall:
    """The source run's call of the same tool with the same arguments, as its record holds it: the
    full result while the source's canonical store still keeps it, else the recorded preview."""

    tool_call_id: str
    status: str
    result: Any
    error_code: str
    error_message: str


@dataclass(eq=False)
class ReplaySandbox:
    """One replay run's sandbox: where recorded outcomes come from, and which were given already (a
    source call's outcome is replayed once, in the order the source made its calls)."""

    source_run_id: str
    used: set[str] = field(default_factory=set)

    def recorded(self, name: str, arguments: dict[str, Any]) -> RecordedCall | None:
        """The source run's first unused terminal call of `name` with exactly `arguments` (canonical
        JSON; both redacted), or None. Reads the database: call it on the pool."""
        if not self.source_run_id:
            return None
        wanted = canonical_json(arguments)
        rows = ToolInvocation.objects.filter(
            run_id=self.source_run_id, tool_name=name, status__in=TERMINAL_TOOL_STATUSES
        ).order_by("created_at", "id")
        for row in rows:
            if row.tool_call_id in self.used or canonical_json(row.input_params or {}) != wanted:
                continue
            self.used.add(row.tool_call_id)
            result: Any = row.output_preview
            if row.output_sha256:
                try:
                    kept = CanonicalStore(self.source_run_id).get_result(row.tool_call_id)
                except CanonicalUnavailable:
                    kept = None
                # Only the result the record binds (its sha256), never another value under that key.
                if kept is not None and sha256_hex(canonical_json(kept)) == row.output_sha256:
                    result = kept
            return RecordedCall(row.tool_call_id, row.status, result, row.error_code, row.error_message)
        return None

    def account(self, name: str, recorded: RecordedCall | None) -> tuple[str, str]:
        """What the replay's call records (the bounded error message) and what the model gets."""
        head = f"not executed: replay — {name} changes something outside the service"
        if recorded is None:
            message = f"{head}; no stored source run recorded this call, so nothing was replayed"
            content = {"error": {"code": NOT_EXECUTED_REPLAY, "message": message}}
            return clip(message, MESSAGE_CHARS), json.dumps(content, ensure_ascii=False)
        message = (
            f"{head}; the outcome recorded by the source run {self.source_run_id} "
            f"(call {recorded.tool_call_id}, {recorded.status}) was replayed to the model"
        )
        content = {
            "notExecuted": "replay",
            "message": message,
            "recorded": {
                "sourceRunId": self.source_run_id,
                "toolCallId": recorded.tool_call_id,
                "status": recorded.status,
                "result": recorded.result,
                **({"error": {"code": recorded.error_code, "message": recorded.error_message}}
                   if recorded.error_code else {}),
            },
        }  # fmt: skip
        return clip(message, MESSAGE_CHARS), json.dumps(content, ensure_ascii=False)


def sandbox_of(run: DiagnosisRun, *, replay_of: str = "") -> ReplaySandbox | None:
    """The sandbox of a run that is not production work (its purpose), None for production: the one
    rule, so a replay is sandboxed whoever executes it, whether or not its source is known."""
    if run.purpose == RunPurpose.PRODUCTION:
        return None
    return ReplaySandbox(source_run_id=replay_of)


def started_details(sandbox: ReplaySandbox | None) -> dict[str, Any]:
    """What RUN_STARTED chains about the sandbox (nothing for production)."""
    if sandbox is None:
        return {}
    return {"replay": {"sandboxed": True, "sourceRunId": sandbox.source_run_id or None}}
