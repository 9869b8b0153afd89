"""The one write API for decision owners: every audit record of a run is written through a RunRecorder.

One recorder per run, in the process holding the run's lease; decision owners call one typed method per
decision as they decide. It numbers events 1..n without gap, chains and bounds them, commits a decision's
rows together before returning (fenced by the run's lease epoch), and is fail-open: a failed write is
logged (never content), counted in `audit_write_failures` and never raised. Only the tool lifecycle's
refusals are raised. Entry points: `RunRecorder.for_run`, `RunRecorder.resume`.
Details: docs/architecture.md, *The recorder (`audit/write/`)*.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from audit.models import (
    CHAT_AGENT_NAME,
    AgentStep,
    EventType,
    Phase,
    ToolInvocation,
    ToolStatus,
    TraceEvent,
    UsageSource,
)
from audit.payloads import bound_json, canonical_json, clip
from audit.read.list_facts import fact_statements
from audit.verify import row_digests
from audit.verify.hash_chain import GENESIS_HASH
from audit.verify.reconcile import CallUsage, Reconciliation, reconcile, stored_usage
from audit.write.approvals import ApprovalRecords
from audit.write.chain_writer import ChainWriter, _ms, _recover_connection, _tables, logger
from audit.write.decisions import DecisionRecords
from audit.write.group_commit import RecorderLock
from audit.write.ledger import _Ledger
from audit.write.ops import Fence
from audit.write.runtime_facts import (
    ERROR_MESSAGE_CHARS,
    SUMMARY_CHARS,
    WITHDRAWN,
    ChainEvent,
    Committed,
)
from audit.write.tools import ERROR_OBSERVED, OPEN_TOOL_STATUSES, ToolLifecycle, _ToolState, terminal_key
from diagnosis.models import DiagnosisRun, ReleaseMode, RunStatus
from pricing.costs import cost_fields, load_price_book
from pricing.rules import CallTokens
from reasoning.models import AgentReasoningAudit


class RunRecorder(DecisionRecords, ApprovalRecords, ToolLifecycle, ChainWriter):
    """Writes one run's audit records. Create it with `RunRecorder.for_run(run)` in the lease owner, or
    `RunRecorder.resume(run_id)` in a process taking over a run. See the module docstring for the rules."""

    def __init__(
        self,
        *,
        run_id: str,
        session_id: str,
        created_at: Any = None,
        group_commit: bool | None = None,
        lease_epoch: int = 0,
        provider: str = "",
    ) -> None:
        self.run_id = run_id
        self.session_id = session_id
        self.lease_epoch = lease_epoch
        self._fence_made: Fence | None = None  # `ChainWriter._fence` for `lease_epoch`, made once
        # Set when a write was refused because another process claimed the run since `lease_epoch`.
        self.fenced = False
        self.fenced_writes = 0
        self.on_fenced: Callable[[], None] | None = None
        # When a deque: every committed event is appended as a `Committed` (its live listeners drain it
        # from another thread; see `agent.runtime.context.RunContext.record`). None: nothing kept.
        self.committed: deque[Committed] | None = None
        self._created_at = created_at
        # The provider that executes the run (RUN_STARTED names it; a resumed run's row holds it): what
        # the run's cost is priced under (`pricing`).
        self.provider = provider
        self._group_commit = bool(settings.AUDIT_GROUP_COMMIT) if group_commit is None else group_commit
        self._lock = RecorderLock()
        self._next_sequence = 1
        self._prev_hash = GENESIS_HASH
        # tool_call_id -> the declaring step, (agent_name, step_index).
        self._declared: dict[str, tuple[str, int]] = {}
        self._provider_ids: dict[str, str] = {}
        self._step_ids: dict[tuple[str, int], int] = {}
        self._tools: dict[str, _ToolState] = {}
        self._ledger = _Ledger()
        self._guard_calls = 0
        self._first_model_request_at = None
        self._first_output_at = None
        self._last_token_at = None
        self._started_at = None
        # The release policy the run executes under, and the unverified draft characters sent so far
        # (`note_draft`); both enter the terminal summary.
        self.release_mode = ""
        self.draft_chars: int | None = 0
        self.release_decision: str | None = None
        # The router's decision (`routing_decision`), written again by the terminal update so that the
        # terminal digest (`run/4`) binds it.
        self.intent: str | None = None
        self.expected_events = 0
        self.expected_steps = 0
        self.expected_tools = 0
        self.expected_reasoning = 0
        self.audit_write_failures = 0
        # Set once the terminal row is written: every later write also rewrites the stored list facts.
        self.finished = False
        # Decisions chained but not committed yet (`hold`), and whether the current one is held.
        self._held: list = []
        self._holding = False

    # ----------------------------------------------------------------------------------------------
    # Construction
    # ----------------------------------------------------------------------------------------------
    @classmethod
    def for_run(cls, run: DiagnosisRun, *, group_commit: bool | None = None) -> RunRecorder:
        """A recorder for a run that has written no audit record yet, fenced by the lease epoch `run`
        holds (the one its claim set). `group_commit` overrides `settings.AUDIT_GROUP_COMMIT`."""
        rec = cls(
            run_id=run.run_id,
            session_id=run.session_id,
            created_at=run.created_at,
            group_commit=group_commit,
            lease_epoch=run.lease_epoch,
            provider=run.provider,
        )
        rec.intent = run.intent
        return rec

    @classmethod
    def resume(cls, run_id: str, *, lease_epoch: int | None = None) -> RunRecorder:
        """Rebuild a recorder from what is stored: chain head, declared tool calls (with the provider's
        ids), tool states (with their input and terminal facts, so that a conflicting terminal is still
        refused) and counts.

        Used by a process that takes over a run (the sweeper), fenced by `lease_epoch`: the epoch its own
        claim set (the stored epoch when not given). Tools started elsewhere have no monotonic start here,
        so their duration stays unknown (NULL) when this recorder closes them.
        """
        run = DiagnosisRun.objects.get(run_id=run_id)
        rec = cls(
            run_id=run.run_id,
            session_id=run.session_id,
            created_at=run.created_at,
            lease_epoch=run.lease_epoch if lease_epoch is None else lease_epoch,
            provider=run.provider,
        )
        rec._started_at = run.started_at
        rec._first_model_request_at = run.first_model_request_at
        rec._first_output_at = run.first_output_at
        rec.release_decision = run.release_decision
        rec.release_mode = run.release_mode
        rec.intent = run.intent
        # Drafts a previous owner sent were counted in its memory only: unknown unless none could be sent.
        rec.draft_chars = 0 if run.release_mode == ReleaseMode.VERIFIED else None
        rec._reload_head()
        for agent_name, step_index, step_id, ids, output, finished_at in AgentStep.objects.filter(
            run_id=run_id
        ).values_list("agent_name", "step_index", "id", "tool_call_ids", "model_output", "finished_at"):
            rec._step_ids[(agent_name, step_index)] = step_id
            if finished_at is not None and (rec._last_token_at is None or finished_at > rec._last_token_at):
                rec._last_token_at = finished_at
            for tool_call_id in ids or []:
                rec._declared[tool_call_id] = (agent_name, step_index)
            for call in (output or {}).get("toolCalls") or []:
                if isinstance(call, dict) and call.get("providerToolCallId"):
                    rec._provider_ids[str(call.get("id"))] = str(call["providerToolCallId"])
        columns = _tables().tool.columns
        for tool in ToolInvocation.objects.filter(run_id=run_id):
            rec._tools[tool.tool_call_id] = _ToolState(
                name=tool.tool_name,
                input_key=canonical_json(tool.input_params),
                step_index=tool.step_index,
                agent_name=tool.agent_name or CHAT_AGENT_NAME,
                started_monotonic=None,
                started_at=tool.started_at,
                input_params=tool.input_params,
                provider_id=tool.provider_tool_call_id or tool.tool_call_id,
                status=tool.status,
                terminal_key=(
                    None
                    if tool.status in OPEN_TOOL_STATUSES
                    else terminal_key(tool.status, tool.output_sha256, tool.error_code, tool.error_message)
                ),
                row={c: getattr(tool, c) for c in columns},
            )
        # Bare errors observed and kept until the run's verdict (seed 002): the last event of such a
        # call is its ERROR_OBSERVED.
        last: dict[str, tuple[str, dict]] = {}
        for status, details in (
            TraceEvent.objects.filter(run_id=run_id, event_type=EventType.TOOL_INVOCATION)
            .order_by("sequence_no")
            .values_list("status", "details")
        ):
            if isinstance(details, dict) and details.get("toolCallId"):
                last[str(details["toolCallId"])] = (status, details)
        for tool_call_id, (status, details) in last.items():
            state = rec._tools.get(tool_call_id)
            if status == ERROR_OBSERVED and state is not None and state.status == ToolStatus.RUNNING:
                state.observed = (str(details.get("errorCode") or ""), str(details.get("errorMessage") or ""))
        persisted = rec._persisted_counts()
        rec.expected_events = max(run.expected_events, persisted["events"])
        rec.expected_steps = max(run.expected_steps, persisted["steps"])
        rec.expected_tools = max(run.expected_tools, persisted["tools"])
        rec.expected_reasoning = max(
            rec.expected_steps, AgentReasoningAudit.objects.filter(run_id=run_id).count()
        )
        rec.audit_write_failures = run.audit_write_failures
        for details in (
            TraceEvent.objects.filter(run_id=run_id, event_type=EventType.MODEL_TOKEN_USAGE)
            .order_by("sequence_no")
            .values_list("details", flat=True)
        ):
            rec._ledger.calls.append(CallUsage.from_details(details))
        # Calls counted when they started but never recorded (lost with the process) stay in the count.
        rec._ledger.started = run.model_calls
        return rec

    # ----------------------------------------------------------------------------------------------
    # Run lifecycle
    # ----------------------------------------------------------------------------------------------
    def run_started(
        self, *, agent_flow: str = "", release_mode: str = "", details: dict[str, Any] | None = None
    ) -> int | None:
        """RUN_STARTED; the run becomes RUNNING with its `started_at`, the `provider` named in `details`
        (kept on the run row so that lists can label demo runs without reading events) and the release
        policy it runs under (`release_mode`, also in the event's details as `releaseMode`) and the
        fingerprint of its configuration (`configFingerprint` in `details`, copied to
        `config_fingerprint`; `agent.runtime.configuration`).

        The event binds the run's identity as stored (`_identity`: the forms `run-start` and `session`
        of `audit.verify.row_digests`, read in one query)."""
        now = timezone.now()
        self._started_at = now
        self.release_mode = str(release_mode or "")
        details = dict(details or {})
        if self.release_mode:
            details["releaseMode"] = self.release_mode
        details.update(self._identity())
        self.provider = clip(str(details.get("provider") or ""), 32)
        return self._write(
            "run_started",
            [ChainEvent(Phase.RUN, EventType.RUN_STARTED, RunStatus.RUNNING, "run started", details)],
            run_fields={
                "status": RunStatus.RUNNING,
                "started_at": now,
                "provider": clip(str(details.get("provider") or ""), 32),
                "release_mode": self.release_mode,
                "config_fingerprint": clip(str(details.get("configFingerprint") or ""), 64),
            },
        )

    def _identity(self) -> dict[str, Any]:
        """What RUN_STARTED carries about who asked what: the digests of the run's stored identity
        (`startDigest`, form `run-start`: id, session, question, flow, creation) and of its session's
        (`sessionDigest`, form `session`: id, owner, creation), and the owner's username as a snapshot
        (`owner`). One query; fail-open: when the row cannot be read the event binds no identity (the
        verifier notes it as not bound) and the run goes on."""
        start, session = row_digests.RUN_START, row_digests.SESSION
        try:
            row = (
                DiagnosisRun.objects.filter(run_id=self.run_id)
                .values(
                    *start.columns,
                    owner_id=F("session__owner_id"),
                    session_created_at=F("session__created_at"),
                    owner=F("session__owner__username"),
                )
                .first()
            )
        except Exception as exc:  # a read for the binding: its failure only costs the binding
            logger.warning("run identity read failed run=%s error=%s", self.run_id, type(exc).__name__)
            _recover_connection()
            return {}
        if row is None:
            return {}
        session_row = {
            "session_id": row["session_id"],
            "owner_id": row["owner_id"],
            "created_at": row["session_created_at"],
        }
        return {
            "startForm": start.name,
            "startDigest": start.digest(row, stored=True),
            "sessionForm": session.name,
            "sessionDigest": session.digest(session_row, stored=True),
            "owner": clip(str(row["owner"] or ""), 150),
        }

    def mark_first_model_request(self) -> None:
        """The first request to a model left this process (timing only; written once)."""
        if self._first_model_request_at is None:
            self._first_model_request_at = timezone.now()
            self._update_run("first_model_request", first_model_request_at=self._first_model_request_at)

    def model_call_started(self) -> None:
        """A model call is about to be sent: the run's `model_calls` counts it now, so that a call lost
        with its process shows as one without usage; the first call also stamps
        `first_model_request_at`, in the same update."""
        with self._lock:
            self._ledger.started += 1
            fields: dict[str, Any] = {"model_calls": self._ledger.model_calls}
            if self._first_model_request_at is None:
                self._first_model_request_at = timezone.now()
                fields["first_model_request_at"] = self._first_model_request_at
            self._update_run("model_call_started", **fields)

    def note_draft(self, chars: int) -> None:
        """`chars` characters of unverified draft text were sent to readers (draft release mode only);
        counted in memory, recorded by `finish` as `draft_chars`."""
        if self.draft_chars is not None:
            self.draft_chars += max(0, int(chars))

    def mark_first_output(self) -> None:
        """The first visible answer text reached the user (timing only; written once). In verified
        mode nothing is visible before the release: `finish` stamps it with the outcome instead."""
        if self._first_output_at is None:
            self._first_output_at = timezone.now()
            fields: dict[str, Any] = {"first_output_at": self._first_output_at}
            if self._created_at is not None:
                fields["first_output_latency_ms"] = _ms(self._first_output_at - self._created_at)
            self._update_run("first_output", **fields)

    def note_fenced_writes(self) -> int | None:
        """WRITE_FENCED, written by the current lease owner: how many writes of a stale owner the fence
        refused so far (the run's `fenced_writes` counter), when that grew since the last note. Refusals
        after RUN_FINISHED are only counted: nothing is chained after the run's end."""
        with self._lock:
            self.flush()
            stored = DiagnosisRun.objects.filter(run_id=self.run_id)
            total = stored.values_list("fenced_writes", flat=True).first() or 0
            noted = max(
                (
                    int((details or {}).get("fencedWrites") or 0)
                    for details in TraceEvent.objects.filter(
                        run_id=self.run_id, event_type=EventType.WRITE_FENCED
                    ).values_list("details", flat=True)
                ),
                default=0,
            )
            if total <= noted:
                return None
            return self._write(
                "write_fenced",
                [
                    ChainEvent(
                        Phase.RUN,
                        EventType.WRITE_FENCED,
                        "REFUSED",
                        f"{total - noted} write(s) of a previous lease owner refused",
                        {"fencedWrites": total, "refusedSinceLastNote": total - noted},
                    )
                ],
            )

    def run_cancelled(self, *, reason: str) -> int | None:
        """RUN_CANCELLED: the run stops at a safe point; `finish(status=CANCELLED)` follows."""
        return self._write(
            "run_cancelled",
            [ChainEvent(Phase.RUN, EventType.RUN_CANCELLED, RunStatus.CANCELLED, clip(reason, 200), {})],
        )

    def _delivery_fields(self, now: Any, content: str) -> dict[str, Any]:
        """What the reader could see and when, as the terminal row records it: the release mode, the
        draft characters sent, the model's last answer token and the wait from it to the release, and
        `first_output_at` when the outcome is the first text the reader sees (always in verified mode:
        the outcome is sent right after this row commits)."""
        fields: dict[str, Any] = {
            "release_mode": self.release_mode,
            "draft_chars": self.draft_chars,
            "last_token_at": self._last_token_at,
            "release_latency_ms": _ms(now - self._last_token_at) if self._last_token_at else None,
        }
        if self._first_output_at is None and content:
            self._first_output_at = now
            fields["first_output_at"] = now
            if self._created_at is not None:
                fields["first_output_latency_ms"] = _ms(now - self._created_at)
        return fields

    def finish(
        self,
        *,
        status: str,
        content: str = "",
        error_code: str = "",
        error_message: str = "",
        self_evaluation: dict[str, Any] | None = None,
    ) -> int | None:
        """Close dangling tools, write RUN_FINISHED, then the run's terminal row: status, content,
        release decision, error, timing, token ledger (with its reconciliation verdict), counts and the
        run's self-evaluation (AI Ops; None otherwise), with the run's intent and provider written again,
        all bound by the terminal digest (`run/4`).

        Only a SUCCESS run carries a release decision and content. A decision recorded before a run
        ended FAILED or CANCELLED is withdrawn: a RELEASE_DECISION event with status WITHDRAWN precedes
        RUN_FINISHED, and the terminal row's `release_decision` is NULL and its content empty.

        The token ledger is reconciled against the usage records and step rows re-read from the
        database (one query; `audit.verify.reconcile`)."""
        with self._lock:
            self._close_dangling_tools(status)
            self.flush()  # the reconciliation below reads the usage records
            events: list[ChainEvent] = []
            if status != RunStatus.SUCCESS:
                content = ""
                if self.release_decision is not None:
                    withdrawn, self.release_decision = self.release_decision, None
                    events.append(
                        ChainEvent(
                            Phase.RELEASE,
                            EventType.RELEASE_DECISION,
                            WITHDRAWN,
                            clip(
                                f"{WITHDRAWN}: {withdrawn} withdrawn, the run ended {status}", SUMMARY_CHARS
                            ),
                            {"decision": None, "withdrawn": withdrawn, "reason": f"run ended {status}"},
                        )
                    )
            ledger = self._ledger
            verdict, stored = self._reconcile()
            now = timezone.now()
            by_source = ledger.by_source
            fields: dict[str, Any] = {
                **self._delivery_fields(now, content),
                "status": status,
                "content": content,
                "release_decision": self.release_decision,
                "intent": self.intent,
                "provider": self.provider,
                "error_code": clip(error_code, 64),
                "error_message": clip(error_message, ERROR_MESSAGE_CHARS),
                "finished_at": now,
                "tokens_router": by_source[UsageSource.ROUTER],
                "tokens_agent": by_source[UsageSource.AGENT],
                "tokens_guard": by_source[UsageSource.GUARD],
                "tokens_total": ledger.total,
                "tokens_reasoning": ledger.reasoning,
                "tokens_cached_input": ledger.cached_input,
                "model_calls": ledger.model_calls,
                "usage_unavailable_calls": ledger.unavailable_calls,
                "tokens_reconciled": verdict.reconciled,
                "lease_owner": "",
                "lease_expires_at": None,
                # The counts as the terminal update writes them: this decision's events included.
                "expected_events": self.expected_events + len(events) + 1,
                "expected_steps": self.expected_steps,
                "expected_tools": self.expected_tools,
                "self_evaluation": bound_json(self_evaluation) if self_evaluation is not None else None,
            }
            if self._created_at is not None:
                fields["total_duration_ms"] = _ms(now - self._created_at)
                if stored is not None:
                    fields.update(self._cost_fields(stored, ledger.model_calls))
            events.append(
                ChainEvent(
                    Phase.RUN,
                    EventType.RUN_FINISHED,
                    status,
                    clip(
                        f"run {status.lower()}"
                        + (f", release {self.release_decision}" if self.release_decision else "")
                        + (f", error {error_code}" if error_code else ""),
                        SUMMARY_CHARS,
                    ),
                    {
                        "status": status,
                        "releaseDecision": self.release_decision,
                        "errorCode": error_code or None,
                        "tokensTotal": ledger.total,
                        "modelCalls": ledger.model_calls,
                        "unavailableCalls": ledger.unavailable_calls,
                        "tokensReconciled": verdict.reconciled,
                        "contentLength": len(content),
                        "runForm": row_digests.RUN.name,
                        "runDigest": row_digests.RUN.digest(fields),
                        "expected": {
                            "events": fields["expected_events"],
                            "steps": fields["expected_steps"],
                            "tools": fields["expected_tools"],
                            "reasoning": self.expected_reasoning,
                        },
                    },
                )
            )
            # RUN_FINISHED is held and commits with the terminal row, in one transaction (each on its
            # own if that fails). The run's stored list facts (`audit.read.list_facts`), decided from the
            # stored rows in the transaction of the terminal row (and the review queue's flag, which reads
            # them).
            self._holding = True
            try:
                self._write("run_finished", events)
            finally:
                self._holding = False
            held = self._held[-1] if self._held else None
            facts = fact_statements(self.run_id)
            written = self._update_run("finish", after=facts, **fields)
            sequence_no = held.result if held is not None else None
            if not written and not self.fenced:
                # The terminal row is the business result: one more try after a failed write.
                written = self._update_run("finish_retry", after=facts, **fields)
            self.finished = self.finished or written
            return sequence_no

    def _cost_fields(self, stored: list[CallUsage], model_calls: int) -> dict[str, Any]:
        """The run's cost (`pricing.costs`) from the usage records re-read for reconciliation, priced at
        the run's creation; fail-open: when the overrides cannot be read, the run stays not priced
        (`cost_status` "") for `verify_audit --refresh-facts` to price."""
        try:
            book = load_price_book()
            cost, _calls = book.price_run(
                provider=self.provider,
                calls=[(c.model or "", CallTokens.from_usage(c)) for c in stored],
                started_calls=model_calls,
                at=self._created_at,
            )
        except Exception as exc:  # a derived fact: its failure costs only the stored cost
            logger.warning("run pricing failed run=%s error=%s", self.run_id, type(exc).__name__)
            _recover_connection()
            return {}
        return cost_fields(cost)

    def _reconcile(self) -> tuple[Reconciliation, list[CallUsage] | None]:
        """The ledger kept while running, compared with what is stored (see `audit.verify.reconcile`), and the
        stored usage records (None when they cannot be read; then not reconciled)."""
        try:
            stored, steps = stored_usage(self.run_id)
        except Exception as exc:  # a read for the verdict: its failure only costs the verdict
            logger.warning(
                "ledger reconciliation read failed run=%s error=%s", self.run_id, type(exc).__name__
            )
            _recover_connection()
            stored, steps = None, ()
        verdict = reconcile(
            stored=stored if stored is not None else [],
            steps=steps,
            started_calls=self._ledger.started,
            kept=self._ledger.kept(),
            reported=self._ledger.calls,
        )
        if stored is None:
            return replace(verdict, reconciled=False), None
        return verdict, stored
