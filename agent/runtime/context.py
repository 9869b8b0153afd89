"""The state one run's stages share while the pipeline executes (in the process holding the lease)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agent.redaction import Redactor
from agent.runtime.cancel import CancelToken
from agent.runtime.canonical import CanonicalStore
from agent.runtime.db import db
from agent.runtime.events import STARTED, DraftEvent, EventSink, ProgressEvent, progress_of
from agent.runtime.llm import ModelClient
from agent.runtime.prompts import DEFAULT_PROMPTS, SystemPrompts
from agent.runtime.replay import ReplaySandbox
from agent.runtime.tools.registry import ToolRegistry
from audit.write import Committed, RunRecorder
from diagnosis.models import ReleaseMode

T = TypeVar("T")
# A decision to hold (`RunRecorder.hold`) in the job of the record that follows it: (method, kwargs).
Held = tuple[Callable[..., Any], dict[str, Any]]


@dataclass(eq=False)
class RunContext:
    """Identity of the run, its recorder, live sink, cancel token, model client, tools, canonical store
    and release policy, plus the few facts stages hand to each other (step numbering, canonical
    degradation, tools currently running, the first-output mark already written).

    Decision owners record through `record`, which also tells the run's listeners what finished
    (`ProgressEvent`s built by `events.progress_of` from what committed), or through `hold` when no
    effect of the run follows the decision before its next record; a model call that starts a stage says
    so to `before_model_request`. Answer text goes through `emit_text`, which sends it only
    under the `draft` release policy."""

    run_id: str
    session_id: str
    query: str
    recorder: RunRecorder
    sink: EventSink
    token: CancelToken
    client: ModelClient
    registry: ToolRegistry
    canonical: CanonicalStore
    release_mode: ReleaseMode = ReleaseMode.VERIFIED
    # Steps taken so far per agent name: each agent counts its own steps 1, 2, … (seed 003).
    step_counts: dict[str, int] = field(default_factory=dict)
    canonical_degraded: bool = False
    running_tools: dict[str, str] = field(default_factory=dict)
    # Evidence ids the run's tools returned and the canonical store accepted, in the order they came.
    gathered_evidence: list[str] = field(default_factory=list)
    first_output_marked: bool = False
    # Whether a call of a tool that requires approval may interrupt the run here (the AI Ops executor's
    # investigation); elsewhere such a call is refused (agent.runtime.approvals).
    approvals_allowed: bool = False
    # A run that is not production work (an experiment's replay): tools that change the world are never
    # executed and no approval is ever asked (agent.runtime.replay). None: production.
    replay: ReplaySandbox | None = None
    # Called once when the run has no model call or tool left, only its last records (the queue worker
    # claims its next run meanwhile: `agent.runtime.worker`). A scheduling hint, never a decision.
    on_finishing: Callable[[], None] | None = None
    # The first model call waits until this is set (a run launched while its predecessor finishes).
    gate: asyncio.Event | None = None
    # The run's redaction of what enters it from outside (agent.redaction): the question's facts
    # preloaded, so the same secret keeps its placeholder in tool input and output.
    redactor: Redactor = field(default_factory=Redactor)
    # The instructions this run sends (the defaults, or an experiment's candidate's): what the run's
    # configuration fingerprint digests (`agent.runtime.configuration`).
    prompts: SystemPrompts = DEFAULT_PROMPTS

    @property
    def asks_approvals(self) -> bool:
        """Whether a call that requires approval may ask for it here: never in a replay."""
        return self.approvals_allowed and self.replay is None

    def finishing(self) -> None:
        """The run is finishing (see `on_finishing`); safe to call more than once."""
        hook, self.on_finishing = self.on_finishing, None
        if hook is not None:
            hook()  # the executor's, which never raises (`executor._Ending.finishing`)

    def __post_init__(self) -> None:
        if self.recorder.committed is None:
            self.recorder.committed = deque()

    def next_step_index(self, agent_name: str) -> int:
        """The next step index of `agent_name` (its first step is 1), counted as taken."""
        self.step_counts[agent_name] = self.step_counts.get(agent_name, 0) + 1
        return self.step_counts[agent_name]

    def steps_taken(self, agent_name: str | None = None) -> int:
        """Model steps `agent_name` took in this run (all agents' steps when None)."""
        if agent_name is None:
            return sum(self.step_counts.values())
        return self.step_counts.get(agent_name, 0)

    async def before_model_request(
        self, stage: str | None = None, *, step_index: int | None = None, agent_name: str | None = None
    ) -> None:
        """A safe point before every model call, which the run's `model_calls` counts as it starts
        (the first one also stamps `first_model_request_at`). With `stage`, the call starts that stage:
        a STARTED progress event tells the run's readers what it now waits for (live only); a model step
        names its agent and the agent's step index. The run's first call waits for its `gate`, if any
        (cancellable), before it is counted."""
        self.token.raise_if_cancelled()
        gate, self.gate = self.gate, None
        if gate is not None and not gate.is_set():
            await self.token.race(gate.wait())
        await db(self.recorder.model_call_started)
        await self.flush_progress()  # of the held decisions that committed with it
        if stage is not None:
            await self.sink.emit(
                ProgressEvent(
                    run_id=self.run_id,
                    stage=stage,
                    status=STARTED,
                    step_index=step_index,
                    agent_name=agent_name,
                )
            )

    async def record(
        self,
        write: Callable[..., T],
        /,
        *,
        held: Held | None = None,
        then_hold: Held | None = None,
        **kwargs: Any,
    ) -> T:
        """Record a decision (`write`, a recorder method, on the database pool), then emit a FINISHED
        progress event for each committed timeline event that finishes a stage. Returns what `write`
        returned. `held`: a decision no effect of the run follows before this one, held first; `then_hold`:
        one that follows this one with no effect between, held after it; each in the same job (as `hold`
        and `record` would in separate jobs of the pool)."""
        if held is None and then_hold is None:
            result = await db(write, **kwargs)
        else:
            result = await db(_with_held, self.recorder, held, write, kwargs, then_hold)
        await self.flush_progress()
        return result

    async def hold(self, write: Callable[..., Any], /, **kwargs: Any) -> None:
        """Record a decision that no effect of the run follows before its next record (a model call
        counted, a tool started, another decision): chained now, committed with that record in one
        transaction (`RunRecorder.hold`; a frame sent meanwhile commits it first). Its progress events
        follow that commit."""
        await db(self.recorder.hold, write, **kwargs)

    async def record_redaction(
        self, source: str, *, tool_call_id: str | None = None, facts: dict[str, Any] | None = None
    ) -> None:
        """REDACTION_APPLIED for what the redactor replaced since its last `take` (or `facts` taken
        already; nothing: no event), and its REDACTION progress frame (kinds and counts only)."""
        facts = facts if facts is not None else self.redactor.take()
        if facts is not None:
            await self.record(
                self.recorder.redaction_applied, source=source, facts=facts, tool_call_id=tool_call_id
            )

    async def flush_progress(self) -> None:
        """Emit the progress of what the recorder committed since the last flush (in commit order)."""
        committed: deque[Committed] | None = self.recorder.committed
        # Pool threads append while this drains (tools record concurrently): deque ops are atomic.
        while committed:
            c = committed.popleft()
            event = progress_of(
                run_id=self.run_id,
                event_type=c.event_type,
                status=c.status,
                details=c.details,
                sequence_no=c.sequence_no,
            )
            if event is not None:
                await self.sink.emit(event)

    @property
    def streams_drafts(self) -> bool:
        return self.release_mode == ReleaseMode.DRAFT

    async def emit_text(self, text: str) -> None:
        """A piece of answer text as the model writes it. Under the `draft` policy it is sent as a
        `DraftEvent` and counted as unverified text delivered (the first one stamps `first_output_at`);
        under `verified` nothing leaves the process before the release."""
        if not text or not self.streams_drafts:
            return
        await self.sink.emit(DraftEvent(run_id=self.run_id, text=text))
        self.recorder.note_draft(len(text))
        if not self.first_output_marked:
            self.first_output_marked = True
            await db(self.recorder.mark_first_output)


def _with_held(
    recorder: RunRecorder,
    held: Held | None,
    write: Callable[..., T],
    kwargs: dict[str, Any],
    then: Held | None,
) -> T:
    """On the pool thread: `held` held (`RunRecorder.hold`), `write(**kwargs)`, then `then` held."""
    if held is not None:
        recorder.hold(held[0], **held[1])
    result = write(**kwargs)
    if then is not None:
        recorder.hold(then[0], **then[1])
    return result
