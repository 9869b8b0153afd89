"""Reading the record (the read side of `audit`): read models, one module each, plus the dashboard's
aggregates (`dashboard`), the stored list facts' rule (`list_facts`) and the paging rule of many runs
(`chunks`):

* `trace`: one run's record aggregated at read time (`get_trace` → `Trace`);
* `summary`: what that record proves (`summarize` → `TraceSummary`: counts, chain, row digests, anchor,
  token reconciliation);
* `batches`: the traces of many runs, a chunk at a time (`iter_traces`);
* `session`: a session's newest model-step and tool records (`get_session_audits`);
* `chat`: the stored events a chat follower replays as frames (`chat_timeline`, `finished_by`).

The names below are re-exported so that `from audit.read import get_trace` keeps working.
"""

from audit.read.batches import EXPORT_CHUNK, iter_traces
from audit.read.chat import ChatTimelineRow, chat_timeline, finished_by
from audit.read.session import (
    SESSION_AUDITS_LIMIT,
    AuditKind,
    AuditRecord,
    SessionAudits,
    get_session_audits,
)
from audit.read.summary import AnchorView, Counts, TraceSummary, reconcile_trace, summarize
from audit.read.trace import (
    DEMO_PROVIDER,
    CallCostView,
    ProviderLabel,
    ReviewView,
    StoredEvent,
    Trace,
    anchored_leaf,
    anchored_leaves,
    call_costs_of,
    get_trace,
    provider_of,
    review_views,
    timeline_of,
)

__all__ = [
    "DEMO_PROVIDER",
    "EXPORT_CHUNK",
    "SESSION_AUDITS_LIMIT",
    "AnchorView",
    "AuditKind",
    "AuditRecord",
    "CallCostView",
    "ChatTimelineRow",
    "Counts",
    "ProviderLabel",
    "ReviewView",
    "SessionAudits",
    "StoredEvent",
    "Trace",
    "TraceSummary",
    "anchored_leaf",
    "anchored_leaves",
    "call_costs_of",
    "chat_timeline",
    "finished_by",
    "get_session_audits",
    "get_trace",
    "iter_traces",
    "provider_of",
    "reconcile_trace",
    "review_views",
    "summarize",
    "timeline_of",
]
