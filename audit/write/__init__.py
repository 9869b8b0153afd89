"""Writing the record (the write side of `audit`): the one write API for decision owners (`RunRecorder`)
and the facts they hand it, how its writes reach the database, and the writes made after a run
(reviews, feedback, retention purges and legal holds).

`append_to_finished_run` (`tail`) is the one public way anything but a run's own recorder writes to its
chain; `record_governance_event` writes the global governance chain. Nothing outside this package
touches a recorder's private state. Its modules: docs/architecture.md, *The recorder (`audit/write/`)*.
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
