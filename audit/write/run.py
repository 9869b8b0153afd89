"""The one write API for decision owners: every audit record of a run is written through a RunRecorder.

One recorder per run, in the process holding the run's lease; decision owners call one typed method per
decision as they decide. It numbers events 1..n without gap, chains and bounds them, commits a decision's
rows together before returning (fenced by the run's lease epoch), and is fail-open: a failed write is
logged (never content), counted in `audit_write_failures` and never raised. Only the tool lifecycle's
refusals are raised. It is one front over named parts with their own state (`chain`, `decisions`,
`tools`, `approvals`, `ledger`). Entry points: `RunRecorder.for_run`, `RunRecorder.resume`.
Details: docs/architecture.md, *The recorder (`audit/write/`)*.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django.conf import settings
from django.db.models import F, QuerySet
from django.utils import timezone

from audit.models import EventType, Phase, TraceEvent, UsageSource
from audit.payloads import bound_json, clip
from audit.read.list_facts import fact_statements
from audit.verify import row_digests
from audit.verify.authenticity import ChainFinished
from audit.verify.reconcile import CallUsage, Reconciliation
from audit.write.approvals import Approvals
from audit.write.chain_writer import HOLDABLE, TOGETHER, RunChain, logger
from audit.write.decisions import Decisions
from audit.write.ledger import TokenLedger, priced
from audit.write.parts import Part, PartMethod
from audit.write.rows import ms, recover_connection
from audit.write.runtime_facts import ERROR_MESSAGE_CHARS, SUMMARY_CHARS, WITHDRAWN, ChainEvent
from audit.write.tools import ToolCalls
from core.compiled import CompiledQuery
from diagnosis.models import DiagnosisRun, ReleaseMode, RunStatus
from reasoning.models import AgentReasoningAudit


def _identity_query(run_id: str) -> QuerySet:
    """The run's stored identity and its session's, as `RunRecorder._identity` reads it (`first()`)."""
    rows = DiagnosisRun.objects.filter(run_id=run_id).values(
        *row_digests.RUN_START.columns,
        owner_id=F("session__owner_id"),
        session_created_at=F("session__created_at"),
        owner=F("session__owner__username"),
    )
    return (rows if rows.ordered else rows.order_by("pk"))[:1]


# Compiled once (`core.compiled`): building and compiling that query was about a tenth of the CPU of a
# run recorded concurrently (B1); its rows and converted values are the ORM's.
_IDENTITY = CompiledQuery(_identity_query, run_id=str)


class RunRecorder:
    """Writes one run's audit records. Create it with `RunRecorder.for_run(run)` in the lease owner, or
    `RunRecorder.resume(run_id)` in a process taking over a run. See the module docstring for the rules."""

    # The write path (`audit.write.chain_writer.RunChain`): its accounting, and the held decisions.
    lease_epoch = Part("chain")
    fenced = Part("chain")
    fenced_writes = Part("chain")
    on_fenced = Part("chain")
    committed = Part("chain")
    finished = Part("chain")
    audit_write_failures = Part("chain")
    expected_events = Part("chain")
    expected_steps = Part("chain")
    expected_tools = Part("chain")
    expected_reasoning = Part("chain")
    holds = PartMethod("chain")
    flush = PartMethod("chain")
    append_after = PartMethod("chain")
    # The run's decisions (`audit.write.decisions.Decisions`) and what the terminal row writes again.
    intent = Part("decisions")
    release_decision = Part("decisions")
    redaction_applied = PartMethod("decisions")
    routing_attempt = PartMethod("decisions")
    routing_decision = PartMethod("decisions")
    model_step = PartMethod("decisions")
    plan_decision = PartMethod("decisions")
    evidence_guard = PartMethod("decisions")
    semantic_guard = PartMethod("decisions")
    release = PartMethod("decisions")
    # The tool lifecycle (`audit.write.tools.ToolCalls`).
    is_declared = PartMethod("tools")
    any_failed = PartMethod("tools")
    run_unique_calls = PartMethod("tools")
    tool_started = PartMethod("tools")
    tool_finished = PartMethod("tools")
    close_tools = PartMethod("tools")
    tool_error_observed = PartMethod("tools")
    tool_restarted = PartMethod("tools")
    # Calls that wait for a person (`audit.write.approvals.Approvals`).
    tool_awaiting_approval = PartMethod("approvals")
    approved_tool_started = PartMethod("approvals")
    interrupt = PartMethod("approvals")
    hand_over = PartMethod("approvals")
    approval_decided = PartMethod("approvals")
    run_resumed = PartMethod("approvals")

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
        self.chain = RunChain(
            run_id=run_id,
            session_id=session_id,
            lease_epoch=lease_epoch,
            group_commit=(bool(settings.AUDIT_GROUP_COMMIT) if group_commit is None else group_commit),
        )
        self.ledger = TokenLedger()
        self.tools = ToolCalls(self.chain)
        self.approvals = Approvals(self.chain, self.tools)
        self.decisions = Decisions(self.chain, self.tools, self.ledger)
        self._created_at = created_at
        # The provider that executes the run (RUN_STARTED names it; a resumed run's row holds it): what
        # the run's cost is priced under (`pricing`).
        self.provider = provider
        self._first_model_request_at = None
        self._first_output_at = None
        self._started_at = None
        # The release policy the run executes under, and the unverified draft characters sent so far
        # (`note_draft`); both enter the terminal summary.
        self.release_mode = ""
        self.draft_chars: int | None = 0

    def hold(self, write: Callable[..., Any], /, **kwargs: Any) -> None:
        """Record the decision `write(**kwargs)` (one of `HOLDABLE`, a method of this recorder) as a held
        decision (`RunChain`: chained now, committed with the run's next write); returns nothing, as the
        decision has no committed sequence yet. A model step that declares tool calls is written at once:
        its calls' rows name its row id."""
        self.chain.hold(self._own(write, HOLDABLE, "held"), kwargs)

    def record_together(self, writes: Sequence[tuple[Callable[..., Any], dict[str, Any]]]) -> list[Any]:
        """Record several decisions (`(method, kwargs)`, each of `HOLDABLE` or `TOGETHER`, methods of this
        recorder) in order, in one transaction with whatever is held, committed before returning. Each
        entry's result is what its method returns when called alone, known once written: the sequence
        number of its last event (None when not written), or the exception it raised (returned in its
        place; a refusal it recorded is written with the others)."""
        own = [(self._own(w, HOLDABLE | TOGETHER, "written together"), kwargs) for w, kwargs in writes]
        return self.chain.together(own)

    def _own(self, write: Callable[..., Any], names: frozenset[str], how: str) -> Callable[..., Any]:
        """`write` when it is one of `names`, a method of this recorder; ValueError otherwise."""
        name = getattr(write, "__name__", "")
        if name not in names or getattr(self, name, None) != write:
            raise ValueError(f"not a decision that can be {how}: {name or write!r}")
        return write

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
        """Rebuild a recorder from what is stored, each part its own state: the chain's head and counts,
        the declared tool calls and tool states (`ToolCalls.restore`), the token ledger.

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
        chain = rec.chain
        chain.reload_head()
        if TraceEvent.objects.filter(run_id=run_id, event_type=EventType.RUN_FINISHED).exists():
            raise ChainFinished(run_id)  # its row was reopened: nothing is chained after the end
        rec.decisions.last_token_at = rec.tools.restore()
        stored = chain.stored_counts()
        chain.expected_events = max(run.expected_events, stored["events"])
        chain.expected_steps = max(run.expected_steps, stored["steps"])
        chain.expected_tools = max(run.expected_tools, stored["tools"])
        chain.expected_reasoning = max(
            chain.expected_steps, AgentReasoningAudit.objects.filter(run_id=run_id).count()
        )
        chain.audit_write_failures = run.audit_write_failures
        rec.ledger.restore(run_id, started=run.model_calls)
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
        return self.chain.write(
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
            found = _IDENTITY.rows(run_id=self.run_id)
            row = dict(zip(_IDENTITY.names(), found[0], strict=True)) if found else None
        except Exception as exc:  # a read for the binding: its failure only costs the binding
            logger.warning("run identity read failed run=%s error=%s", self.run_id, type(exc).__name__)
            recover_connection()
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
            self.chain.update_run("first_model_request", first_model_request_at=self._first_model_request_at)

    def model_call_started(self) -> None:
        """A model call is about to be sent: the run's `model_calls` counts it now, so that a call lost
        with its process shows as one without usage; the first call also stamps
        `first_model_request_at`, in the same update."""
        with self.chain.lock:
            self.ledger.started += 1
            fields: dict[str, Any] = {"model_calls": self.ledger.model_calls}
            if self._first_model_request_at is None:
                self._first_model_request_at = timezone.now()
                fields["first_model_request_at"] = self._first_model_request_at
            self.chain.update_run("model_call_started", **fields)

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
                fields["first_output_latency_ms"] = ms(self._first_output_at - self._created_at)
            self.chain.update_run("first_output", **fields)

    def note_fenced_writes(self) -> int | None:
        """WRITE_FENCED, written by the current lease owner: how many writes of a stale owner the fence
        refused so far (the run's `fenced_writes` counter), when that grew since the last note. Refusals
        after RUN_FINISHED are only counted: nothing is chained after the run's end."""
        with self.chain.lock:
            self.chain.flush()
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
            return self.chain.write(
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
        return self.chain.write(
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
            "last_token_at": self.decisions.last_token_at,
            "release_latency_ms": ms(now - self.decisions.last_token_at)
            if self.decisions.last_token_at
            else None,
        }
        if self._first_output_at is None and content:
            self._first_output_at = now
            fields["first_output_at"] = now
            if self._created_at is not None:
                fields["first_output_latency_ms"] = ms(now - self._created_at)
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
        with self.chain.lock:
            self.tools.close_dangling(status)
            self.chain.flush()  # the reconciliation below reads the usage records
            events: list[ChainEvent] = []
            if status != RunStatus.SUCCESS:
                content = ""
                events += self._withdrawn(status)
            verdict, stored = self.ledger.reconcile(self.run_id)
            fields = self._terminal_fields(
                status=status, content=content, error_code=error_code, error_message=error_message,
                self_evaluation=self_evaluation, verdict=verdict, stored=stored, events=len(events),
            )  # fmt: skip
            events.append(self._run_finished(status, error_code, content, verdict, fields))
            return self._write_terminal(events, fields)

    def _withdrawn(self, status: str) -> list[ChainEvent]:
        """The release recorded before a run that did not succeed, withdrawn (a RELEASE_DECISION event
        with status WITHDRAWN), or nothing when there was none."""
        if self.release_decision is None:
            return []
        withdrawn, self.release_decision = self.release_decision, None
        return [
            ChainEvent(
                Phase.RELEASE,
                EventType.RELEASE_DECISION,
                WITHDRAWN,
                clip(f"{WITHDRAWN}: {withdrawn} withdrawn, the run ended {status}", SUMMARY_CHARS),
                {"decision": None, "withdrawn": withdrawn, "reason": f"run ended {status}"},
            )
        ]

    def _terminal_fields(
        self,
        *,
        status: str,
        content: str,
        error_code: str,
        error_message: str,
        self_evaluation: dict[str, Any] | None,
        verdict: Reconciliation,
        stored: list[CallUsage] | None,
        events: int,
    ) -> dict[str, Any]:
        """The run's terminal row: outcome, timing, token ledger and its verdict, the lease released,
        the counts as the terminal update writes them (`events`: the finish's own events but
        RUN_FINISHED) and, once created and its usage read, its cost."""
        ledger = self.ledger
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
            "expected_events": self.chain.expected_events + events + 1,
            "expected_steps": self.chain.expected_steps,
            "expected_tools": self.chain.expected_tools,
            "self_evaluation": bound_json(self_evaluation) if self_evaluation is not None else None,
        }
        if self._created_at is not None:
            fields["total_duration_ms"] = ms(now - self._created_at)
            if stored is not None:
                fields.update(
                    priced(
                        self.run_id,
                        self.provider,
                        stored,
                        started_calls=ledger.model_calls,
                        at=self._created_at,
                    )
                )
        return fields

    def _run_finished(
        self, status: str, error_code: str, content: str, verdict: Reconciliation, fields: dict[str, Any]
    ) -> ChainEvent:
        """RUN_FINISHED: the outcome, the ledger's totals and verdict, and the terminal row's digest
        (`run/4`) with the counts it carries."""
        ledger = self.ledger
        return ChainEvent(
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
                    "reasoning": self.chain.expected_reasoning,
                },
            },
        )

    def _write_terminal(self, events: list[ChainEvent], fields: dict[str, Any]) -> int | None:
        """RUN_FINISHED is held and commits with the terminal row, in one transaction (each on its own if
        that fails), with the run's stored list facts (`audit.read.list_facts`), decided from the stored
        rows in the transaction of the terminal row (and the review queue's flag, which reads them).
        Returns RUN_FINISHED's sequence number."""
        chain = self.chain
        chain.holding = True
        try:
            chain.write("run_finished", events)
        finally:
            chain.holding = False
        held = chain.held[-1] if chain.held else None
        facts = fact_statements(self.run_id)
        written = chain.update_run("finish", after=facts, **fields)
        sequence_no = held.result if held is not None else None
        if not written and not chain.fenced:
            # The terminal row is the business result: one more try after a failed write.
            written = chain.update_run("finish_retry", after=facts, **fields)
        chain.finished = chain.finished or written
        return sequence_no
