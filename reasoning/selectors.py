"""Reads of the governed reasoning store.

`get_reasoning_records` returns decrypted content: callers outside this app do not call it but
`access.reasoning_reads.read_reasoning`, which checks `REASONING_PERMISSION` and logs the read before the
content is returned (the API and the admin panel both do, so both log alike).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from core.db_router import reads_from_replica
from reasoning.fields import Ciphertext
from reasoning.models import AgentReasoningAudit, ReasoningAccessLog


@dataclass(frozen=True, slots=True)
class ReasoningRecord:
    """One model call's reasoning record as an auditor reads it.

    `reasoning_content`/`assistant_text` are None when the provider sent none, when the row was purged
    (`purged`), or when no configured key decrypts them (`content_readable` false: the key that encrypted
    the row was removed before `rotate_reasoning_keys` re-encrypted it).
    """

    step_index: int
    agent_name: str
    reasoning_available: bool
    reasoning_content: str | None
    assistant_text: str | None
    content_source: str | None
    content_bytes: int
    purged: bool
    purged_at: dt.datetime | None
    content_readable: bool
    created_at: dt.datetime


@reads_from_replica
def get_reasoning_records(*, run_id: str) -> list[ReasoningRecord]:
    """Every reasoning record of the run in the order the calls were recorded (one query): router
    attempts (`agent_name` `router`), agent steps, semantic guard calls (`semantic_guard`). Agent steps
    have step indexes 1, 2, 3 …; the other calls negative ones (`audit.write.runtime_facts`)."""
    records = []
    for row in AgentReasoningAudit.objects.filter(run_id=run_id).order_by("created_at", "id"):
        reasoning, assistant = row.reasoning_content, row.assistant_text
        readable = not isinstance(reasoning, Ciphertext) and not isinstance(assistant, Ciphertext)
        records.append(
            ReasoningRecord(
                step_index=row.step_index,
                agent_name=row.agent_name,
                reasoning_available=row.reasoning_available,
                reasoning_content=None if isinstance(reasoning, Ciphertext) else reasoning,
                assistant_text=None if isinstance(assistant, Ciphertext) else assistant,
                content_source=row.content_source,
                content_bytes=row.content_bytes,
                purged=row.purged_at is not None,
                purged_at=row.purged_at,
                content_readable=readable,
                created_at=row.created_at,
            )
        )
    return records


def access_log_for_run(*, run_id: str):
    """Who read a run's reasoning, newest first (for the admin and audits of the auditors)."""
    return ReasoningAccessLog.objects.filter(run_id=run_id).order_by("-accessed_at", "-id")
