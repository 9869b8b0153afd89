"""The executor: owns one run from claim to terminal state, whatever happens in between.

`execute_run(run_id=…, sink=…, cancel=…)` claims the run under a fenced lease (`RunNotClaimable`
otherwise, nothing touched), renews it from a heartbeat that also reads cancels, runs the pipeline (or
the AI Ops flow) and ends the run exactly once through `recorder.finish`: SUCCESS, INTERRUPTED (waiting
for approval), CANCELLED or FAILED (`LLM_*`, or `INTERNAL_ERROR` logging only the exception's class).
A lost lease stops the run writing nothing more. Status, content and release always agree.
`prepare_run` creates the PENDING run; `run_to_completion` prepares and executes synchronously.
Details: docs/runtime.md, *Pipeline* and *Run error codes*.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import DatabaseError, transaction

from agent.knowledge.corpus import Corpus, use_corpus
from agent.knowledge.retrieval import reset_override
from agent.redaction import Redactor
from agent.runtime.aiops import is_aiops, run_aiops
from agent.runtime.cancel import CancelToken, RunCancelled
from agent.runtime.canonical import CanonicalStore
from agent.runtime.configuration import configure_run, configured_start, tools_of_start
from agent.runtime.context import RunContext
from agent.runtime.db import db, read, run_blocking
from agent.runtime.events import (
    ErrorEvent,
    EventSink,
    NullSink,
    OutcomeEvent,
    SafeSink,
    ToolEvent,
    run_event,
)
from agent.runtime.llm import LLMError, ModelClient, aclose_clients
from agent.runtime.pipeline import run_pipeline
from agent.runtime.prompts import DEFAULT_PROMPTS, SystemPrompts
from agent.runtime.providers import get_model_client
from agent.runtime.replay import sandbox_of, started_details
from agent.runtime.resume_state import ResumeStateUnavailable, RunHandedOver, RunInterrupted
from agent.runtime.tools.registry import ToolRegistry, default_registry
from audit.models import EventType, ToolStatus, TraceEvent
from audit.write import RUN_NOT_AUTHENTIC, ChainNotAuthentic, RunRecorder, end_unauthentic_run
from diagnosis import services
from diagnosis.models import DEMO_PROVIDER, ChatSession, DiagnosisRun, RunStatus
from diagnosis.selectors import owned_session

logger = logging.getLogger(__name__)

INTERNAL_ERROR = "INTERNAL_ERROR"
LEASE_LOST = "LEASE_LOST"
INTERNAL_ERROR_MESSAGE = "The run failed because of an internal error."
RESUME_STATE_UNAVAILABLE = "RESUME_STATE_UNAVAILABLE"
RESUME_STATE_MESSAGE = "The interrupted run could not be resumed: its saved state is missing or changed."

_OWNER = f"{socket.gethostname()[:60]}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def lease_owner() -> str:
    """This process's lease owner name, `host:pid:uuid`."""
    return _OWNER


class RunNotClaimable(Exception):
    """The run is not PENDING or another process holds its lease."""


class SessionNotFound(Exception):
    """The session does not exist or is not the user's."""


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """How a run ended (what the last `OutcomeEvent` said, plus the error when it failed)."""

    run_id: str
    session_id: str
    status: str
    release_decision: str | None
    content: str
    error_code: str = ""
    error_message: str = ""


# ---------------------------------------------------------------------------------------------------
# Creating runs
# ---------------------------------------------------------------------------------------------------
def prepare_run(
    *,
    user: AbstractBaseUser,
    query: str,
    session_id: str | None = None,
    session: ChatSession | None = None,
    redaction: dict[str, Any] | None = None,
    redacted: bool = False,
) -> DiagnosisRun:
    """A PENDING run of `query` for `user`: in `session` (already looked up by the caller), in their
    session `session_id`, or in a new session. `InvalidQuery` (a ValueError) for a query that
    `services.validate_query` refuses; `SessionNotFound` when `session_id` is not one of the user's.
    The question is redacted (`agent.redaction`) before anything stores it: the run keeps the redacted
    text and the facts of what was replaced (its recorder chains them as REDACTION_APPLIED). `redacted`:
    the caller validated and redacted `query` already (`validate_query`, then `redact_query`, before
    taking a lock: `surfaces.chat.service.start_chat`) and passes its facts as `redaction`; the query is
    then validated once, as the user sent it, never again as redacted.

    No savepoint of its own: inside a caller's transaction (the chat's, under the user's row lock) an
    error rolls that whole transaction back; alone, it is its own transaction."""
    if not redacted:
        query, redaction = redact_query(services.validate_query(query))
    with transaction.atomic(savepoint=False):
        if session is None and session_id:
            session = owned_session(user=user, session_id=session_id)
            if session is None:
                raise SessionNotFound(session_id)
        if session is None:
            session = services.create_session(owner=user)
        return services.create_run(session=session, query=query, redaction=redaction)


def redact_query(query: str) -> tuple[str, dict[str, Any] | None]:
    """`query` redacted by a fresh redactor, and the facts of what it replaced (None: nothing)."""
    redactor = Redactor()
    return redactor.redact(query), redactor.take()


def known_redactions(run: DiagnosisRun, *, resuming: bool = False) -> list[dict[str, Any]]:
    """What the run's redaction already replaced (its question's facts; for a resumed run also every
    REDACTION_APPLIED of its chain), so a secret met again keeps its placeholder."""
    known = list((run.redaction or {}).get("items") or [])
    if resuming:
        rows = TraceEvent.objects.filter(
            run_id=run.run_id, event_type=EventType.REDACTION_APPLIED
        ).values_list("details", flat=True)
        known += [item for details in rows for item in (details or {}).get("items") or []]
    return known


def run_to_completion(
    *,
    user: AbstractBaseUser,
    query: str,
    session_id: str | None = None,
    sink: EventSink | None = None,
    client: ModelClient | None = None,
) -> RunOutcome:
    """Synchronous convenience (management commands): prepare the run and execute it to the end."""
    run = prepare_run(user=user, query=query, session_id=session_id)

    async def main() -> RunOutcome:
        try:
            return await execute_run(run_id=run.run_id, sink=sink or NullSink(), client=client)
        finally:
            await aclose_clients()

    return asyncio.run(main())


# ---------------------------------------------------------------------------------------------------
# Lease
# ---------------------------------------------------------------------------------------------------
async def _heartbeat(run_id: str, epoch: int, token: CancelToken, *, claimed_at: float) -> None:
    """Renew the lease held as (this process, `epoch`) until cancelled. A renewal that cannot reach the
    database is retried while the lease last renewed still holds; past its expiry (a sweeper may have
    taken the run) the run's work is cancelled with `lease_lost`, as when another claim is found."""
    seconds = services.lease_seconds()
    interval = max(0.05, seconds / 3)
    # Measured from before the request that set it (`claimed_at` for the claim itself, monotonic): never
    # later than the expiry the database holds.
    held_until = claimed_at + seconds
    while True:
        await asyncio.sleep(interval)
        asked = time.monotonic()
        try:
            state = await db(services.renew_lease, run_id=run_id, owner=_OWNER, epoch=epoch)
        except DatabaseError as exc:
            logger.warning("lease renewal failed run=%s error=%s", run_id, type(exc).__name__)
            if time.monotonic() < held_until:
                continue
            state = "lost"
        else:
            if state != "lost":
                held_until = asked + seconds
        if state == "cancel":
            token.cancel("cancel requested")
        elif state == "lost":
            logger.warning("lease lost run=%s", run_id)
            token.cancel("lease lost", lease_lost=True)
            return


def _trip_on_fence(recorder: RunRecorder, token: CancelToken) -> None:
    """After a fenced write (called on the writing thread), cancel the run's work on its event loop."""
    loop = asyncio.get_running_loop()
    trip = functools.partial(token.cancel, "lease lost", lease_lost=True)

    def on_fenced() -> None:
        if not loop.is_closed():
            loop.call_soon_threadsafe(trip)

    recorder.on_fenced = on_fenced


# ---------------------------------------------------------------------------------------------------
# Execution
# ---------------------------------------------------------------------------------------------------
async def execute_run(
    *,
    run_id: str,
    sink: EventSink,
    cancel: CancelToken | None = None,
    client: ModelClient | None = None,
    registry: ToolRegistry | None = None,
    claimed: DiagnosisRun | None = None,
    on_finishing: Callable[[], None] | None = None,
    gate: asyncio.Event | None = None,
    run_prompts: SystemPrompts = DEFAULT_PROMPTS,
    corpus: Corpus | None = None,
    replay_of: str = "",
) -> RunOutcome:
    """Claim and execute the run to its terminal state (see the module docstring). `claimed` is the run
    as this process already claimed it (a queue worker claims while it picks: `claim_next_queued`).
    `on_finishing` is called once, on the event loop, when the run has no model call or tool left and
    only writes its last records (after the semantic guard's call, at the latest when the release or the
    run's end is recorded; the queue worker claims its next run meanwhile); it changes nothing
    the run records or when. `gate`: the run's first model call waits until it is set (a queue worker's
    run claimed while another finishes records its start meanwhile). `corpus`: a runbook folder that
    replaces the knowledge base for this run (an experiment's candidate; `agent.knowledge.corpus`).
    `run_prompts`: the instruction
    texts the run sends (an experiment's candidate's; by default the product's). The run's
    configuration (`agent.runtime.configuration`) is built from `client`, `registry`, `run_prompts`
    and the release policy, and chained in RUN_STARTED with its fingerprint. `replay_of`: the run an
    experiment's replay replays (a run not of production purpose is sandboxed: `agent.runtime.replay`)."""
    knowledge = use_corpus(corpus) if corpus is not None else None
    try:
        return await _execute(
            run_id=run_id,
            sink=sink,
            cancel=cancel,
            client=client,
            registry=registry,
            claimed=claimed,
            on_finishing=on_finishing,
            gate=gate,
            run_prompts=run_prompts,
            corpus=corpus,
            replay_of=replay_of,
        )
    finally:
        if knowledge is not None:
            reset_override(knowledge)


async def _execute(
    *,
    run_id: str,
    sink: EventSink,
    cancel: CancelToken | None,
    client: ModelClient | None,
    registry: ToolRegistry | None,
    claimed: DiagnosisRun | None,
    on_finishing: Callable[[], None] | None,
    gate: asyncio.Event | None,
    run_prompts: SystemPrompts,
    corpus: Corpus | None,
    replay_of: str,
) -> RunOutcome:
    token = cancel if cancel is not None else CancelToken()
    claimed_at = time.monotonic()
    run = await _claim(run_id, claimed, token)
    out = sink if isinstance(sink, SafeSink) else SafeSink(sink, run_id=run_id)
    # A run that started before and is PENDING again was interrupted for an approval and decided: it is
    # resumed (its recorder rebuilt from the store, fenced by this claim's epoch), not started again.
    resuming = run.started_at is not None
    recorder = await _recorder_of(run, resuming=resuming)
    _trip_on_fence(recorder, token)
    heartbeat = asyncio.create_task(
        _heartbeat(run_id, run.lease_epoch, token, claimed_at=claimed_at), name=f"lease:{run_id}"
    )
    ending = _Ending(
        run=run, recorder=recorder, sink=out, token=token, heartbeat=heartbeat, hint=on_finishing
    )
    out.before_emit = ending.commit_held
    try:
        try:
            ctx = await _start(
                run, recorder, out, token, ending, client=client, registry=registry, gate=gate,
                run_prompts=run_prompts, corpus=corpus, resuming=resuming, replay_of=replay_of,
            )  # fmt: skip
            if is_aiops(run.agent_flow):
                result = await run_aiops(ctx, created_at=run.created_at, resuming=resuming)
            else:  # a chat run resumes only after a handover (`agent.runtime.drain`)
                result = await run_pipeline(ctx, created_at=run.created_at, resuming=resuming)
        except RunInterrupted as interrupted:
            return await ending.interrupted(interrupted)
        except ResumeStateUnavailable:
            return await ending.failed(RESUME_STATE_UNAVAILABLE, RESUME_STATE_MESSAGE)
        except RunCancelled:
            return await ending.cancelled()
        except LLMError as exc:
            return await ending.failed(exc.code, exc.message)
        except asyncio.CancelledError:
            token.cancel("the executing task was cancelled")
            with contextlib.suppress(Exception):
                await asyncio.shield(ending.cancelled())
            raise
        except Exception as exc:
            logger.error("run failed run=%s error=%s", run_id, type(exc).__name__)
            return await ending.failed(INTERNAL_ERROR, INTERNAL_ERROR_MESSAGE)
        return await ending.succeeded(result.release_decision, result.content, result.self_evaluation)
    finally:
        heartbeat.cancel()
        out.before_emit = None  # nothing held any more; the run is freed now, not by a full collection


async def _claim(run_id: str, claimed: DiagnosisRun | None, token: CancelToken) -> DiagnosisRun:
    """The run this process now holds the lease of (claimed here unless the caller did); a run cancelled
    while it waited stops at the first safe point. RunNotClaimable when it cannot be claimed."""
    if claimed is not None:
        if claimed.run_id != run_id or claimed.lease_owner != _OWNER:
            raise RunNotClaimable(run_id)
        run = claimed
    else:
        run = await db(services.claim_run, run_id=run_id, owner=_OWNER)
    if run is None:
        raise RunNotClaimable(run_id)
    if run.cancel_requested:
        token.cancel("cancel requested")
    return run


async def _recorder_of(run: DiagnosisRun, *, resuming: bool) -> RunRecorder:
    """The run's recorder, new or (`resuming`) rebuilt from the store. A run row or chain this service
    did not write is ended on its row alone and never executed (RunNotClaimable; issue 43)."""
    if not services.created_by_the_service(run):  # a row a database writer inserted or changed
        await db(end_unauthentic_run, run.run_id, lease_epoch=run.lease_epoch, code=RUN_NOT_AUTHENTIC)
        raise RunNotClaimable(run.run_id)
    try:
        return (
            await db(RunRecorder.resume, run.run_id, lease_epoch=run.lease_epoch)
            if resuming
            else RunRecorder.for_run(run)
        )
    except ChainNotAuthentic as refused:
        # Its chain was not written by this service, or already ends the run (its row was reopened):
        # nothing is chained after it, nothing executes.
        await db(end_unauthentic_run, run.run_id, lease_epoch=run.lease_epoch, code=refused.code)
        raise RunNotClaimable(run.run_id) from None


async def _start(
    run: DiagnosisRun,
    recorder: RunRecorder,
    out: SafeSink,
    token: CancelToken,
    ending: _Ending,
    *,
    client: ModelClient | None,
    registry: ToolRegistry | None,
    gate: asyncio.Event | None,
    run_prompts: SystemPrompts,
    corpus: Corpus | None,
    resuming: bool,
    replay_of: str = "",
) -> RunContext:
    """RUN_STARTED (RUN_RESUMED when `resuming`) naming the run's provider, models, the tools offered (a
    new run's: those that can run now, `ToolRegistry.offered`; a resumed run's: the same as at its start)
    and (new runs) configuration, and its frame, then the run's context; an error of the set-up is
    raised after that record, so the run still reads in order."""
    sandbox = sandbox_of(run, replay_of=replay_of)
    details: dict[str, Any] = {"leaseOwner": _OWNER, "purpose": run.purpose, **started_details(sandbox)}
    mode = services.release_mode()
    if resuming:
        mode = recorder.release_mode or mode
    setup_error: Exception | None = None
    configure: Callable[[], Any] | None = None
    try:  # the model client and tool registry, and a new run's configuration chained with its fingerprint
        client = client if client is not None else get_model_client()
        registry = registry if registry is not None else default_registry(flow=run.agent_flow)
        left_out: dict[str, str] = {}  # tools whose backend cannot run them are not offered
        if resuming:
            started_with = await read(tools_of_start, run.run_id)
            registry = registry.only(started_with) if started_with is not None else registry
        else:
            offered = registry.offered  # on the tool pool only when a tool's availability is checked
            registry, left_out = await run_blocking(offered) if registry.checks_availability() else offered()
        roles = client.roles
        details.update(
            provider=client.provider,
            models={"router": roles.router, "agent": roles.agent, "guard": roles.guard},
            tools=registry.names(),
        )
        if not resuming:
            configure = functools.partial(
                configure_run,
                client=client,
                registry=registry,
                flow=run.agent_flow,
                release_mode=mode,
                prompts_in_use=run_prompts,
                knowledge=corpus.snapshot if corpus is not None else None,
                left_out=left_out,
            )
    except Exception as exc:  # reported after RUN_STARTED, so the run still reads in order
        setup_error = exc
    if resuming:
        seq = await db(recorder.run_resumed, details={**details, "leaseEpoch": run.lease_epoch})
    else:
        start = functools.partial(recorder.run_started, agent_flow=run.agent_flow, release_mode=mode)
        started, seq, configure_error = await db(configured_start, configure, start, details)
        if not started:  # RUN_STARTED in a job of its own, on a connection checked again
            setup_error, seq = configure_error or setup_error, await db(start, details=details)
    await out.emit(run_event(run, sequence_no=seq, demo=details.get("provider") == DEMO_PROVIDER))
    if setup_error is not None:
        raise setup_error
    ctx = RunContext(
        run_id=run.run_id,
        session_id=run.session_id,
        query=run.query,
        recorder=recorder,
        sink=out,
        token=token,
        client=client,
        registry=registry,
        canonical=CanonicalStore(run.run_id),
        release_mode=mode,
        prompts=run_prompts,
        replay=sandbox,
        on_finishing=ending.finishing,
        gate=gate,
        redactor=Redactor(
            known=await read(known_redactions, run, resuming=True) if resuming else known_redactions(run)
        ),
    )
    ending.ctx = ctx
    if run.redaction and not resuming:
        source = "alert" if is_aiops(run.agent_flow) else "question"
        await ctx.record(recorder.redaction_applied, source=source, facts=run.redaction)
    return ctx


@dataclass(eq=False)
class _Ending:
    """The one way a claimed run ends; each path writes the terminal state once, then the outcome."""

    run: DiagnosisRun
    recorder: RunRecorder
    sink: SafeSink
    token: CancelToken
    heartbeat: asyncio.Task
    ctx: RunContext | None = None
    done: bool = False
    hint: Callable[[], None] | None = None

    def finishing(self) -> None:
        """Tell `execute_run`'s `on_finishing` (once) that only the run's last records remain."""
        hint, self.hint = self.hint, None
        if hint is None:
            return
        try:
            hint()
        except Exception as exc:  # a scheduling hint must never cost the run
            logger.error("finishing hint failed run=%s error=%s", self.run.run_id, type(exc).__name__)

    def _outcome(self, status: str, release: str | None, content: str, code: str = "", message: str = ""):
        return RunOutcome(
            run_id=self.run.run_id,
            session_id=self.run.session_id,
            status=status,
            release_decision=release,
            content=content,
            error_code=code,
            error_message=message,
        )

    async def _emit_outcome(self, outcome: RunOutcome, seq: int | None) -> RunOutcome:
        await self.sink.emit(
            OutcomeEvent(
                run_id=outcome.run_id,
                status=outcome.status,
                release_decision=outcome.release_decision,
                content=outcome.content,
                sequence_no=seq,
            )
        )
        return outcome

    async def commit_held(self) -> None:
        """The run's held decisions (`RunContext.hold`) commit now, then their progress frames: before
        any frame leaves and before the run's end is written (as if each had been written at once)."""
        if self.recorder.holds():
            await db(self.recorder.flush)
            if self.ctx is not None:
                await self.ctx.flush_progress()

    def _fenced(self) -> bool:
        """Another process claimed the run (the heartbeat or a refused write found out): end quietly."""
        return self.token.lease_lost or self.recorder.fenced

    async def succeeded(
        self, release: str, content: str, self_evaluation: dict[str, Any] | None = None
    ) -> RunOutcome:
        self.heartbeat.cancel()
        self.finishing()
        await self.commit_held()
        self.done = True
        if self._fenced():
            return await self._lease_lost()
        seq = await db(
            self.recorder.finish, status=RunStatus.SUCCESS, content=content, self_evaluation=self_evaluation
        )
        return await self._emit_outcome(self._outcome(RunStatus.SUCCESS, release, content), seq)

    async def failed(self, code: str, message: str) -> RunOutcome:
        self.heartbeat.cancel()
        self.finishing()
        await self.commit_held()
        self.done = True
        if self._fenced():
            return await self._lease_lost()
        seq = await db(self.recorder.finish, status=RunStatus.FAILED, error_code=code, error_message=message)
        await self.sink.emit(ErrorEvent(code=code, message=message, run_id=self.run.run_id))
        return await self._emit_outcome(self._outcome(RunStatus.FAILED, None, "", code, message), seq)

    async def interrupted(self, interrupted: RunInterrupted) -> RunOutcome:
        """Calls wait for approval: RUN_INTERRUPTED, the run INTERRUPTED and its lease released in one
        write; no outcome frame (the run is not over: a resumed attempt sends it). Handed over
        (`RunHandedOver`): the same event says so, and the run is PENDING for another process."""
        self.heartbeat.cancel()
        await self.commit_held()
        self.done = True
        if self._fenced():
            return await self._lease_lost()
        if isinstance(interrupted, RunHandedOver):
            claim_by = services.handover_claim_by(agent_flow=self.run.agent_flow)
            await db(self.recorder.hand_over, claim_by=claim_by, **interrupted.record(lease_owner=_OWNER))
            return self._outcome(RunStatus.PENDING, None, "")
        self.finishing()
        await db(
            self.recorder.interrupt,
            pending=interrupted.pending,
            kept=interrupted.kept,
            checkpoint_sha256=interrupted.checkpoint_sha256,
            reason="tool call(s) wait for approval",
        )
        return self._outcome(RunStatus.INTERRUPTED, None, "")

    async def cancelled(self) -> RunOutcome:
        self.heartbeat.cancel()
        self.finishing()
        await self.commit_held()
        if self.done:
            return self._outcome(RunStatus.CANCELLED, None, "")
        self.done = True
        if self._fenced():
            return await self._lease_lost()
        running = dict(self.ctx.running_tools) if self.ctx is not None else {}
        sequences = await db(
            self.recorder.close_tools,
            status=ToolStatus.INTERRUPTED,
            error_code="RUN_CANCELLED",
            error_message="the run was cancelled while the tool was running",
        )
        for tool_call_id, name in running.items():
            await self.sink.emit(
                ToolEvent(
                    run_id=self.run.run_id,
                    tool_call_id=tool_call_id,
                    name=name,
                    status=ToolStatus.INTERRUPTED,
                    sequence_no=sequences.get(tool_call_id),
                )
            )
        await db(self.recorder.run_cancelled, reason=self.token.reason or "cancel requested")
        seq = await db(self.recorder.finish, status=RunStatus.CANCELLED)
        return await self._emit_outcome(self._outcome(RunStatus.CANCELLED, None, ""), seq)

    async def _lease_lost(self) -> RunOutcome:
        """Another process took the run: write nothing, report what the database says now."""
        message = "The run was taken over by another process."
        await self.sink.emit(ErrorEvent(code=LEASE_LOST, message=message, run_id=self.run.run_id))
        runs = DiagnosisRun.objects.filter(run_id=self.run.run_id).values(
            "status", "release_decision", "content"
        )
        row: dict[str, Any] = await db(lambda: runs.first() or {})
        status = row.get("status") or RunStatus.FAILED
        release = row.get("release_decision") if status == RunStatus.SUCCESS else None
        content = row.get("content", "") if status == RunStatus.SUCCESS else ""
        return await self._emit_outcome(self._outcome(status, release, content, LEASE_LOST, message), None)
