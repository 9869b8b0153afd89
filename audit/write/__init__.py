"""Writing the record (the write side of `audit`): the one write API for decision owners (`RunRecorder`)
and the facts they hand it, how its writes reach the database, and the writes made after a run
(reviews, feedback, retention purges and legal holds).

* `runtime_facts`: what the runtime imports (usage, declared tool calls, retrieval facts, refusals);
* `run`: `RunRecorder`, the one front over its parts: construction, takeover (`resume`), run lifecycle
  and `finish`; `parts`: how the front shows its parts' methods and values;
* `decisions` (`recorder.decisions`): its routing, model-step, guard and release decisions;
  `decision_rows`: the step and reasoning rows and the events they are made of;
* `chain_writer` (`recorder.chain`, `RunChain`): sequence numbers, hash chain, held decisions, one write
  per decision, fail-open accounting; `rows`: the recorder's table layouts, sealing and row digests;
* `ops`, `table`, `cursor`: the statements each decision becomes; `group_commit`: many runs' decisions
  in one transaction;
* `tools` (`recorder.tools`): the tool lifecycle of seed 002; `tool_facts`: a call's state and the
  facts its terminal writes;
* `approvals` (`recorder.approvals`): calls that wait for a person's decision, the interruption, the
  decision and the resumption;
* `ledger` (`recorder.ledger`): the token ledger kept while the run executes, its reconciliation and
  the run's cost;
* `tail`: `append_to_finished_run`, the one public way anything but the run's own recorder writes to its
  chain (reviews, reasoning purges and key rotations, and every event the registry `audit.events`
  declares `appended`), under the run row's lock, at the head read there and the run's current lease
  epoch; `row_insert` builds the row such an event binds. Nothing outside this package touches a
  recorder's private state;
* `governance`: chained events of reasoning purges and key rotations (outside a run's execution), and
  the global governance chain of access changes (`record_governance_event`);
* `refusal`: a run whose stored chain the service did not write (`ChainNotAuthentic` when a takeover
  finds it) is ended on its row alone (`end_unauthentic_run`), never chained onto;
* `reviews`, `feedback`, `retention`: reviews and reader votes appended to a finished run, retention
  purges and legal holds.
"""

from audit.verify.authenticity import ChainNotAuthentic
from audit.write.approvals import DecisionNotRecorded
from audit.write.governance import record_governance_event, record_reasoning_change
from audit.write.refusal import CHAIN_NOT_AUTHENTIC, RUN_NOT_AUTHENTIC, end_unauthentic_run
from audit.write.rows import row_insert
from audit.write.run import RunRecorder
from audit.write.runtime_facts import (
    ChainEvent,
    Committed,
    DeclaredToolCall,
    RetrievalFacts,
    ToolCallNotDeclared,
    ToolCallRepeated,
    ToolLifecycleConflict,
    Usage,
)
from audit.write.tail import RunNotFinished, Tail, append_to_finished_run
from audit.write.tool_facts import arguments_digest

__all__ = [
    "CHAIN_NOT_AUTHENTIC",
    "RUN_NOT_AUTHENTIC",
    "ChainEvent",
    "ChainNotAuthentic",
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
    "append_to_finished_run",
    "arguments_digest",
    "end_unauthentic_run",
    "record_governance_event",
    "record_reasoning_change",
    "row_insert",
]
