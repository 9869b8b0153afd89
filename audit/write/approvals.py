"""Approval of risky tool calls as the recorder enforces it (seed 002; docs/aiops.md, *Approvals*): a
declared call of a tool that requires approval is recorded AWAITING_APPROVAL with its APPROVAL_REQUESTED
and never executed; the attempt ends with RUN_INTERRUPTED (the lease released, no RUN_FINISHED); a
person's or the sweeper's APPROVAL_DECIDED is written by whoever claimed the interrupted run (not
fail-open: a decision that did not commit does not stand); the resuming worker writes RUN_RESUMED and
starts an approved call under its own id only when its declaring step and waiting row are found in the
store (fail-closed)."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from typing import Any

from django.utils import timezone

from audit.models import AgentStep, EventType, Phase, ToolInvocation, ToolStatus
from audit.payloads import bound_json, canonical_json, clip
from audit.verify import row_digests
from audit.write.chain_writer import RunChain
from audit.write.ops import Insert, Update
from audit.write.rows import tables
from audit.write.runtime_facts import (
    INPUT_STRING_CHARS,
    SUMMARY_CHARS,
    ChainEvent,
    ToolCallNotDeclared,
    ToolCallRepeated,
    ToolLifecycleConflict,
)
from audit.write.tool_facts import arguments_digest
from audit.write.tools import ToolCalls
from diagnosis.models import RunStatus

APPROVAL_REQUESTED_STATUS = "WAITING"


class DecisionNotRecorded(Exception):
    """An approval decision whose event did not commit: it does not stand."""


class Approvals:
    """The recorder's approval part (`recorder.approvals`): it keeps no state of its own; the calls it
    records are the tool part's (`ToolCalls`), written through the run's chain."""

    def __init__(self, chain: RunChain, tools: ToolCalls) -> None:
        self.chain = chain
        self.tools = tools
        self.run_id = chain.run_id
        self.session_id = chain.session_id

    def tool_awaiting_approval(
        self,
        *,
        tool_call_id: str,
        tool_name: str,
        input_params: dict[str, Any],
        approvers: dict[str, Any],
        deadline: Callable[[dt.datetime], dt.datetime],
        action: dict[str, Any] | None = None,
    ) -> int | None:
        """Record a declared call of a tool that requires approval, without executing it: its row with
        status AWAITING_APPROVAL (no `started_at`: nothing ran), its TOOL_INVOCATION event and
        APPROVAL_REQUESTED (the tool, its bounded arguments and their digest, who may decide, when the
        request expires), in one transaction. `deadline` is the deadline rule, a function of the row's
        creation time (`agent.runtime.approvals.expiry_of`), so the recorded `expiresAt` is the one
        decisions are held to. `action` states what an approved call will do (who executes it, where,
        how long its effect lasts: bounded facts, `action` in the details). The same refusals as
        `tool_started` apply (undeclared id, a repeat). Returns the sequence of APPROVAL_REQUESTED, or
        None when the write failed (then no request exists: the caller must not wait for one)."""
        with self.chain.lock:
            now = timezone.now()
            state = self.tools.starting(
                tool_call_id, tool_name, input_params, status=ToolStatus.AWAITING_APPROVAL, now=now
            )
            effective_input, agent_name, step_index = state.input_params, state.agent_name, state.step_index
            provider_id = state.provider_id
            t = tables()
            row = self.tools.new_row(
                t, tool_call_id=tool_call_id, tool_name=tool_name, provider_id=provider_id,
                agent_name=agent_name, step_index=step_index, status=ToolStatus.AWAITING_APPROVAL,
                input_params=effective_input, started_at=None, now=now,
            )  # fmt: skip
            digest = arguments_digest(effective_input)
            expiry = deadline(now)
            common = {
                "toolCallId": tool_call_id,
                "providerToolCallId": provider_id,
                "toolName": tool_name,
                "stepIndex": step_index,
                "agentName": agent_name,
            }
            sequence_no = self.chain.write(
                "tool_awaiting_approval",
                [
                    ChainEvent(
                        Phase.TOOL,
                        EventType.TOOL_INVOCATION,
                        ToolStatus.AWAITING_APPROVAL,
                        clip(f"{tool_name} awaiting approval ({tool_call_id})", SUMMARY_CHARS),
                        {**common, "input": effective_input, "rowForm": row_digests.TOOL.name},
                        bind={"rowDigest": row},
                    ),
                    ChainEvent(
                        Phase.TOOL,
                        EventType.APPROVAL_REQUESTED,
                        APPROVAL_REQUESTED_STATUS,
                        clip(f"approval requested for {tool_name} ({tool_call_id})", SUMMARY_CHARS),
                        {
                            **common,
                            "arguments": effective_input,
                            "argumentsDigest": digest,
                            "approvers": dict(approvers),
                            "expiresAt": expiry.isoformat(),
                            **({"action": dict(action)} if action else {}),
                        },
                    ),
                ],
                inserts=[row],
            )
            if sequence_no is None:
                return None
            self.chain.expected_tools += 1
            state.row = dict(zip(t.tool.columns, row.values, strict=True))
            self.tools.calls[tool_call_id] = state
            return sequence_no

    def approved_tool_started(
        self, *, tool_call_id: str, tool_name: str, input_params: dict[str, Any], approved_digest: str
    ) -> int | None:
        """Start a call that waited for approval and was approved, under its own `tool_call_id`: the row
        goes from AWAITING_APPROVAL to RUNNING (TOOL_INVOCATION RUNNING with the new row digest) before
        the tool executes.

        Fail-closed (seed 002): the declaring step must be found *in the database* in this run — its
        resume ancestry is the run's own earlier attempts — with the run's session, and the waiting row
        too; otherwise ToolCallNotDeclared (a REFUSED event). The name, the input and the digest the
        approval named must be the recorded ones, else ToolLifecycleConflict (a CONFLICT event); a call
        that is no longer waiting raises ToolCallRepeated (it is never executed twice)."""
        effective_input = bound_json(input_params, max_string=INPUT_STRING_CHARS)
        input_key = canonical_json(effective_input)
        with self.chain.lock:
            state = self.tools.calls.get(tool_call_id)
            if state is None or tool_call_id not in self.tools.declared:
                self.tools.refused(tool_call_id, tool_name, "NO_WAITING_CALL", "has no recorded waiting call")
                raise ToolCallNotDeclared(f"tool call {tool_call_id} has no recorded waiting call")
            if state.status != ToolStatus.AWAITING_APPROVAL:
                raise ToolCallRepeated(tool_call_id, state.status)
            if (
                state.name != tool_name
                or state.input_key != input_key
                or arguments_digest(state.input_params) != approved_digest
            ):
                self.tools.conflict(
                    tool_call_id,
                    tool_name,
                    "APPROVED_ARGUMENTS_DIFFER",
                    {"recordedToolName": state.name, "approvedDigest": approved_digest},
                )
                raise ToolLifecycleConflict(f"tool call {tool_call_id}: not the arguments approved")
            agent_name, step_index = self.tools.declared[tool_call_id]
            self.chain.flush()  # what is read next must include every decision recorded
            if not _declared_in_store(self, tool_call_id, agent_name, step_index):
                self.tools.refused(
                    tool_call_id, tool_name, "DECLARING_STEP_NOT_FOUND", "has no declaring step in this run"
                )
                raise ToolCallNotDeclared(f"tool call {tool_call_id}: no declaring step in this run")
            now = timezone.now()
            fields = {"status": ToolStatus.RUNNING.value, "started_at": now, "updated_at": now}
            update = Update(
                tables().tool,
                tuple(fields),
                tuple(fields.values()),
                ("run_id", "tool_call_id", "status"),
                (self.run_id, tool_call_id, ToolStatus.AWAITING_APPROVAL.value),
            )
            image = {**state.row, **fields}
            t = tables()
            sequence_no = self.chain.write(
                "approved_tool_started",
                [
                    ChainEvent(
                        Phase.TOOL,
                        EventType.TOOL_INVOCATION,
                        ToolStatus.RUNNING,
                        clip(f"{tool_name} started after approval ({tool_call_id})", SUMMARY_CHARS),
                        {
                            "toolCallId": tool_call_id,
                            "providerToolCallId": state.provider_id or tool_call_id,
                            "toolName": tool_name,
                            "stepIndex": step_index,
                            "agentName": agent_name,
                            "input": effective_input,
                            "approvedDigest": approved_digest,
                            "rowForm": row_digests.TOOL.name,
                        },
                        bind={"rowDigest": Insert(t.tool, t.tool.row(**image))},
                    )
                ],
                updates=[update],
            )
            state.status = ToolStatus.RUNNING
            state.started_at = now
            state.row = image
            state.started_monotonic = time.monotonic()
            return sequence_no

    def interrupt(
        self, *, pending: list[str], checkpoint_sha256: str, reason: str, kept: list[str] = ()
    ) -> int | None:
        """RUN_INTERRUPTED: the attempt ends waiting for decisions on the `pending` calls; the run
        becomes INTERRUPTED and its lease is released in the same transaction (no RUN_FINISHED: the
        run is not over). `checkpoint_sha256` names the executor's saved state the resumption must
        find unchanged."""
        with self.chain.lock:
            return self.chain.write(
                "run_interrupted",
                [
                    ChainEvent(
                        Phase.RUN,
                        EventType.RUN_INTERRUPTED,
                        RunStatus.INTERRUPTED,
                        clip(f"run interrupted: {len(pending)} call(s) wait for approval", SUMMARY_CHARS),
                        {
                            "pending": list(pending),
                            # Calls whose bare error was observed: kept pending for the resumption.
                            "keptPending": list(kept),
                            "checkpointSha256": checkpoint_sha256,
                            "reason": clip(reason, 300),
                        },
                    )
                ],
                run_fields={"status": RunStatus.INTERRUPTED, "lease_owner": "", "lease_expires_at": None},
            )

    def hand_over(
        self, *, checkpoint_sha256: str, reason: str, claim_by: dt.datetime, details: dict[str, Any]
    ) -> int | None:
        """RUN_INTERRUPTED as a handover: the serving process stops (`agent.runtime.drain`) and the run,
        stopped at a step boundary with its state saved (`checkpoint_sha256`, as an interruption's), is
        PENDING again with its lease released in the same transaction, for another process to claim by
        `claim_by` (after it the sweeper fails it, as any lapsed lease). No call waits; `details` says
        where it stopped (agent, steps used, a model step abandoned and asked again, if any)."""
        with self.chain.lock:
            return self.chain.write(
                "run_handed_over",
                [
                    ChainEvent(
                        Phase.RUN,
                        EventType.RUN_INTERRUPTED,
                        RunStatus.PENDING,
                        clip(f"run handed over: {reason}", SUMMARY_CHARS),
                        {
                            "handover": True,
                            "pending": [],
                            "keptPending": [],
                            "checkpointSha256": checkpoint_sha256,
                            "reason": clip(reason, 300),
                            **details,
                        },
                    )
                ],
                run_fields={"status": RunStatus.PENDING, "lease_owner": "", "lease_expires_at": claim_by},
            )

    def approval_decided(
        self,
        *,
        tool_call_id: str,
        tool_name: str,
        decision: str,
        decided_by: str,
        note: str,
        arguments: Any,
        arguments_digest: str,
        requested_sequence_no: int | None,
        claimable_until: Any = None,
        decided_at: Any = None,
        governance_at: int | None = None,
    ) -> int:
        """APPROVAL_DECIDED (APPROVED, REJECTED or EXPIRED): who decided (a username; "" for the
        system's expiry), when (`decided_at`: the instant the decider checked the deadline at; default
        now), the note, the exact arguments decided and their
        digest. With `claimable_until` (no other call of the run still waits), the run becomes PENDING
        with a free lease in the same transaction, so a worker resumes it (the sweeper fails it if none
        claims it by then); else it stays INTERRUPTED. Not fail-open: a decision that did not commit
        raises `DecisionNotRecorded` (nothing changed, the call still waits)."""
        with self.chain.lock:
            seq = self.chain.write(
                "approval_decided",
                [
                    ChainEvent(
                        Phase.TOOL,
                        EventType.APPROVAL_DECIDED,
                        decision,
                        clip(
                            f"{tool_name} {decision.lower()}"
                            + (f" by {decided_by}" if decided_by else "")
                            + f" ({tool_call_id})",
                            SUMMARY_CHARS,
                        ),
                        {
                            "toolCallId": tool_call_id,
                            "toolName": tool_name,
                            "decision": decision,
                            "decidedBy": decided_by or None,
                            "decidedAt": (decided_at or timezone.now()).isoformat(),
                            "note": clip(note, 1000),
                            "arguments": bound_json(arguments),
                            "argumentsDigest": arguments_digest,
                            "requestedAt": requested_sequence_no,
                            # Where the decider's right is judged (`audit.verify.authority`).
                            **({"governanceAt": governance_at} if governance_at is not None else {}),
                        },
                    )
                ],
                run_fields=(
                    {"status": RunStatus.PENDING, "lease_owner": "", "lease_expires_at": claimable_until}
                    if claimable_until is not None
                    else {"status": RunStatus.INTERRUPTED, "lease_owner": "", "lease_expires_at": None}
                ),
            )
            if seq is None:
                raise DecisionNotRecorded(tool_call_id)
            return seq

    def run_resumed(self, *, details: dict[str, Any]) -> int | None:
        """RUN_RESUMED: a worker claimed the interrupted run (a new lease and epoch) and continues it."""
        return self.chain.write(
            "run_resumed",
            [ChainEvent(Phase.RUN, EventType.RUN_RESUMED, RunStatus.RUNNING, "run resumed", dict(details))],
            run_fields={"status": RunStatus.RUNNING},
        )


def _declared_in_store(rec: Approvals, tool_call_id: str, agent_name: str, step_index: int) -> bool:
    """Whether a stored model step of the recorder's run, in its session, declared `tool_call_id`, and
    the stored call waits in that session (read from the database, not from memory)."""
    steps = AgentStep.objects.filter(
        run_id=rec.run_id, session_id=rec.session_id, agent_name=agent_name, step_index=step_index
    ).values_list("tool_call_ids", flat=True)
    declared = any(tool_call_id in (ids or []) for ids in steps)
    waiting = ToolInvocation.objects.filter(
        run_id=rec.run_id,
        session_id=rec.session_id,
        tool_call_id=tool_call_id,
        status=ToolStatus.AWAITING_APPROVAL,
    ).exists()
    return declared and waiting
