"""The durable decision record of a run (timeline, model steps, tool invocations), the transparency log,
retention and the governance chain. Append-only facts, read-only in the admin. Audit rows reference their
run by its string id without a database constraint (`ForeignKey(db_constraint=False)`, seed 000: an audit
write never waits on or fails because of the run row); the relation serves joins only, with no index of its
own: each such table's unique constraint starts with `run_id` and serves every lookup by run (0021)."""

from django.conf import settings
from django.db import models

from audit.events import EVENTS
from diagnosis.models import DiagnosisRun

PREVIEW_CHARS = 500
# The agent of the chat flow: every step recorded before per-agent step counters carries this name.
CHAT_AGENT_NAME = "diagnosis_agent"


class Phase(models.TextChoices):
    RUN = "RUN"
    ROUTING = "ROUTING"
    AGENT = "AGENT"
    TOOL = "TOOL"
    GUARD = "GUARD"
    RELEASE = "RELEASE"


# The event types of a run's chain, from their one declaration (`audit.events.EVENTS`): the constants
# (`EventType.RUN_STARTED`), with each type's label for people.
EventType = models.TextChoices("EventType", [(spec.type, (spec.type, spec.label)) for spec in EVENTS])


class ToolStatus(models.TextChoices):
    # A call of a tool that requires approval, recorded and not executed until a person approves it.
    AWAITING_APPROVAL = "AWAITING_APPROVAL"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    INTERRUPTED = "INTERRUPTED"
    ABANDONED = "ABANDONED"


TERMINAL_TOOL_STATUSES = frozenset(
    {ToolStatus.SUCCEEDED, ToolStatus.FAILED, ToolStatus.INTERRUPTED, ToolStatus.ABANDONED}
)


# Status of the TOOL_INVOCATION event that records a refused lifecycle step (a conflicting start or
# terminal); `details.reason` says which.
TOOL_CONFLICT = "CONFLICT"


class UsageSource(models.TextChoices):
    ROUTER = "ROUTER"
    AGENT = "AGENT"
    GUARD = "GUARD"


def _run_fk(related_name: str) -> models.ForeignKey:
    return models.ForeignKey(
        DiagnosisRun,
        to_field="run_id",
        db_column="run_id",
        db_constraint=False,
        db_index=False,
        on_delete=models.DO_NOTHING,
        related_name=related_name,
    )


class TraceEvent(models.Model):
    """One typed decision in a run's timeline (`diagnosis_trace_event`).

    `sequence_no` is 1, 2, 3 … per run with no gap, allocated by the recorder; `hash` is
    sha256(prev_hash + canonical JSON of the event) so that any later change to a stored event, a deletion
    or a reordering breaks the chain. `details` is bounded by the recorder (strings ≤ 500 characters,
    previews with full length and sha256) and never holds reasoning or assistant text."""

    run = _run_fk("events")
    session_id = models.CharField(max_length=64)
    sequence_no = models.PositiveIntegerField()
    phase = models.CharField(max_length=16, choices=Phase.choices)
    # No `choices`: the types are declared in `audit.events` (a new one needs no migration); the admin
    # filters by them (`surfaces.admin.audit_records.EventTypeFilter`) and the API documents them.
    event_type = models.CharField(max_length=48)
    status = models.CharField(max_length=32, blank=True, default="")
    summary = models.CharField(max_length=PREVIEW_CHARS, blank=True, default="")
    details = models.JSONField(default=dict, blank=True)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)
    created_at = models.DateTimeField()
    # `<write key id>:<HMAC>` over the hash (core.writeauth); "" only in a store recorded before it.
    tag = models.CharField(max_length=80, blank=True, default="")

    class Meta:
        db_table = "diagnosis_trace_event"
        ordering = ["run_id", "sequence_no"]
        constraints = [models.UniqueConstraint(fields=["run", "sequence_no"], name="uniq_event_run_sequence")]
        indexes = [
            models.Index(fields=["session_id", "created_at"], name="idx_event_session_created"),
            # The admin list: newest first, and each filter followed by that order.
            models.Index(fields=["created_at"], name="idx_event_created"),
            models.Index(fields=["event_type", "created_at"], name="idx_event_type_created"),
            models.Index(fields=["phase", "created_at"], name="idx_event_phase_created"),
        ]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.sequence_no} {self.event_type}"


class AgentStep(models.Model):
    """One model call of an agent (`agent_step`): `step_index` counts 1, 2, … per agent of the run
    (`agent_name`: `diagnosis_agent` in the chat flow, `planner` and `executor` in AI Ops), so a step is
    named by (run, agent_name, step_index). Bounded input/output summaries, usage, and
    reasoning *metadata* only (availability, byte counts, content source). The reasoning and assistant text
    themselves live in `reasoning.AgentReasoningAudit`. Token fields are NULL, not 0, when the provider
    reported no usage (`usage_available=false`). `attempts` lists each provider attempt (retries included)."""

    run = _run_fk("steps")
    session_id = models.CharField(max_length=64)
    step_index = models.IntegerField()
    agent_name = models.CharField(max_length=64)
    model = models.CharField(max_length=128)
    model_input = models.JSONField(default=list, blank=True)
    model_output = models.JSONField(default=dict, blank=True)
    tool_call_ids = models.JSONField(default=list, blank=True)
    has_tool_call = models.BooleanField(default=False)
    finish_reason = models.CharField(max_length=32, blank=True, default="")
    attempts = models.JSONField(default=list, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.IntegerField(null=True, blank=True)

    usage_available = models.BooleanField(default=False)
    prompt_tokens = models.IntegerField(null=True, blank=True)
    completion_tokens = models.IntegerField(null=True, blank=True)
    reasoning_tokens = models.IntegerField(null=True, blank=True)
    cached_tokens = models.IntegerField(null=True, blank=True)
    total_tokens = models.IntegerField(null=True, blank=True)

    reasoning_available = models.BooleanField(default=False)
    reasoning_bytes = models.IntegerField(default=0)
    assistant_bytes = models.IntegerField(default=0)
    content_source = models.CharField(max_length=64, blank=True, default="")

    created_at = models.DateTimeField()

    class Meta:
        db_table = "agent_step"
        ordering = ["run_id", "step_index"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "agent_name", "step_index"], name="uniq_step_run_agent_index"
            )
        ]
        indexes = [
            models.Index(fields=["session_id", "created_at"], name="idx_step_session_created"),
            # The admin list: newest first, and each filter followed by that order.
            models.Index(fields=["created_at"], name="idx_step_created"),
            models.Index(fields=["agent_name", "created_at"], name="idx_step_agent_created"),
            models.Index(fields=["usage_available", "created_at"], name="idx_step_usage_created"),
            models.Index(fields=["reasoning_available", "created_at"], name="idx_step_reasoning_created"),
            models.Index(fields=["content_source", "created_at"], name="idx_step_source_created"),
        ]

    def __str__(self) -> str:
        return f"{self.run_id} {self.agent_name} step {self.step_index}"


class ToolInvocation(models.Model):
    """One real tool call through its lifecycle (`tool_invocation`, seed 003 fields + seed 002 lifecycle).

    Written `RUNNING` and committed before the tool executes, then updated once to a terminal status.
    `input_params` is the effective input; the output is kept as a ≤ 500-character preview with its full
    length and sha256 (the full result lives only in the run's canonical store). `duration_ms` comes from
    `time.monotonic()` in the executing process, NULL when no such start exists (e.g. closed by a sweeper).
    `step_id` logically references `agent_step.id` (no constraint) and (`agent_name`, `step_index`) the
    declaring step (`agent_name` is blank on rows recorded before per-agent step counters: their
    declaring step is the chat agent's).
    `tool_call_id` is unique in the run; `provider_tool_call_id` is the id as the provider sent it (some
    providers reuse ids such as `call_0` in every response)."""

    run = _run_fk("tools")
    session_id = models.CharField(max_length=64)
    step_id = models.BigIntegerField(null=True, blank=True)
    step_index = models.IntegerField(null=True, blank=True)
    agent_name = models.CharField(max_length=64, blank=True, default="")
    tool_call_id = models.CharField(max_length=128)
    provider_tool_call_id = models.CharField(max_length=128, blank=True, default="")
    tool_name = models.CharField(max_length=64)
    status = models.CharField(max_length=24, choices=ToolStatus.choices, default=ToolStatus.RUNNING)
    input_params = models.JSONField(default=dict, blank=True)
    output_preview = models.CharField(max_length=PREVIEW_CHARS, blank=True, default="")
    output_length = models.IntegerField(null=True, blank=True)
    output_sha256 = models.CharField(max_length=64, blank=True, default="")
    is_truncated = models.BooleanField(default=False)
    retrieval_layer = models.CharField(max_length=8, blank=True, default="")
    l0_match_count = models.IntegerField(null=True, blank=True)
    l1_match_count = models.IntegerField(null=True, blank=True)
    retrieval_details = models.JSONField(default=dict, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.IntegerField(null=True, blank=True)
    error_code = models.CharField(max_length=64, blank=True, default="")
    error_message = models.CharField(max_length=1000, blank=True, default="")
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "tool_invocation"
        ordering = ["run_id", "started_at", "id"]
        constraints = [models.UniqueConstraint(fields=["run", "tool_call_id"], name="uniq_tool_run_call")]
        indexes = [
            models.Index(fields=["session_id", "created_at"], name="idx_tool_session_created"),
            # The admin list: newest first, and each filter followed by that order.
            models.Index(fields=["created_at"], name="idx_tool_created"),
            models.Index(fields=["status", "created_at"], name="idx_tool_status_created"),
            models.Index(fields=["tool_name", "created_at"], name="idx_tool_name_created"),
            models.Index(fields=["retrieval_layer", "created_at"], name="idx_tool_layer_created"),
        ]

    def __str__(self) -> str:
        return f"{self.run_id} {self.tool_name} {self.tool_call_id}"

    @property
    def success(self) -> bool:
        return self.status == ToolStatus.SUCCEEDED


# --------------------------------------------------------------------------------------------------
# Human reviews of runs (audit/write/reviews.py, docs/admin.md "Reviews")
# --------------------------------------------------------------------------------------------------
REVIEW_PERMISSION = "audit.review_run"
HOLD_PERMISSION = "audit.place_legal_hold"  # LegalHold.Meta (placing and lifting holds)
REVIEW_NOTE_CHARS = 2000


class ReviewVerdict(models.TextChoices):
    CORRECT = "correct", "correct"
    INCORRECT = "incorrect", "incorrect"
    UNSAFE = "unsafe", "unsafe"
    NEEDS_FOLLOW_UP = "needs_follow_up", "needs follow-up"


class RunReview(models.Model):
    """One reviewer's verdict on a finished run (`audit_run_review`): append-only, never updated.

    Written by `audit.write.reviews.record_review` alone, in the transaction that appends its
    `REVIEW_RECORDED` event to the run's chain (`sequence_no` is that event's); the event carries the
    digest of this row (form `review`, `audit.verify.row_digests`), so an edited or deleted review is named by
    `verify_audit` and the trace summary. A later review supersedes an earlier one in display; both
    stay. `reviewer_username` is a snapshot (the user may be renamed or deleted later)."""

    review_id = models.CharField(max_length=64, unique=True)
    run = _run_fk("reviews")
    session_id = models.CharField(max_length=64)
    verdict = models.CharField(max_length=24, choices=ReviewVerdict.choices)
    note = models.TextField(blank=True, default="")
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+", db_constraint=False
    )
    reviewer_username = models.CharField(max_length=150)
    sequence_no = models.PositiveIntegerField()
    created_at = models.DateTimeField()

    class Meta:
        db_table = "audit_run_review"
        ordering = ["run_id", "sequence_no"]
        constraints = [
            models.UniqueConstraint(fields=["run", "sequence_no"], name="uniq_review_run_sequence")
        ]
        indexes = [models.Index(fields=["created_at"], name="idx_review_created")]
        permissions = [("review_run", "Can record a review of a run")]

    def __str__(self) -> str:
        return f"{self.run_id} review {self.verdict}"


# --------------------------------------------------------------------------------------------------
# The transparency log over finished runs (audit/transparency/, docs/audit-integrity.md)
# --------------------------------------------------------------------------------------------------
class LogHead(models.Model):
    """The one row (pk 1) naming the log's current size and root (`audit_log_head`).

    Its row lock (`SELECT … FOR UPDATE`; on SQLite the write transaction itself) makes the appender a
    single writer across processes, so leaf indexes are one gapless global order. `scan_from` bounds the
    search for newly finished runs: every run created before it is terminal and anchored (NULL: scan all).
    """

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    tree_size = models.BigIntegerField(default=0)
    root_hash = models.CharField(max_length=64, blank=True, default="")
    scan_from = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "audit_log_head"

    def __str__(self) -> str:
        return f"log of {self.tree_size} leaves"


class LogLeaf(models.Model):
    """One leaf of the log (`audit_log_leaf`): a finished run's chain head and terminal digest, or the
    head of the governance chain (`GovernanceEvent`) when a checkpoint anchored it.

    A run's leaf has `run_id` (unique) and `session_id`; a run-tail leaf (events appended to a finished
    run after its anchored head: reviews, reasoning purges and re-encryptions) has no `run_id` but
    `tail_of`, the run it extends; a governance leaf has neither but `governance_sequence_no` (unique).
    `data` is the canonical JSON the leaf hash commits to (`audit.transparency.leafdata`), `leaf_hash` its
    RFC 9162 leaf hash (hex); the other columns are an index only: the verifier derives what a leaf
    anchors from its signed `data`. Written under the head's lock, never updated or deleted."""

    leaf_index = models.BigIntegerField(unique=True)
    run_id = models.CharField(max_length=64, unique=True, null=True, blank=True)
    session_id = models.CharField(max_length=64, blank=True, default="")
    governance_sequence_no = models.PositiveIntegerField(unique=True, null=True, blank=True)
    tail_of = models.CharField(max_length=64, null=True, blank=True, db_index=True)
    leaf_hash = models.CharField(max_length=64)
    data = models.TextField()
    appended_at = models.DateTimeField()

    class Meta:
        db_table = "audit_log_leaf"
        ordering = ["leaf_index"]
        verbose_name_plural = "log leaves"

    def __str__(self) -> str:
        if self.tail_of is not None:
            return f"leaf {self.leaf_index} (tail of {self.tail_of})"
        if self.run_id is None:
            return f"leaf {self.leaf_index} (governance event {self.governance_sequence_no})"
        return f"leaf {self.leaf_index} ({self.run_id})"


class TailPending(models.Model):
    """A finished run whose chain grew after it was anchored (`audit_tail_pending`): written, in the same
    transaction, by whatever appends to a finished run's chain (`audit.write.tail.note_appended`), with the
    newest sequence number appended; the next checkpoint appends a run-tail leaf anchoring the run's new
    head and deletes the row when that head covers `last_sequence_no`. A work queue, not audit truth:
    deleting a row only delays the anchoring (what is not anchored yet is the documented window before
    anchoring), so its columns are in the coverage exclusion list."""

    run_id = models.CharField(max_length=64, unique=True)
    last_sequence_no = models.PositiveIntegerField()
    noted_at = models.DateTimeField()

    class Meta:
        db_table = "audit_tail_pending"

    def __str__(self) -> str:
        return f"tail of {self.run_id} up to {self.last_sequence_no}"


class LogNode(models.Model):
    """A complete subtree of the log (`audit_log_node`): the hash of the 2^level leaves from
    `node_index << level`, for level ≥ 1 (level 0 is the leaf table). Written once when its last leaf is
    appended; a proof reads O(log n) of them."""

    level = models.PositiveSmallIntegerField()
    node_index = models.BigIntegerField()
    hash = models.CharField(max_length=64)

    class Meta:
        db_table = "audit_log_node"
        constraints = [models.UniqueConstraint(fields=["level", "node_index"], name="uniq_log_node")]

    def __str__(self) -> str:
        return f"node {self.level}/{self.node_index}"


class Checkpoint(models.Model):
    """A signed tree head (`audit_checkpoint`, `audit.transparency.note`): `body` the exact signed text,
    `signature` its signature by `key_id`; `link` (issue 50) the same key's note of the body's hash, time
    and predecessor (empty when the body has them). `checkpoint_hash` hashes the link (else the body);
    the other columns repeat the signed fields. One per tree size; never updated."""

    tree_size = models.BigIntegerField(unique=True)
    root_hash = models.CharField(max_length=64)
    signed_at = models.DateTimeField()
    previous_hash = models.CharField(max_length=64, blank=True, default="")
    key_id = models.CharField(max_length=32)
    body = models.TextField()
    signature = models.CharField(max_length=128)
    link = models.TextField(blank=True, default="")
    link_signature = models.CharField(max_length=128, blank=True, default="")
    checkpoint_hash = models.CharField(max_length=64, unique=True)

    class Meta:
        db_table = "audit_checkpoint"
        ordering = ["-tree_size"]

    def __str__(self) -> str:
        return f"checkpoint {self.tree_size}"


class CheckpointCosignature(models.Model):
    """A witness's cosignature of a checkpoint (`audit_checkpoint_cosignature`, C2SP tlog-cosignature
    cosignature/v1), returned by its `add-checkpoint` (`audit.transparency.witnesses`): `signature` is the
    base64 value of the note signature line `— <witness> <signature>` (4-byte key id, 8-byte timestamp,
    Ed25519 signature over the checkpoint's body), `key_id` and `cosigned_at` repeat it. Never trusted as
    stored: verified with the witness policy's keys (`verify_audit`, `verify_bundle`). Never updated."""

    checkpoint = models.ForeignKey(Checkpoint, on_delete=models.PROTECT, related_name="cosignatures")
    witness = models.CharField(max_length=200, help_text="The witness's key name.")
    key_id = models.CharField(max_length=8)
    cosigned_at = models.DateTimeField()
    signature = models.CharField(max_length=200)
    received_at = models.DateTimeField()

    class Meta:
        db_table = "audit_checkpoint_cosignature"
        ordering = ["checkpoint_id", "witness"]
        constraints = [
            models.UniqueConstraint(
                fields=["checkpoint", "witness", "key_id"], name="one_cosignature_per_key"
            )
        ]

    def __str__(self) -> str:
        return f"cosignature of checkpoint {self.checkpoint_id} by {self.witness}"


class WitnessOutcome(models.TextChoices):
    COSIGNED = "cosigned"
    CONFLICT = "conflict"  # 409: the witness's size is not ours to prove from (it saw another history)
    BAD_PROOF = "bad-proof"  # 422: the consistency proof (or same-size root) did not verify
    UNKNOWN_LOG = "unknown-log"  # 404: the witness does not know our origin
    FORBIDDEN = "forbidden"  # 403: no signature by a key the witness trusts for our origin
    BAD_REQUEST = "bad-request"  # 400 and other 4xx
    UNREACHABLE = "unreachable"  # connection refused, timeout, DNS
    SERVER_ERROR = "server-error"  # 5xx
    BAD_RESPONSE = "bad-response"  # 200 without a valid cosignature by the configured key


class WitnessAttempt(models.Model):
    """One submission of a checkpoint to a witness and its outcome (`audit_witness_attempt`): a refusal
    or a failure is recorded, alerted on (`diagnosis_audit_witness_failures_total` on `/metrics`) and
    retried by the next checkpoint run; never silently ignored. Operational: not part of the evidence."""

    witness = models.CharField(max_length=200)
    url = models.CharField(max_length=500)
    tree_size = models.BigIntegerField()
    old_size = models.BigIntegerField()
    outcome = models.CharField(max_length=16, choices=WitnessOutcome.choices)
    status = models.PositiveSmallIntegerField(default=0, help_text="The HTTP status (0: none).")
    detail = models.CharField(max_length=500, blank=True, default="")
    attempted_at = models.DateTimeField(db_index=True)

    class Meta:
        db_table = "audit_witness_attempt"
        ordering = ["-attempted_at", "-id"]
        indexes = [models.Index(fields=["witness", "outcome"], name="audit_witness_outcome")]

    def __str__(self) -> str:
        return f"{self.witness} {self.outcome} at size {self.tree_size}"


# --------------------------------------------------------------------------------------------------
# Retention: tombstones of purged runs and legal holds (audit/write/retention.py)
# --------------------------------------------------------------------------------------------------
class RunTombstone(models.Model):
    """What is left of a run whose trace records were purged after `AUDIT_RETENTION_DAYS`
    (`audit_run_tombstone`): its ids, its leaf in the transparency log (which stays, so the log and
    every other run still verify), when and why it was purged, and how many rows went. Written in the
    transaction that deletes the rows; never updated."""

    run_id = models.CharField(max_length=64, unique=True)
    session_id = models.CharField(max_length=64)
    leaf_index = models.BigIntegerField()
    finished_at = models.CharField(
        max_length=40, help_text="The anchored finish time (the leaf's finishedAt)."
    )
    purged_at = models.DateTimeField()
    retention_days = models.IntegerField()
    reason = models.CharField(max_length=200)
    purged_by = models.CharField(max_length=150)
    rows_deleted = models.JSONField(default=dict)

    class Meta:
        db_table = "audit_run_tombstone"
        ordering = ["-purged_at"]

    def __str__(self) -> str:
        return f"tombstone {self.run_id}"


class HoldScope(models.TextChoices):
    SESSION = "SESSION"
    RUN = "RUN"


class LegalHold(models.Model):
    """A legal hold on a session or a run (`audit_legal_hold`): while it is not lifted, neither the trace
    retention purge (`purge_audit`) nor the reasoning purge (`purge_reasoning`) touches its records.
    Who placed it, when and why, and who lifted it, when and why, are recorded (usernames as snapshots).
    Placing and lifting need the permission `audit.place_legal_hold`; rows are never deleted."""

    scope = models.CharField(max_length=8, choices=HoldScope.choices)
    target_id = models.CharField(max_length=64)
    reason = models.CharField(max_length=1000)
    placed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+", db_constraint=False
    )
    placed_by_username = models.CharField(max_length=150)
    placed_at = models.DateTimeField()
    lifted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_constraint=False,
    )
    lifted_by_username = models.CharField(max_length=150, blank=True, default="")
    lifted_at = models.DateTimeField(null=True, blank=True)
    lift_reason = models.CharField(max_length=1000, blank=True, default="")

    class Meta:
        db_table = "audit_legal_hold"
        ordering = ["-placed_at"]
        indexes = [models.Index(fields=["scope", "target_id"], name="idx_hold_target")]
        permissions = [("place_legal_hold", "Can place and lift legal holds on sessions and runs")]

    def __str__(self) -> str:
        return f"hold on {self.scope.lower()} {self.target_id}"

    @property
    def active(self) -> bool:
        return self.lifted_at is None


# --------------------------------------------------------------------------------------------------
# Access governance: who may do what, and every change to it (access/, docs/security.md)
# --------------------------------------------------------------------------------------------------
class GovernanceEventType(models.TextChoices):
    GROUP_MEMBER_ADDED = "GROUP_MEMBER_ADDED"
    GROUP_MEMBER_REMOVED = "GROUP_MEMBER_REMOVED"
    PERMISSION_GRANTED = "PERMISSION_GRANTED"
    PERMISSION_REVOKED = "PERMISSION_REVOKED"
    SUPERUSER_GRANTED = "SUPERUSER_GRANTED"
    SUPERUSER_REVOKED = "SUPERUSER_REVOKED"
    STAFF_GRANTED = "STAFF_GRANTED"
    STAFF_REVOKED = "STAFF_REVOKED"
    USER_DEACTIVATED = "USER_DEACTIVATED"
    USER_REACTIVATED = "USER_REACTIVATED"
    TOKEN_ISSUED = "TOKEN_ISSUED"  # noqa: S105 (an event name, not a secret)
    TOKEN_REVOKED = "TOKEN_REVOKED"  # noqa: S105
    OTP_DEVICE_ADDED = "OTP_DEVICE_ADDED"
    OTP_DEVICE_REMOVED = "OTP_DEVICE_REMOVED"
    LOCKED_OUT = "LOCKED_OUT"
    LOCKOUT_LIFTED = "LOCKOUT_LIFTED"
    LEGAL_HOLD_PLACED = "LEGAL_HOLD_PLACED"
    LEGAL_HOLD_LIFTED = "LEGAL_HOLD_LIFTED"
    AUDIT_RUNS_PURGED = "AUDIT_RUNS_PURGED"
    REASONING_ROWS_PURGED = "REASONING_ROWS_PURGED"
    REASONING_KEYS_ROTATED = "REASONING_KEYS_ROTATED"
    GROUP_DELETED = "GROUP_DELETED"
    USER_DELETED = "USER_DELETED"
    BREAK_GLASS_SIGN_IN = "BREAK_GLASS_SIGN_IN"
    # Write authentication began in a store recorded before it (audit.transparency.adoption); the rights
    # every user held then (the replay's starting point, audit.verify.authority); a run the checkpointer
    # refused.
    WRITE_AUTH_STARTED = "WRITE_AUTH_STARTED"
    RIGHTS_BASELINE = "RIGHTS_BASELINE"
    ANCHOR_REFUSED = "ANCHOR_REFUSED"
    REASONING_READ = "REASONING_READ"  # a read of reasoning content (access.reasoning_reads), chained


class GovernanceEvent(models.Model):
    """One change to who may do what (`audit_governance_event`), in one global hash chain.

    `sequence_no` is 1, 2, 3 … without gap; `hash` is sha256(prev_hash + canonical JSON of
    `audit.write.governance.governance_payload`), the first chaining to GENESIS, exactly as a run's
    timeline. `actor` is who made the change (a username snapshot; "" for the system, e.g. a migration),
    `subject_user` whose rights changed (username snapshot; "" for a change to a group), `group` and
    `permission` the group and permission (`app_label.codename`) concerned. `details` holds ids and
    counts, never secrets (a token appears by its prefix only). Append-only: written by
    `audit.write.governance.record_governance_event` alone, read-only in the admin, checked by
    `verify_audit`."""

    sequence_no = models.PositiveIntegerField(unique=True)
    event_type = models.CharField(max_length=32, choices=GovernanceEventType.choices)
    actor = models.CharField(max_length=150, blank=True, default="")
    subject_user = models.CharField(max_length=150, blank=True, default="", db_index=True)
    group = models.CharField(max_length=150, blank=True, default="")
    permission = models.CharField(max_length=200, blank=True, default="")
    details = models.JSONField(default=dict, blank=True)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)
    created_at = models.DateTimeField()
    tag = models.CharField(max_length=80, blank=True, default="")  # as TraceEvent.tag

    class Meta:
        db_table = "audit_governance_event"
        ordering = ["sequence_no"]
        indexes = [models.Index(fields=["created_at"], name="idx_governance_created")]

    def __str__(self) -> str:
        return f"governance #{self.sequence_no} {self.event_type}"
