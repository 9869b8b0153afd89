"""Every stored byte of the audited tables accounted for: what covers each column, or why none does.

The one registry of issue 30 item 3: each concrete field of every audited model is either covered
(`COVERED`: a row digest, the run's chain, the governance chain or the signed log, all reachable from a
signed checkpoint) or excluded with its reason (`EXCLUDED`); `ROWS` / `ROWS_EXCLUDED` say how a deleted
or forged row is caught, or why not. `tests/audit/test_tamper_matrix.py` is generated from it, and
`markdown_table` prints the table of docs/audit-integrity.md.
Details: docs/audit-integrity.md, *Coverage: every stored byte accounted for*.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import models

from audit.models import (
    AgentStep,
    Checkpoint,
    CheckpointCosignature,
    GovernanceEvent,
    LegalHold,
    LogHead,
    LogLeaf,
    LogNode,
    RunReview,
    RunTombstone,
    TailPending,
    ToolInvocation,
    TraceEvent,
    WitnessAttempt,
)
from audit.verify import row_digests
from diagnosis.models import (
    AiOpsAlert,
    ChatSession,
    DiagnosisRun,
    KnowledgeChunk,
    KnowledgeDocument,
    RunConfiguration,
    RunFeedback,
)
from reasoning.models import AgentReasoningAudit, ReasoningAccessLog

SURROGATE = "database-assigned surrogate key: no form binds it; rows are named by their run-scoped keys"


def _by_forms(*forms: row_digests.Form) -> dict[str, str]:
    """Field name → the forms binding it (the newest form first), from the forms' own column lists."""
    covered: dict[str, list[str]] = {}
    for form in forms:
        for field in form.fields.values():
            covered.setdefault(field.name, []).append(form.name)
    return {name: "row digest: " + " / ".join(names) for name, names in covered.items()}


def _same(fields: Iterable[str], by: str) -> dict[str, str]:
    return dict.fromkeys(fields, by)


_CHAIN = "chain: hashed into the event's link (audit.verify.hash_chain.event_payload)"
_GOVERNANCE_CHAIN = "governance chain: hashed into the event's link (governance_payload)"

_TAG = (
    "write tag: must verify with a write key (core.writeauth, audit.verify.authenticity.tag_verdict); "
    "untagged only where a signed leaf of before write authentication vouches for the link"
)
_HOLD_CHAIN = (
    "governance chain: must repeat the chained LEGAL_HOLD_PLACED / LEGAL_HOLD_LIFTED events (holdId, "
    "scope, targetId, actor, createdAt, reasonSha256), from which the holds are rebuilt"
)


COVERED: dict[type[models.Model], dict[str, str]] = {
    DiagnosisRun: {
        **_by_forms(row_digests.RUN, row_digests.RUN_START),
        "config_fingerprint": (
            "chain: must equal the configFingerprint of the run's chained RUN_STARTED (derived from "
            "the signed record; '' when it carries none), itself the SHA-256 of the chained "
            "configuration document"
        ),
        "purpose": (
            "chain: must equal the purpose of the run's chained RUN_STARTED ('production' when it carries "
            "none): an experiment replay cannot pass as production, nor the reverse"
        ),
        "created_tag": (
            "creation tag: must verify, with a write key, over the run's identity as the service created it "
            "(diagnosis.services.identity_digest); a run without one is never executed"
        ),
    },
    ChatSession: _by_forms(row_digests.SESSION),
    TraceEvent: {
        **_same(
            (
                "run",
                "session_id",
                "sequence_no",
                "phase",
                "event_type",
                "status",
                "summary",
                "details",
                "created_at",
            ),
            _CHAIN,
        ),
        "prev_hash": "chain: must be the previous event's hash",
        "hash": "chain: recomputed from the event; the newest anchored head is in the run's leaf",
        "tag": _TAG,
    },
    AgentStep: _by_forms(row_digests.STEP),
    ToolInvocation: _by_forms(row_digests.TOOL),  # approvals: the same row through its lifecycle
    AgentReasoningAudit: _by_forms(row_digests.REASONING),
    RunReview: _by_forms(row_digests.REVIEW),
    ReasoningAccessLog: _by_forms(row_digests.READ),
    RunConfiguration: {
        "fingerprint": (
            "configuration: the SHA-256 of the canonical text, and named by a run's chained RUN_STARTED "
            "(audit.verify.configurations)"
        ),
        "canonical": "configuration: its SHA-256 is the fingerprint",
        "document": "configuration: must be the canonical text decoded",
        "prompts": "configuration: each text must hash to the document's prompt digest of its role",
    },
    GovernanceEvent: {
        **_same(
            (
                "sequence_no",
                "event_type",
                "actor",
                "subject_user",
                "group",
                "permission",
                "details",
                "created_at",
            ),
            _GOVERNANCE_CHAIN,
        ),
        "prev_hash": "governance chain: must be the previous event's hash",
        "hash": "governance chain: recomputed; the anchored heads are governance leaves",
        "tag": _TAG,
    },
    LogLeaf: {
        "leaf_index": "checkpoint: the leaf's position under the signed root",
        "leaf_hash": "checkpoint: the signed root is the Merkle hash of the leaf hashes",
        "data": "checkpoint: its RFC 9162 hash is the leaf hash",
        "run_id": "leaf data: must equal the signed runId of a run leaf (NULL for the other kinds)",
        "tail_of": "leaf data: must equal the signed runId of a run-tail leaf (NULL for the other kinds)",
        "session_id": "leaf data: must equal the signed sessionId ('' for a governance leaf)",
        "governance_sequence_no": "leaf data: must equal the signed lastSequenceNo of a governance leaf",
    },
    LogNode: _same(("level", "node_index", "hash"), "checkpoint: recomputed from the signed leaves"),
    LogHead: _same(("tree_size", "root_hash"), "checkpoint: must equal the newest signed checkpoint"),
    Checkpoint: {
        "body": "checkpoint: the signed text (Ed25519 signature)",
        "signature": "checkpoint: verified with a known key",
        "link": "checkpoint: a plain checkpoint's signed link, which must name its body's hash",
        "link_signature": "checkpoint: verified with the key that signed the body",
        "tree_size": "checkpoint: must equal the signed body",
        "root_hash": "checkpoint: must equal the signed body and the stored leaves' root",
        "previous_hash": "checkpoint: must equal the signed link (or body) and the previous one's hash",
        "key_id": "checkpoint: must equal the signed body",
        "checkpoint_hash": "checkpoint: the hash of the signed link (or body)",
        "signed_at": "checkpoint: must equal the signed link's (or body's) time",
    },
    RunTombstone: {
        "run_id": "leaf data: must name a signed run leaf whose run is gone",
        "leaf_index": "leaf data: must be that run's leaf",
        "session_id": "leaf data: must equal the signed sessionId",
        "purged_at": (
            "governance chain: must equal the time of the AUDIT_RUNS_PURGED event naming the run, which must "
            "come after its retention and outside every chained hold"
        ),
    },
    LegalHold: {
        **_same(
            (
                "scope",
                "target_id",
                "reason",
                "placed_by_username",
                "placed_at",
                "lifted_by_username",
                "lifted_at",
                "lift_reason",
            ),
            _HOLD_CHAIN,
        ),
    },
}

_LEASE = "lease and fencing state of the execution (who runs it now, until when): operational"
_TIMING = (
    "timing of the execution, shown in lists: the evidence of when is each chained event's createdAt "
    "(RUN_STARTED, the model steps, RUN_FINISHED; run/4 binds finished_at)"
)
_FACT = "stored list fact: recomputed from the bound rows by verify_audit and compared (FACTS)"
_COST = "the run's cost: recomputed from the chained usage records by verify_audit and compared (FACTS)"
_REVIEW_FACT = (
    "stored review fact: recomputed by verify_audit from the chain (the newest review row, bound by "
    "REVIEW_RECORDED; the readers' newest votes, FEEDBACK_RECORDED) and compared (FACTS)"
)
_QUEUE_FACT = (
    "stored list fact: the review queue's rule (diagnosis.review_queue) recomputed by verify_audit over the "
    "run's columns, themselves bound or compared with the chain, and compared (FACTS)"
)
_CLAIM = (
    "a reviewer's claim on a queued run, keeping others off it for a while (operational): it decides no "
    "review; the review itself is chained"
)

EXCLUDED: dict[type[models.Model], dict[str, str]] = {
    DiagnosisRun: {
        "id": SURROGATE,
        **_same(
            ("started_at", "first_model_request_at", "first_output_at", "total_duration_ms"),
            _TIMING,
        ),
        "first_output_latency_ms": _TIMING,
        "audit_write_failures": (
            "a counter of lost audit writes, also incremented after the terminal digest; lowering it "
            "hides nothing (every lost write is a stored count below the chained expected counts), "
            "raising it fails verification"
        ),
        **_same(("persisted_events", "persisted_steps", "persisted_tools", "audit_complete"), _FACT),
        **_same(("cost", "cost_status", "cost_unpriced_calls"), _COST),
        **_same(("downvoted", "review_verdict", "reviewed_at"), _REVIEW_FACT),
        "needs_review": _QUEUE_FACT,
        **_same(("review_claimed_by", "review_claim_expires_at"), _CLAIM),
        **_same(("lease_owner", "lease_expires_at", "lease_epoch", "cancel_requested"), _LEASE),
        "fenced_writes": (
            "a counter of refused writes of a stale lease owner; the current owner chains it in WRITE_FENCED"
        ),
        "redaction": (
            "the question's redaction facts (kinds, counts, placeholders, keyed HMACs; never an original) "
            "handed to the run's recorder, which chains them in REDACTION_APPLIED after RUN_STARTED: the "
            "chained event is the evidence, this column is read only to write it"
        ),
        "updated_at": "the row's last write time (auto_now): operational",
    },
    ChatSession: {
        "id": SURROGATE,
        "title": "the conversation's label, editable by its owner: no evidence of any run",
        "updated_at": "the row's last write time (auto_now): operational",
        "run_count": "stored list fact of the session list, derived from the session's runs (each bound)",
        "purpose": (
            "whether the session holds an experiment's replays (lists leave such sessions out): a copy of "
            "its runs' purpose, each chained in their RUN_STARTED and verified"
        ),
        "last_run_at": "stored list fact of the session list, derived from the session's runs (each bound)",
    },
    TraceEvent: {"id": SURROGATE},
    AgentStep: {"id": SURROGATE},
    ToolInvocation: {"id": SURROGATE},
    AgentReasoningAudit: {"id": SURROGATE},
    RunReview: {
        "id": SURROGATE,
        "reviewer": (
            "the reviewer's user id (set NULL when the user is deleted); the username snapshot is bound"
        ),
    },
    GovernanceEvent: {"id": SURROGATE},
    ReasoningAccessLog: {
        "id": (
            "the key its chained REASONING_READ names (logId): a changed id is a named deletion and a named "
            "forged row"
        ),
        "user": "the reader's user id (set NULL when the account is removed); the username snapshot is bound",
    },
    RunConfiguration: {
        "id": SURROGATE,
        "created_at": "when the configuration was first stored: operational (each run chains its start)",
    },
    LogLeaf: {
        "id": SURROGATE,
        "appended_at": (
            "when the row was written: not signed (the covering checkpoint's signed time bounds it)"
        ),
    },
    LogNode: {"id": SURROGATE},
    LogHead: {
        "id": "the one row's fixed key (1)",
        "scan_from": (
            "the appender's search cursor, only an optimisation: the server's checkpointer searches every "
            "run at start and every AUDIT_CHECKPOINT_FULL_SCAN_EVERY checkpoints (manage.py audit_checkpoint "
            "always), and a finished run not anchored within AUDIT_ANCHOR_DEADLINE_SECONDS is a problem"
        ),
        "updated_at": "the row's last write time: operational",
    },
    Checkpoint: {"id": SURROGATE},
    RunTombstone: {
        "id": SURROGATE,
        "finished_at": "a display copy of the signed finishedAt: the retention check reads the leaf's",
        "retention_days": (
            "the purge's setting, repeated in its chained AUDIT_RUNS_PURGED event (retentionDays)"
        ),
        "reason": "descriptive text written by the purge: decides nothing",
        "purged_by": "the purging actor, repeated in its chained AUDIT_RUNS_PURGED event (actor)",
        "rows_deleted": "counts of the rows the purge deleted: the rows are gone, the counts prove nothing",
    },
    LegalHold: {
        "id": (
            "the key its chained events name (holdId): a row whose id changed is a named deletion of the "
            "chained hold and a named forged row (see the rows)"
        ),
        **_same(("placed_by", "lifted_by"), "the user's id; the username snapshot is the chained actor"),
    },
    TailPending: {
        **_same(
            ("id", "run_id", "last_sequence_no", "noted_at"),
            "a work queue for the checkpointer, not evidence: a changed or forged note only makes it look "
            "at a run; a deleted one is named (events after the newest anchored head with no note)",
        ),
    },
    RunFeedback: {
        **dict.fromkeys(
            ("id", "run", "user", "rating", "comment", "created_at", "updated_at"),
            "a reader's vote, replaced by their next one by design (mutable): every vote given is chained "
            "(FEEDBACK_RECORDED), from which verify_audit recomputes the run's downvoted fact",
        ),
    },
    AiOpsAlert: {
        **dict.fromkeys(
            (
                "id",
                "run",
                "source",
                "dedupe_key",
                "group_key",
                "group_key_sha256",
                "receiver",
                "alertname",
                "severity",
                "alert_count",
                "fingerprints",
                "labels",
                "annotations",
                "external_url",
                "notifications",
                "last_notified_at",
                "resolved_at",
                "created_at",
            ),
            "intake metadata for lists and dedupe, updated as notifications repeat: what the analysis "
            "was asked is the run's query, bound by run-start",
        ),
    },
}

AUDITED: tuple[type[models.Model], ...] = tuple(EXCLUDED)

# The excluded columns whose reason says verify_audit compares them (a change fails it: FACTS, or the
# counts and rows it names); every other excluded column decides nothing verify_audit concludes (a
# change leaves its verdict as it was). tests/audit/test_tamper_matrix.py holds each reason to that.
COMPARED_REASONS = (_FACT, _COST, _REVIEW_FACT, _QUEUE_FACT)
COMPARED_COLUMNS: dict[type[models.Model], set[str]] = {
    DiagnosisRun: {"audit_write_failures"},  # raised: the lost writes are counted (INCOMPLETE)
    LegalHold: {"id"},  # a named deletion of the chained hold and a named forged row
    ReasoningAccessLog: {"id"},  # likewise, by its chained REASONING_READ
    TailPending: {"run_id"},  # the noted run's note is gone: its unanchored events are named
}


def compared(model: type[models.Model], name: str) -> bool:
    """Whether the excluded column `name` of `model` is one verify_audit compares (see above)."""
    return EXCLUDED[model].get(name) in COMPARED_REASONS or name in COMPARED_COLUMNS.get(model, set())


# The other models of the apps that hold the record (`audit`, `diagnosis`, `reasoning`), and why they are
# no part of it; a new model in those apps is in one of the two lists (the tamper matrix checks).
NOT_AUDITED: dict[type[models.Model], str] = {
    KnowledgeDocument: "the runbook corpus the tools search; a tool's result is bound by its output_sha256",
    KnowledgeChunk: "the runbook corpus the tools search; a tool's result is bound by its output_sha256",
    CheckpointCosignature: (
        "witnesses' signatures over checkpoints, never trusted as stored: each is verified with the witness "
        "policy's keys (AUDIT_WITNESS_POLICY, --witness-key), so a changed or forged one fails its "
        "signature and a deleted one fails the quorum; each witness keeps its own record of what it cosigned"
    ),
    WitnessAttempt: (
        "the outcomes of submissions to witnesses (alerting, /metrics): operational, evidence of nothing"
    ),
}

ROWS: dict[type[models.Model], str] = {
    DiagnosisRun: "a deleted anchored run is named by its leaf; a forged one has no chain for its counts",
    TraceEvent: "a sequence gap or a broken prev_hash link",
    AgentStep: "bound by its AGENT_MODEL_STEP: missing, or stored without a record in the chain",
    ToolInvocation: "bound by its TOOL_INVOCATION events: missing, or stored without a record in the chain",
    AgentReasoningAudit: "bound by its step's event: missing, or stored without a record in the chain",
    RunReview: "bound by its REVIEW_RECORDED: missing, or stored without a record in the chain",
    GovernanceEvent: "a sequence gap or a broken prev_hash link",
    LogLeaf: "a leaf index gap, or a leaf no checkpoint signs",
    LogNode: "recomputed from the leaves: missing, or stored but not expected",
    Checkpoint: "the checkpoints' hash chain (previous_hash) and the leaves beyond the newest one",
    RunTombstone: "a tombstone must name a signed run leaf (and excuse only a purge the chain records)",
    LegalHold: "a deleted row is named by its chained placement; a forged one has none",
    ReasoningAccessLog: "a deleted row is named by its chained REASONING_READ; a forged one has none",
}

ROWS_EXCLUDED: dict[type[models.Model], str] = {
    TailPending: (
        "a work queue: a deleted note is named by the run it left unanchored; a forged one only makes the "
        "checkpointer look at a run"
    ),
    ChatSession: (
        "a session row records nothing by itself: each run binds its session's identity (a deleted or "
        "changed one is named by its runs); a session without runs is an empty folder"
    ),
    LogHead: "one row, rewritten by every checkpoint; its columns are compared with the newest checkpoint",
    RunFeedback: EXCLUDED[RunFeedback]["rating"],
    RunConfiguration: (
        "a display copy: each run chains its own configuration document in RUN_STARTED (a deleted row loses "
        "only the display of the prompt texts); a forged row is named (no run's chain names it)"
    ),
    AiOpsAlert: EXCLUDED[AiOpsAlert]["run"],
}


def register(
    model: type[models.Model],
    *,
    covered: dict[str, str],
    excluded: dict[str, str],
    rows: str,
    not_audited: dict[type[models.Model], str] | None = None,
) -> None:
    """Account for an audited table of a higher layer (an evaluation score: `evaluations.recording`),
    at app start: its covered and excluded columns and how a deleted or forged row is caught (and the
    app's other models, `not_audited`, with why they are no part of the record). The
    tamper matrix then attacks it like the record's own tables."""
    global AUDITED
    if not_audited:
        NOT_AUDITED.update(not_audited)
    COVERED[model] = covered
    EXCLUDED[model] = excluded
    ROWS[model] = rows
    AUDITED = tuple(EXCLUDED)


def not_audited(reasons: dict[type[models.Model], str]) -> None:
    """Say, at app start, why a higher layer's models are no part of the record (`experiments`)."""
    NOT_AUDITED.update(reasons)


def unaccounted(model: type[models.Model]) -> list[str]:
    """The concrete fields of `model` neither covered nor excluded (must be empty), and those both."""
    covered, excluded = COVERED.get(model, {}), EXCLUDED.get(model, {})
    names = [f.name for f in model._meta.concrete_fields]
    return [n for n in names if (n in covered) == (n in excluded)]


def markdown_table() -> str:
    """The registry as the Markdown table of docs/audit-integrity.md (*Coverage*)."""
    lines = ["| Table | Column | Covered by / excluded because |", "|---|---|---|"]
    for model in AUDITED:
        table = model._meta.db_table
        for f in model._meta.concrete_fields:
            if f.name in COVERED.get(model, {}):
                what = COVERED[model][f.name]
            else:
                what = "**excluded**: " + EXCLUDED[model].get(f.name, "?")
            lines.append(f"| `{table}` | `{f.column}` | {what} |")
        rows = ROWS.get(model) or "**excluded**: " + ROWS_EXCLUDED.get(model, "?")
        lines.append(f"| `{table}` | *(row deleted or forged)* | {rows} |")
    return "\n".join(lines)
