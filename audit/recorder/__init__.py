"""The one write API for decision owners (`RunRecorder`) and the facts they hand it.

* `facts`: what the runtime imports (usage, declared tool calls, retrieval facts, refusals);
* `run`: `RunRecorder`, the one front: construction, takeover (`resume`), run lifecycle and `finish`;
* `decisions`: its routing, model-step, guard and release decisions with the rows each writes;
* `chain`: sequence numbers, hash chain, one write per decision, fail-open accounting;
* `tools`: the tool lifecycle of seed 002;
* `ledger`: the token ledger kept while the run executes;
* `tail`: `append_to_finished_run`, the one write to a run's chain by others than its recorder (reviews,
  reasoning purges and key rotations), under the run row's lock and its current lease epoch;
* `governance`: chained events of reasoning purges and key rotations (outside a run's execution), and
  the global governance chain of access changes (`record_governance_event`).
"""

from audit.recorder.facts import (
    Committed,
    DeclaredToolCall,
    RetrievalFacts,
    ToolCallNotDeclared,
    ToolCallRepeated,
    ToolLifecycleConflict,
    Usage,
    _Event,
)
from audit.recorder.governance import record_governance_event, record_reasoning_change
from audit.recorder.run import DecisionNotRecorded, RunRecorder
from audit.recorder.tail import RunNotFinished, Tail, append_to_finished_run
from audit.recorder.tools import arguments_digest

__all__ = [
    "Committed",
    "DecisionNotRecorded",
    "DeclaredToolCall",
    "RetrievalFacts",
    "RunNotFinished",
    "RunRecorder",
    "Tail",
    "ToolCallNotDeclared",
    "ToolCallRepeated",
    "ToolLifecycleConflict",
    "Usage",
    "_Event",
    "append_to_finished_run",
    "arguments_digest",
    "record_governance_event",
    "record_reasoning_change",
]
