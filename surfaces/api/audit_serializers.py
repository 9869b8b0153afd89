"""Output shapes of the trace read model (API contract, *Trace*), shared by the API and the admin export,
and of legal holds; the transparency log's and evidence bundles' shapes are `surfaces.api.log_serializers`.

`TraceSerializer(get_trace(...)).data` is the exact body of `GET /api/diagnosis/{sessionId}/trace`.
Keys are camelCase; the serializers are thin (no queries, no logic beyond renaming). No field here can
carry reasoning or assistant text: steps expose only availability, byte counts and content source.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from audit.events import EVENTS
from audit.models import CHAT_AGENT_NAME, Phase, ReviewVerdict, ToolStatus
from diagnosis.models import Intent, ReleaseDecision, RunStatus
from diagnosis.selectors import RunResolution
from pricing.rules import CURRENCY, CostStatus
from reasoning.models import ContentSource
from surfaces.api.log_serializers import (  # noqa: F401  (re-exported: surfaces.api.audit imports them from here)
    CheckpointPageSerializer,
    CheckpointSerializer,
    ConsistencyQuerySerializer,
    ConsistencySerializer,
    EvidenceBundleSerializer,
)

MONEY = {"max_digits": 20, "decimal_places": 10}
COST_STATUSES = ["priced", "unavailable", "demo", "not_priced"]
CALL_COST_STATUSES = [
    CostStatus.PRICED,
    CostStatus.USAGE_UNAVAILABLE,
    CostStatus.UNKNOWN_MODEL,
    CostStatus.DEMO,
]


class RunErrorSerializer(serializers.Serializer):
    code = serializers.CharField(source="error_code")
    message = serializers.CharField(source="error_message")

    class Meta:
        ref_name = "RunError"


class RunTimingSerializer(serializers.Serializer):
    createdAt = serializers.DateTimeField(source="created_at")
    startedAt = serializers.DateTimeField(source="started_at", allow_null=True)
    firstModelRequestAt = serializers.DateTimeField(source="first_model_request_at", allow_null=True)
    firstOutputAt = serializers.DateTimeField(source="first_output_at", allow_null=True)
    finishedAt = serializers.DateTimeField(source="finished_at", allow_null=True)
    totalDurationMs = serializers.IntegerField(source="total_duration_ms", allow_null=True)
    firstOutputLatencyMs = serializers.IntegerField(source="first_output_latency_ms", allow_null=True)
    lastTokenAt = serializers.DateTimeField(
        source="last_token_at",
        allow_null=True,
        help_text="The agent model's last token of the answer that went to the guards.",
    )
    releaseLatencyMs = serializers.IntegerField(
        source="release_latency_ms",
        allow_null=True,
        help_text="From the answer's last token to the release reaching the transport: what waiting for "
        "the guards cost (null when no model wrote the answer).",
    )

    class Meta:
        ref_name = "RunTiming"


class RunDeliverySerializer(serializers.Serializer):
    releaseMode = serializers.SerializerMethodField(
        help_text="`verified`: no answer text before the release; `draft`: unverified drafts streamed. "
        "Null for runs recorded before the release policy existed."
    )
    unverifiedTextDelivered = serializers.BooleanField(
        source="unverified_text_delivered",
        allow_null=True,
        help_text="Answer text was sent to a reader before the guards decided (null: not recorded).",
    )
    draftChars = serializers.IntegerField(
        source="draft_chars", allow_null=True, help_text="Unverified characters sent (null: not recorded)."
    )

    class Meta:
        ref_name = "RunDelivery"

    def get_releaseMode(self, run) -> str | None:
        return run.release_mode or None


class RunTokensSerializer(serializers.Serializer):
    router = serializers.IntegerField(source="tokens_router")
    agent = serializers.IntegerField(source="tokens_agent")
    guard = serializers.IntegerField(source="tokens_guard")
    total = serializers.IntegerField(source="tokens_total")
    reasoning = serializers.IntegerField(
        source="tokens_reasoning", allow_null=True, help_text="Null when no model call reported it."
    )
    cachedInput = serializers.IntegerField(
        source="tokens_cached_input", allow_null=True, help_text="Null when no model call reported it."
    )
    usageAvailable = serializers.SerializerMethodField(
        help_text="True when no model call of the run lacked usage (`unavailableCalls == 0`)."
    )
    reconciled = serializers.SerializerMethodField(
        help_text="Every started call has a stored usage record with a total, each agent step row agrees "
        "with its usage record, and the ledger equals the sums of the stored records (checked when the "
        "run finished and again at read time)."
    )
    unavailableCalls = serializers.IntegerField(source="usage_unavailable_calls")
    modelCalls = serializers.IntegerField(
        source="model_calls", help_text="Model calls counted as they started."
    )
    reasoningUnreportedCalls = serializers.SerializerMethodField(
        help_text="Model calls whose reasoning token count the provider did not report."
    )
    cachedUnreportedCalls = serializers.SerializerMethodField(
        help_text="Model calls whose cached input token count the provider did not report."
    )
    callsWithoutUsage = serializers.SerializerMethodField(
        help_text="The calls without a stored usage total, by name (`agent step 2`, `router call 1`)."
    )
    differences = serializers.SerializerMethodField(
        help_text="Each stored record that disagrees with another or with the ledger, in words."
    )
    byAgent = serializers.SerializerMethodField(
        help_text="Tokens of the stored usage records per calling agent (`router`, `diagnosis_agent`, "
        "`planner`, `executor`, `semantic_guard`), in the order the agents first called; calls without "
        "usage add nothing."
    )

    class Meta:
        ref_name = "RunTokens"

    def _ledger(self):
        return self.context["trace"].summary.ledger

    def get_usageAvailable(self, run) -> bool:
        return run.usage_unavailable_calls == 0

    def get_reconciled(self, run) -> bool:
        return bool(self._ledger().reconciled)

    def get_reasoningUnreportedCalls(self, run) -> int:
        return self._ledger().reasoning_unreported

    def get_cachedUnreportedCalls(self, run) -> int:
        return self._ledger().cached_unreported

    def get_callsWithoutUsage(self, run) -> list[str]:
        return list(self._ledger().without_usage)

    def get_differences(self, run) -> list[str]:
        return list(self._ledger().differences)

    @extend_schema_field(serializers.DictField(child=serializers.IntegerField()))
    def get_byAgent(self, run) -> dict[str, int]:
        return dict(self._ledger().by_agent)


class ProviderSerializer(serializers.Serializer):
    name = serializers.CharField(help_text="The provider recorded at RUN_STARTED (`openai`, `demo`).")
    demo = serializers.BooleanField(
        help_text="True for the offline demo model: its text and reasoning are not a real model's."
    )

    class Meta:
        ref_name = "RunProvider"


class FeedbackSerializer(serializers.Serializer):
    rating = serializers.ChoiceField(choices=["up", "down"])
    comment = serializers.CharField()
    createdAt = serializers.DateTimeField(source="created_at")

    class Meta:
        ref_name = "Feedback"


class RunCostSerializer(serializers.Serializer):
    """The run's stored cost (`pricing`): the sum of its calls' costs when every call was priced."""

    amount = serializers.DecimalField(
        source="cost",
        allow_null=True,
        help_text="US dollars, as a decimal string; null when not every model call could be priced "
        "(unknown model, usage not reported, the demo model) or the run is not priced yet. Never 0 for "
        "an unknown price.",
        **MONEY,
    )
    currency = serializers.SerializerMethodField()
    status = serializers.SerializerMethodField(
        help_text="`priced`, `unavailable` (see `unpricedCalls`), `demo` (the demo model has no price), "
        "`not_priced` (recorded before pricing, or pricing failed)."
    )
    unpricedCalls = serializers.IntegerField(source="cost_unpriced_calls")

    class Meta:
        ref_name = "RunCost"

    def get_currency(self, run) -> str:
        return CURRENCY

    @extend_schema_field(serializers.ChoiceField(choices=COST_STATUSES))
    def get_status(self, run) -> str:
        return run.cost_status or "not_priced"


class CallCostSerializer(serializers.Serializer):
    """One model call's cost under the prices in force now (the run's stored `amount` was decided when it
    ended; `verify_audit` reports where the two differ)."""

    sequenceNo = serializers.IntegerField(
        source="event.sequence_no", help_text="Its MODEL_TOKEN_USAGE event."
    )
    source = serializers.SerializerMethodField()
    model = serializers.SerializerMethodField()
    amount = serializers.DecimalField(source="cost.amount", allow_null=True, **MONEY)
    status = serializers.ChoiceField(source="cost.status", choices=CALL_COST_STATUSES)
    priceSource = serializers.CharField(
        source="cost.source", help_text="`override`, `genai-prices`, or empty when not priced."
    )

    class Meta:
        ref_name = "CallCost"

    def get_source(self, view) -> str:
        return str((view.event.details or {}).get("source") or "")

    def get_model(self, view) -> str:
        return str((view.event.details or {}).get("model") or "")


class TraceCostSerializer(RunCostSerializer):
    calls = serializers.SerializerMethodField()

    class Meta:
        ref_name = "TraceCost"

    @extend_schema_field(CallCostSerializer(many=True))
    def get_calls(self, run):
        return CallCostSerializer(self.context["trace"].call_costs, many=True).data


class RunIdentitySerializer(serializers.Serializer):
    """The fields that name a run and its decisions, shared by the run list and the trace."""

    runId = serializers.CharField(source="run_id")
    sessionId = serializers.CharField(source="session_id")
    query = serializers.CharField()
    status = serializers.ChoiceField(choices=RunStatus.values)
    agentFlow = serializers.CharField(source="agent_flow")
    intent = serializers.ChoiceField(choices=Intent.values, allow_null=True)
    releaseDecision = serializers.ChoiceField(
        source="release_decision", choices=ReleaseDecision.values, allow_null=True
    )


class TraceRunSerializer(RunIdentitySerializer):
    content = serializers.CharField()
    error = serializers.SerializerMethodField()
    provider = serializers.SerializerMethodField()
    timing = RunTimingSerializer(source="*")
    tokens = RunTokensSerializer(source="*")
    cost = TraceCostSerializer(source="*")
    delivery = RunDeliverySerializer(source="*")
    stepCount = serializers.SerializerMethodField()
    toolCallCount = serializers.SerializerMethodField()
    feedback = serializers.SerializerMethodField()
    selfEvaluation = serializers.JSONField(
        source="self_evaluation",
        allow_null=True,
        help_text="AI Ops runs: signals computed from the run's own record when it ended (evidence cited "
        "vs gathered, tool failures, guard retries, calls without usage, plan steps planned vs done) and "
        "the model's own stated confidence under `statedByModel` (its claim, not a measurement). Null "
        "for chat runs.",
    )

    class Meta:
        ref_name = "TraceRun"

    @extend_schema_field(RunErrorSerializer(allow_null=True))
    def get_error(self, run):
        return RunErrorSerializer(run).data if run.error_code else None

    @extend_schema_field(ProviderSerializer(allow_null=True))
    def get_provider(self, run):
        provider = self.context["trace"].provider
        return ProviderSerializer(provider).data if provider is not None else None

    def get_stepCount(self, run) -> int:
        return self.context["trace"].summary.returned.steps

    def get_toolCallCount(self, run) -> int:
        return self.context["trace"].summary.returned.tools

    @extend_schema_field(FeedbackSerializer(allow_null=True))
    def get_feedback(self, run):
        feedback = self.context["trace"].feedback
        return FeedbackSerializer(feedback).data if feedback is not None else None


class TimelineEventSerializer(serializers.Serializer):
    sequenceNo = serializers.IntegerField(source="sequence_no")
    phase = serializers.ChoiceField(choices=Phase.values)
    eventType = serializers.ChoiceField(
        source="event_type",
        # Declared in `audit.events`: the schema's enum lists each type with what it records.
        choices=[(spec.type, spec.doc) for spec in EVENTS],
    )
    status = serializers.CharField()
    summary = serializers.CharField()
    details = serializers.JSONField(help_text="Bounded event facts (strings ≤ 500 characters).")
    createdAt = serializers.DateTimeField(source="created_at")
    hash = serializers.CharField(help_text="sha256(prev hash + canonical JSON of the event).")

    class Meta:
        ref_name = "TimelineEvent"


class StepSerializer(serializers.Serializer):
    stepIndex = serializers.IntegerField(source="step_index")
    agentName = serializers.CharField(source="agent_name")
    model = serializers.CharField()
    hasToolCall = serializers.BooleanField(source="has_tool_call")
    finishReason = serializers.CharField(source="finish_reason")
    durationMs = serializers.IntegerField(source="duration_ms", allow_null=True)
    promptTokens = serializers.IntegerField(source="prompt_tokens", allow_null=True)
    completionTokens = serializers.IntegerField(source="completion_tokens", allow_null=True)
    reasoningTokens = serializers.IntegerField(source="reasoning_tokens", allow_null=True)
    cachedTokens = serializers.IntegerField(source="cached_tokens", allow_null=True)
    totalTokens = serializers.IntegerField(source="total_tokens", allow_null=True)
    usageAvailable = serializers.BooleanField(source="usage_available")
    reasoningAvailable = serializers.BooleanField(source="reasoning_available")
    reasoningBytes = serializers.IntegerField(source="reasoning_bytes")
    assistantBytes = serializers.IntegerField(source="assistant_bytes")
    contentSource = serializers.ChoiceField(source="content_source", choices=ContentSource.values)

    class Meta:
        ref_name = "TraceStep"


class ToolSerializer(serializers.Serializer):
    toolCallId = serializers.CharField(source="tool_call_id", help_text="Unique in the run.")
    providerToolCallId = serializers.CharField(
        source="provider_tool_call_id",
        help_text="The id as the provider sent it (some providers reuse ids across responses).",
    )
    stepIndex = serializers.IntegerField(source="step_index", allow_null=True)
    agentName = serializers.SerializerMethodField(
        help_text="The agent whose step (`stepIndex`) declared the call; each agent counts its own steps."
    )
    toolName = serializers.CharField(source="tool_name")
    status = serializers.ChoiceField(choices=ToolStatus.values)
    inputParams = serializers.JSONField(source="input_params")
    outputPreview = serializers.CharField(source="output_preview")
    outputLength = serializers.IntegerField(source="output_length", allow_null=True)
    outputSha256 = serializers.CharField(source="output_sha256")
    isTruncated = serializers.BooleanField(source="is_truncated")
    retrievalLayer = serializers.CharField(source="retrieval_layer")
    l0MatchCount = serializers.IntegerField(source="l0_match_count", allow_null=True)
    l1MatchCount = serializers.IntegerField(source="l1_match_count", allow_null=True)
    retrievalDetails = serializers.JSONField(source="retrieval_details")
    startedAt = serializers.DateTimeField(source="started_at", allow_null=True)
    finishedAt = serializers.DateTimeField(source="finished_at", allow_null=True)
    durationMs = serializers.IntegerField(source="duration_ms", allow_null=True)
    errorCode = serializers.CharField(source="error_code")
    errorMessage = serializers.CharField(source="error_message")

    class Meta:
        ref_name = "TraceTool"

    def get_agentName(self, tool) -> str:
        return tool.agent_name or CHAT_AGENT_NAME


class CountsSerializer(serializers.Serializer):
    events = serializers.IntegerField()
    steps = serializers.IntegerField()
    tools = serializers.IntegerField()

    class Meta:
        ref_name = "TraceCounts"


class TraceAnchorSerializer(serializers.Serializer):
    checkpoint = serializers.CharField(help_text="Hash of the first checkpoint covering the run.")
    treeSize = serializers.IntegerField(source="tree_size", help_text="That checkpoint's tree size.")
    leafIndex = serializers.IntegerField(source="leaf_index", help_text="The run's leaf in the log.")
    signedAt = serializers.DateTimeField(source="signed_at", help_text="When that checkpoint was signed.")

    class Meta:
        ref_name = "TraceAnchor"


class TraceSummarySerializer(serializers.Serializer):
    persisted = CountsSerializer(help_text="Rows stored under the run's id.")
    expected = CountsSerializer(
        help_text="Rows the recorder attempted to write, as its hash chain records them."
    )
    returned = CountsSerializer(help_text="Rows in this response.")
    auditComplete = serializers.BooleanField(
        source="audit_complete",
        help_text="Run terminal, persisted == expected == returned for all three, no write failure, chain "
        "valid, every stored row matches its digest in the chain, no tool still RUNNING.",
    )
    auditWriteFailures = serializers.IntegerField(source="audit_write_failures")
    fencedWrites = serializers.IntegerField(
        source="fenced_writes",
        help_text="Writes of a previous lease owner refused by the lease fence after another process "
        "took the run over (none of their rows is stored).",
    )
    chainValid = serializers.BooleanField(source="chain_valid")
    rowsVerified = serializers.BooleanField(
        source="rows_verified",
        help_text="Every stored row (steps, tools, reasoning rows, the run's terminal summary) is bound "
        "into the hash chain and its digest, recomputed from the stored columns, matches.",
    )
    rowsVerifiedCount = serializers.IntegerField(
        source="rows_verified_count",
        help_text="How many stored rows matched the digest bound in the hash chain.",
    )
    anchor = TraceAnchorSerializer(
        allow_null=True,
        help_text="Where the run is anchored in the transparency log; null until a checkpoint covers it.",
    )
    gaps = serializers.ListField(
        child=serializers.CharField(), help_text="What is missing, in words (never content)."
    )

    class Meta:
        ref_name = "TraceSummary"


class ReviewSerializer(serializers.Serializer):
    """One human review of the run (`audit.read.ReviewView`); reviews are append-only, a later one
    supersedes an earlier one in display (`superseded`), none is ever changed."""

    reviewId = serializers.CharField(source="review_id")
    verdict = serializers.ChoiceField(choices=ReviewVerdict.values)
    note = serializers.CharField(allow_blank=True)
    reviewer = serializers.CharField(help_text="The reviewer's username when the review was recorded.")
    sequenceNo = serializers.IntegerField(
        source="sequence_no", help_text="The REVIEW_RECORDED event of the run's timeline that binds it."
    )
    createdAt = serializers.DateTimeField(source="created_at")
    superseded = serializers.BooleanField(help_text="A later review of this run exists.")

    class Meta:
        ref_name = "RunReview"


class TraceSerializer(serializers.Serializer):
    """A `audit.read.Trace` in the contract's shape."""

    sessionId = serializers.CharField(source="session_id")
    runResolution = serializers.ChoiceField(
        source="run_resolution", choices=[RunResolution.EXACT, RunResolution.LATEST]
    )
    run = serializers.SerializerMethodField()
    timeline = TimelineEventSerializer(many=True)
    steps = StepSerializer(many=True)
    tools = ToolSerializer(many=True)
    summary = TraceSummarySerializer()
    reviews = ReviewSerializer(many=True, help_text="Human reviews of the run, oldest first.")

    class Meta:
        ref_name = "Trace"

    @extend_schema_field(TraceRunSerializer)
    def get_run(self, trace):
        return TraceRunSerializer(trace.run, context={**self.context, "trace": trace}).data


def serialize_trace(trace) -> dict:
    """The API's JSON-ready trace body (for callers outside a DRF view, e.g. the admin export)."""
    return TraceSerializer(trace).data


# --------------------------------------------------------------------------------------------------
# Legal holds (`audit.write.retention`)
# --------------------------------------------------------------------------------------------------
class LegalHoldSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    scope = serializers.ChoiceField(choices=["SESSION", "RUN"])
    targetId = serializers.CharField(source="target_id", help_text="The session id or run id held.")
    reason = serializers.CharField()
    placedBy = serializers.CharField(source="placed_by_username")
    placedAt = serializers.DateTimeField(source="placed_at")
    active = serializers.BooleanField(help_text="Not lifted: the records are exempt from both purges.")
    liftedBy = serializers.CharField(source="lifted_by_username")
    liftedAt = serializers.DateTimeField(source="lifted_at", allow_null=True)
    liftReason = serializers.CharField(source="lift_reason")

    class Meta:
        ref_name = "LegalHold"
