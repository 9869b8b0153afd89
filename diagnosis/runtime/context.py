"""The state one run's stages share while the pipeline executes (in the process holding the lease)."""

from __future__ import annotations

from dataclasses import dataclass, field

from audit.recorder import RunRecorder
from diagnosis.runtime.cancel import CancelToken
from diagnosis.runtime.canonical import CanonicalStore
from diagnosis.runtime.db import db
from diagnosis.runtime.events import DeltaEvent, EventSink
from diagnosis.runtime.llm import ModelClient
from diagnosis.runtime.tools.registry import ToolRegistry


@dataclass(eq=False)
class RunContext:
    """Identity of the run, its recorder, live sink, cancel token, model client, tools and canonical
    store, plus the few facts stages hand to each other (step numbering, canonical degradation, tools
    currently running, the first-output mark already written)."""

    run_id: str
    session_id: str
    query: str
    recorder: RunRecorder
    sink: EventSink
    token: CancelToken
    client: ModelClient
    registry: ToolRegistry
    canonical: CanonicalStore
    step_index: int = 0
    canonical_degraded: bool = False
    running_tools: dict[str, str] = field(default_factory=dict)
    first_output_marked: bool = False

    def next_step_index(self) -> int:
        self.step_index += 1
        return self.step_index

    async def before_model_request(self) -> None:
        """A safe point before every model call, which the run's `model_calls` counts as it starts
        (the first one also stamps `first_model_request_at`)."""
        self.token.raise_if_cancelled()
        await db(self.recorder.model_call_started)

    async def emit_text(self, text: str) -> None:
        """Stream a piece of visible answer text; the first one stamps `first_output_at`."""
        if not text:
            return
        await self.sink.emit(DeltaEvent(run_id=self.run_id, text=text))
        if not self.first_output_marked:
            self.first_output_marked = True
            await db(self.recorder.mark_first_output)
