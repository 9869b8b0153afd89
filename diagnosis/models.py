"""Identity of the work: who asked (ChatSession), one exact execution (DiagnosisRun), what they thought of it.

A session is a multi-turn folder; a run is one execution and the boundary of every audit record (seed 001,
decision two). Audit rows in the `audit` and `reasoning` apps point at a run by its `run_id` string, never
through a database foreign key (seed 000), so that the durable record can outlive or precede the row it
describes and a failing audit write can never be blocked by, or block, the run row.
"""

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.utils import timezone

from diagnosis.evidence import RUNBOOK_CHUNK, SLUG_PATTERN

# Deciding a tool call that waits for approval (declared in DiagnosisRun.Meta; group "Approvers").
APPROVE_PERMISSION = "diagnosis.approve_tool_call"


class RunStatus(models.TextChoices):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    # Not terminal: the run's attempt ended waiting for a person to decide a tool call that requires
    # approval; its lease is released and a decision makes it claimable again (docs/aiops.md, *Approvals*).
    INTERRUPTED = "INTERRUPTED"


TERMINAL_RUN_STATUSES = frozenset({RunStatus.SUCCESS, RunStatus.FAILED, RunStatus.CANCELLED})
# The provider name of the offline demo model (`DiagnosisRun.provider`): its runs are labelled DEMO
# wherever they are shown, and have no price.
DEMO_PROVIDER = "demo"


class ReleaseDecision(models.TextChoices):
    PUBLISHED = "PUBLISHED"
    BLOCKED = "BLOCKED"


class ReleaseMode(models.TextChoices):
    """What a reader may see before the guards decide (`CHAT_RELEASE`): nothing (`verified`), or the
    model's unverified drafts as it writes them (`draft`)."""

    VERIFIED = "verified"
    DRAFT = "draft"


class AgentFlow(models.TextChoices):
    """Which pipeline executes a run: the chat's router and diagnosis agent, or an AI Ops analysis (a
    planner and an executor agent, started by an alert or by staff, executed by a queue worker)."""

    DIAGNOSIS_AGENT = "DIAGNOSIS_AGENT"
    AI_OPS = "AI_OPS"


class RunPurpose(models.TextChoices):
    """Why a run (and its session) exists: a person's or an alert's question (`production`), or the
    replay of a dataset item under a candidate configuration (`experiment`, `experiments.runner`).
    Experiment runs and sessions are left out of every production read by one rule,
    `diagnosis.selectors.PRODUCTION`."""

    PRODUCTION = "production"
    EXPERIMENT = "experiment"


class Intent(models.TextChoices):
    DIAGNOSIS = "DIAGNOSIS"
    KNOWLEDGE = "KNOWLEDGE"
    CHITCHAT = "CHITCHAT"
    OUT_OF_SCOPE = "OUT_OF_SCOPE"


class ChatSession(models.Model):
    """A conversation folder owned by one user; it groups runs and is never an audit boundary."""

    session_id = models.CharField(max_length=64, unique=True)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="chat_sessions"
    )
    title = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Stored list facts (`diagnosis.services.create_run` counts each new run in the same transaction;
    # the retention purge takes purged runs off): how many runs the session holds and when the newest
    # was created (NULL: none yet).
    run_count = models.IntegerField(default=0)
    last_run_at = models.DateTimeField(null=True, blank=True)
    # `experiment` for the sessions an experiment's replays run in (never a person's conversation).
    purpose = models.CharField(max_length=16, choices=RunPurpose.choices, default=RunPurpose.PRODUCTION)

    class Meta:
        db_table = "chat_session"
        ordering = ["-created_at"]
        indexes = [
            # Ascending, so that `(-created_at, -id)` and `(-last_run_at, -id)` are backward index scans
            # (InnoDB appends the ascending primary key).
            models.Index(fields=["owner", "created_at"], name="idx_session_owner_created"),
            models.Index(fields=["created_at"], name="idx_session_created"),
            models.Index(fields=["owner", "last_run_at"], name="idx_session_owner_last_run"),
            models.Index(fields=["last_run_at"], name="idx_session_last_run"),
        ]

    def __str__(self) -> str:
        return self.session_id


class DiagnosisRun(models.Model):
    """One exact execution of the diagnosis pipeline and its terminal summary.

    `session` joins on the session's string id (`to_field`), so the column `session_id` holds the same
    opaque id the API speaks. The `expected_*` counters are what the runtime attempted to write; the trace
    compares them with what is persisted to expose audit gaps. Token columns form the run's ledger per
    source; `tokens_reasoning` and `tokens_cached_input` are NULL when no model call reported them.
    `model_calls` counts calls as they start. `tokens_reconciled` is true only when every started call
    has a stored usage record with a total and the stored records agree with the ledger
    (`audit.verify.reconcile`). `lease_owner`/`lease_expires_at` name the process executing the run;
    `lease_epoch` is the lease's fencing token: every claim (executor or sweeper) increments it, and every
    audit write for the run commits only while the epoch is still the one its writer claimed.
    `fenced_writes` counts the writes refused that way (a stale owner's, after a takeover).
    `release_mode`, `draft_chars`, `last_token_at` and `release_latency_ms` record what the reader could
    see before the release and what waiting for the guards cost.

    `persisted_events/steps/tools` and `audit_complete` are stored list facts: what the list rule of
    `audit.read.list_facts` decides from the stored audit rows, written with the run's terminal row and again
    by whatever changes them later (a failed write after the end, a purge, `verify_audit --refresh-facts`);
    before the run ends they are 0 and False. `verify_audit` recomputes them and reports a disagreement.
    """

    run_id = models.CharField(max_length=64, unique=True)
    session = models.ForeignKey(
        ChatSession,
        to_field="session_id",
        db_column="session_id",
        on_delete=models.PROTECT,
        related_name="runs",
    )
    query = models.TextField()
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.PENDING)
    agent_flow = models.CharField(max_length=32, choices=AgentFlow.choices, default=AgentFlow.DIAGNOSIS_AGENT)
    # The model provider that executed the run ("demo" for the offline demo model), from RUN_STARTED.
    provider = models.CharField(max_length=32, blank=True, default="")
    intent = models.CharField(max_length=16, choices=Intent.choices, null=True, blank=True)
    release_decision = models.CharField(max_length=16, choices=ReleaseDecision.choices, null=True, blank=True)
    content = models.TextField(blank=True, default="")
    error_code = models.CharField(max_length=64, blank=True, default="")
    error_message = models.CharField(max_length=1000, blank=True, default="")

    # Timing (contract run.timing). `created_at` is set when the row is built, not by `auto_now_add` at
    # save: `services.create_run` tags the run's identity, creation time included, before its one INSERT.
    created_at = models.DateTimeField(default=timezone.now, editable=False, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    first_model_request_at = models.DateTimeField(null=True, blank=True)
    first_output_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    total_duration_ms = models.IntegerField(null=True, blank=True)
    first_output_latency_ms = models.IntegerField(null=True, blank=True)
    # The agent model's last token of the answer that went to the guards, and from there to the release
    # (what verified release costs: the guards run while the reader waits).
    last_token_at = models.DateTimeField(null=True, blank=True)
    release_latency_ms = models.IntegerField(null=True, blank=True)

    # Delivery (contract run.delivery): the release policy the run ran under ("" for runs recorded before
    # there was one) and how many characters of unverified draft text were sent to readers (NULL until
    # the run ends). A BLOCKED run with draft_chars > 0 showed a reader text that was then withheld.
    release_mode = models.CharField(max_length=16, choices=ReleaseMode.choices, blank=True, default="")
    draft_chars = models.IntegerField(null=True, blank=True)

    # Token ledger (contract run.tokens), kept per source
    tokens_router = models.IntegerField(default=0)
    tokens_agent = models.IntegerField(default=0)
    tokens_guard = models.IntegerField(default=0)
    tokens_total = models.IntegerField(default=0)
    tokens_reasoning = models.IntegerField(null=True, blank=True, default=None)
    tokens_cached_input = models.IntegerField(null=True, blank=True, default=None)
    model_calls = models.IntegerField(default=0)
    usage_unavailable_calls = models.IntegerField(default=0)
    tokens_reconciled = models.BooleanField(default=False)

    # What the runtime expected to write, and what failed
    expected_events = models.IntegerField(default=0)
    expected_steps = models.IntegerField(default=0)
    expected_tools = models.IntegerField(default=0)
    audit_write_failures = models.IntegerField(default=0)

    # Stored list facts (`audit.read.list_facts`)
    persisted_events = models.IntegerField(default=0)
    persisted_steps = models.IntegerField(default=0)
    persisted_tools = models.IntegerField(default=0)
    audit_complete = models.BooleanField(default=False)

    # Cost (`pricing`): US dollars by the pricing rule (`pricing.rules`), written with the terminal row and
    # recomputed by `verify_audit` like the list facts. NULL when not every call could be priced
    # (`cost_status` says why: `unavailable` with `cost_unpriced_calls`, `demo`), never 0 for an unknown
    # price; `cost_status` "" = not priced (recorded before pricing, or pricing failed). Outside the digest:
    # derived from the chained usage records.
    cost = models.DecimalField(max_digits=20, decimal_places=10, null=True, blank=True, default=None)
    cost_status = models.CharField(max_length=16, blank=True, default="")
    cost_unpriced_calls = models.IntegerField(default=0)

    # Self-evaluation (seed 003) of an AI Ops run: signals computed from the run's own record when it ends,
    # plus the model's stated confidence, labelled as such (`agent.runtime.selfeval`); NULL for chat
    # runs. Written by the terminal update and bound by the run's terminal digest (form `run/3`).
    self_evaluation = models.JSONField(null=True, blank=True, default=None)
    # What the redaction of the question replaced before it was stored (agent/redaction.py): kinds, counts,
    # placeholders and keyed HMACs, never an original. Written with the run; its recorder chains it as
    # REDACTION_APPLIED after RUN_STARTED. NULL: nothing was redacted (or the run predates redaction).
    redaction = models.JSONField(null=True, blank=True, default=None)
    # The fingerprint of the configuration the run executed under (`agent.runtime.configuration`: SHA-256
    # of the canonical JSON of its prompts' digests, models and parameters, tool schemas, knowledge
    # snapshot, guard settings and release policy), copied from the chained RUN_STARTED's
    # `configFingerprint` when the run starts ("" before, or for runs recorded before fingerprints);
    # `verify_audit` compares the two. The document itself: `RunConfiguration`.
    config_fingerprint = models.CharField(max_length=64, blank=True, default="")
    # `experiment` for an experiment's replay (`experiments.runner`), chained in RUN_STARTED's `purpose`
    # and compared by `verify_audit`; such runs are left out of production reads (`selectors.PRODUCTION`).
    purpose = models.CharField(max_length=16, choices=RunPurpose.choices, default=RunPurpose.PRODUCTION)

    # Review facts (`audit.write.reviews`, `audit.review_queue`): whether any user voted the run down, the
    # latest review's verdict and time (the reviews themselves are `audit.RunReview`, chained), the
    # current claim of a reviewer working the queue (a username snapshot and its expiry), and
    # `needs_review`, the queue's rule stored for the list (written by whatever changes its inputs).
    # `<write key id>:<HMAC>` over the run's identity as the service created it (`services.identity_digest`):
    # a run row a database writer inserted carries none, and is never executed (issue 43).
    created_tag = models.CharField(max_length=80, blank=True, default="")
    downvoted = models.BooleanField(default=False)
    review_verdict = models.CharField(max_length=24, blank=True, default="")
    reviewed_at = models.DateTimeField(null=True, blank=True)
    review_claimed_by = models.CharField(max_length=150, blank=True, default="")
    review_claim_expires_at = models.DateTimeField(null=True, blank=True)
    needs_review = models.BooleanField(default=False)

    # Ownership of execution
    lease_owner = models.CharField(max_length=128, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    cancel_requested = models.BooleanField(default=False)
    lease_epoch = models.IntegerField(default=0)
    fenced_writes = models.IntegerField(default=0)

    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "diagnosis_run"
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["session", "created_at"], name="idx_run_session_created"),
            models.Index(fields=["status", "lease_expires_at"], name="idx_run_status_lease"),
            models.Index(fields=["created_at"], name="idx_run_created"),
            # Ascending on purpose: InnoDB appends the primary key `id` (ascending) to every secondary
            # index, so `ORDER BY created_at DESC, id DESC` is a backward scan of (…, created_at, id);
            # a DESC index would need a filesort. The list's filters, each followed by its order:
            models.Index(fields=["status", "created_at"], name="idx_run_status_created"),
            models.Index(fields=["release_decision", "created_at"], name="idx_run_release_created"),
            models.Index(fields=["intent", "created_at"], name="idx_run_intent_created"),
            models.Index(fields=["provider", "created_at"], name="idx_run_provider_created"),
            models.Index(fields=["audit_complete", "created_at"], name="idx_run_complete_created"),
            models.Index(fields=["tokens_reconciled", "created_at"], name="idx_run_reconciled_created"),
            models.Index(fields=["draft_chars", "created_at"], name="idx_run_draft_created"),
            models.Index(fields=["release_decision", "draft_chars"], name="idx_run_release_draft"),
            # The list's sortable number columns.
            models.Index(fields=["tokens_total"], name="idx_run_tokens"),
            models.Index(fields=["total_duration_ms"], name="idx_run_duration"),
            models.Index(fields=["cost"], name="idx_run_cost"),
            models.Index(fields=["cost_status", "created_at"], name="idx_run_cost_status_created"),
            # The AI Ops queue: PENDING runs of a flow nobody holds yet, oldest first (diagnosis.queue).
            models.Index(fields=["agent_flow", "status", "created_at"], name="idx_run_flow_status_created"),
            # The review queue (`audit.review_queue`): runs that need a human, oldest first.
            models.Index(fields=["needs_review", "created_at"], name="idx_run_needs_review"),
            # The list's configuration filter, newest first.
            models.Index(fields=["config_fingerprint", "created_at"], name="idx_run_config_created"),
            # The list's review-verdict filter (datasets of reviewed runs), newest first.
            models.Index(fields=["review_verdict", "created_at"], name="idx_run_verdict_created"),
        ]
        # Deciding a tool call that waits for approval (held by the group "Approvers", created on migrate).
        permissions = [("approve_tool_call", "Can approve or reject tool calls that require approval")]

    def __str__(self) -> str:
        return self.run_id

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_RUN_STATUSES

    @property
    def unverified_text_delivered(self) -> bool | None:
        """Whether a reader was sent answer text before the guards decided (None: not recorded)."""
        return None if self.draft_chars is None else self.draft_chars > 0


class RunConfiguration(models.Model):
    """One distinct run configuration (`agent.runtime.configuration`), kept once under its fingerprint.

    Content-addressed and append-only: `fingerprint` is the SHA-256 of `canonical` (the document's
    canonical JSON), so a row is written once when a run first executes under it
    (`diagnosis.services.remember_configuration`) and never changed; the evidence is the copy each run
    chains in its RUN_STARTED, this table lets lists and the compare page show and diff configurations
    without reading events. `prompts` holds the instruction texts by role (what the document's prompt
    digests were computed over) so that a changed prompt can be read, not only detected."""

    fingerprint = models.CharField(max_length=64, unique=True)
    canonical = models.TextField()
    document = models.JSONField()
    prompts = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "run_configuration"
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.fingerprint[:12]


class FeedbackRating(models.TextChoices):
    UP = "up"
    DOWN = "down"


class RunFeedback(models.Model):
    """One user's verdict on one run; a second submission by the same user replaces the first."""

    run = models.ForeignKey(
        DiagnosisRun,
        to_field="run_id",
        db_column="run_id",
        on_delete=models.CASCADE,
        related_name="feedback",
    )
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    rating = models.CharField(max_length=8, choices=FeedbackRating.choices)
    comment = models.CharField(max_length=2000, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "run_feedback"
        verbose_name = verbose_name_plural = "run feedback"
        constraints = [models.UniqueConstraint(fields=["run", "user"], name="uniq_feedback_run_user")]

    def __str__(self) -> str:
        return f"{self.run_id}:{self.rating}"


# ---------------------------------------------------------------------------------------------------
# AI Ops: the alert an analysis was started for
# ---------------------------------------------------------------------------------------------------
class AlertSource(models.TextChoices):
    ALERTMANAGER = "alertmanager", "Alertmanager webhook"
    STAFF = "staff", "Staff (API)"
    SHELL = "shell", "manage.py aiops"


class AiOpsAlert(models.Model):
    """The alert (or question) one AI Ops run analyses, kept beside the run for lists and dedupe.

    A notification of Alertmanager's webhook starts one run per distinct firing of an alert group:
    `dedupe_key` is the sha256 of the group's `groupKey` and its firing alerts (fingerprint and
    `startsAt` each), so a re-sent notification of the same firing finds this row (and only counts
    `notifications`) instead of starting a second run, while an alert joining the group, or firing again
    after it resolved, is a new firing. Staff and shell analyses have no `dedupe_key`. The run's own
    record (query, timeline, report) lives in the run and the audit: this row is operational metadata,
    written by `agent.aiops.intake` only, and `labels`/`annotations` are bounded copies.
    """

    run = models.OneToOneField(
        DiagnosisRun,
        to_field="run_id",
        db_column="run_id",
        on_delete=models.PROTECT,
        related_name="aiops_alert",
    )
    source = models.CharField(max_length=16, choices=AlertSource.choices)
    dedupe_key = models.CharField(max_length=64, unique=True, null=True, blank=True)
    group_key = models.CharField(max_length=1000, blank=True, default="")
    group_key_sha256 = models.CharField(max_length=64, blank=True, default="")
    receiver = models.CharField(max_length=200, blank=True, default="")
    alertname = models.CharField(max_length=200, blank=True, default="")
    severity = models.CharField(max_length=32, blank=True, default="")
    alert_count = models.IntegerField(default=0)
    fingerprints = models.JSONField(default=list, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    annotations = models.JSONField(default=dict, blank=True)
    external_url = models.CharField(max_length=500, blank=True, default="")
    notifications = models.IntegerField(default=1)
    last_notified_at = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "aiops_alert"
        verbose_name = "AI Ops analysis"
        verbose_name_plural = "AI Ops analyses"
        ordering = ["-created_at"]
        indexes = [
            # Ascending: InnoDB appends the primary key ascending, so ORDER BY created_at DESC, id DESC
            # reads these backwards with no sort (core/admin_lists.py).
            models.Index(fields=["created_at"], name="idx_aiops_alert_created"),
            models.Index(fields=["alertname", "created_at"], name="idx_aiops_alert_name"),
            models.Index(fields=["severity", "created_at"], name="idx_aiops_alert_severity"),
            models.Index(fields=["group_key_sha256"], name="idx_aiops_alert_group"),
        ]

    def __str__(self) -> str:
        return f"{self.alertname or self.source}:{self.run_id}"


# ---------------------------------------------------------------------------------------------------
# Knowledge: operations runbooks the agent's `lookup_knowledge` tool retrieves evidence from
# ---------------------------------------------------------------------------------------------------
KNOWLEDGE_SLUG_PATTERN = SLUG_PATTERN  # the slug of evidence ids `kb:<slug>#<n>` (diagnosis.evidence)


class KnowledgeLanguage(models.TextChoices):
    ENGLISH = "en", "English"
    CHINESE = "zh", "Chinese"


class KnowledgeDocument(models.Model):
    """One runbook: front matter (title, tags, summary) and a markdown body, cut into `KnowledgeChunk`s.

    Written only through `agent.knowledge.ingest.upsert_document`, which re-chunks whenever the body
    changes and keeps `content_sha256` (over title, tags, summary, language and body) so that reloading an
    unchanged file is a no-op. `slug` is the stable public name: evidence ids are `kb:<slug>#<n>`.
    """

    slug = models.CharField(
        max_length=100,
        unique=True,
        validators=[
            RegexValidator(
                rf"^{KNOWLEDGE_SLUG_PATTERN}\Z",
                "Lowercase letters and digits, separated by single hyphens or underscores.",
            )
        ],
    )
    title = models.CharField(max_length=200)
    tags = models.JSONField(default=list, blank=True)
    summary = models.TextField(blank=True, default="")
    body = models.TextField()
    language = models.CharField(
        max_length=8, choices=KnowledgeLanguage.choices, default=KnowledgeLanguage.ENGLISH
    )
    source_path = models.CharField(max_length=500, blank=True, default="")
    content_sha256 = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "knowledge_document"
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class KnowledgeChunk(models.Model):
    """A retrievable piece of a document under one section heading; `ordinal` counts from 1 per document.

    Chunks are derived data: `upsert_document` replaces all of a document's chunks when its body changes.
    """

    document = models.ForeignKey(KnowledgeDocument, on_delete=models.CASCADE, related_name="chunks")
    ordinal = models.PositiveIntegerField()
    heading = models.CharField(max_length=200, blank=True, default="")
    text = models.TextField()

    class Meta:
        db_table = "knowledge_chunk"
        ordering = ["document", "ordinal"]
        constraints = [
            models.UniqueConstraint(fields=["document", "ordinal"], name="uniq_chunk_document_ordinal"),
            models.CheckConstraint(condition=models.Q(ordinal__gte=1), name="chk_chunk_ordinal_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.document_id}#{self.ordinal}"

    @property
    def evidence_id(self) -> str:
        """`kb:<slug>#<n>`; reads `document` (select it with the chunk to avoid a query per chunk)."""
        return RUNBOOK_CHUNK.format(slug=self.document.slug, ordinal=self.ordinal)
