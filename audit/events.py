"""The event types of a run's chain, each declared once: its name, who writes it, the rows it binds and
what it means. Django-free, so that the offline verifier (`python -m audit.verify_bundle`) reads the same
declarations as the server.

Everything that enumerates event types derives from `EVENTS` (`audit.models.EventType`, the chain's
bindings, the OpenAPI enum, the admin's filter, the table of docs/architecture.md printed by
`markdown_table`). A writer is `RECORDER` (the run's recorder, under its lease) or `APPENDED` (anything
else, after the finish, through `audit.write.append_to_finished_run` alone). A new event type is one
`EventSpec` here plus the code that writes it (docs/contributing.md, *A new audit event type*).
"""

from __future__ import annotations

from dataclasses import dataclass

RECORDER = "recorder"
APPENDED = "appended"


@dataclass(frozen=True, slots=True)
class EventSpec:
    """One event type. `label`: its name for people (admin, timeline); `binds`: the `details` keys
    that carry row digests (and their forms), `row`: the rows they bind ("" for none); `doc`: what the
    event records, in one sentence (the docs entry and the OpenAPI description)."""

    type: str
    label: str
    writer: str
    doc: str
    binds: str = ""
    row: str = ""
    # (details key naming the bound row, details key carrying its digest) of an appended event whose row
    # lives in a higher layer's table, registered there (`audit.verify.appended_rows`); () for none.
    keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.writer not in (RECORDER, APPENDED):
            raise ValueError(f"{self.type}: writer must be {RECORDER!r} or {APPENDED!r}")
        if bool(self.binds) != bool(self.row):
            raise ValueError(f"{self.type}: name both the details keys it binds and the row, or neither")
        if self.keys and (len(self.keys) != 2 or self.writer != APPENDED or not self.row):
            raise ValueError(f"{self.type}: keys are (row id key, digest key) of an appended event's row")


EVENTS: tuple[EventSpec, ...] = (
    EventSpec(
        "RUN_STARTED",
        "Run started",
        RECORDER,
        "The run began executing under a lease: its flow, provider and configuration, and the digests of "
        "its identity as created.",
        binds="`startForm`, `startDigest`, `sessionForm`, `sessionDigest`, `owner`, `configFingerprint`",
        row="the run's identity as created (form `run-start`: id, session, the user's `query`, "
        "`agent_flow`, `created_at`) and its session's (form `session`: id, owner's user id, creation "
        "time), read back from the stored rows when the run starts; `owner` is the owner's username as a "
        "chained snapshot; `configFingerprint` (the run row's `config_fingerprint` must equal it) is the "
        "SHA-256 of the chained `configuration` document (prompt digests, models, parameters, tool "
        "schemas, knowledge snapshot, guards, release policy). Runs started before carry none: noted, "
        "not failed",
    ),
    EventSpec(
        "REDACTION_APPLIED",
        "Secrets redacted",
        RECORDER,
        "Secrets (and, when configured, personal data) were replaced by placeholders before the text was "
        "sent or stored: where (question, previous turns, tool input or output), the kinds and counts, and "
        "per distinct original its placeholder and keyed HMAC-SHA256 with the key's id, never the original.",
    ),
    EventSpec(
        "ROUTING_ATTEMPT",
        "Router call",
        RECORDER,
        "One call of the router model: its attempts, usage and the reasoning row it produced.",
        binds="`reasoningDigest`, `reasoningStepIndex`",
        row="the call's reasoning row (agent `router`, a negative step index)",
    ),
    EventSpec(
        "ROUTING_DECISION",
        "Route chosen",
        RECORDER,
        "The intent the run was routed to, and whether it was the fallback.",
    ),
    EventSpec(
        "MODEL_TOKEN_USAGE",
        "Token usage",
        RECORDER,
        "One model call's token usage as the provider reported it (null, never 0, when it reported none), "
        "by source (router, agent, guard).",
    ),
    EventSpec(
        "AGENT_MODEL_STEP",
        "Model step",
        RECORDER,
        "One model call of an agent: bounded input and output summaries, the tool calls it declared.",
        binds="`stepDigest`, `reasoningDigest`",
        row="the step row, named by its `agentName` and `stepIndex` (each agent counts its steps from 1); "
        "the reasoning row (same step index and agent)",
    ),
    EventSpec(
        "TOOL_INVOCATION",
        "Tool call",
        RECORDER,
        "A tool call's lifecycle step: RUNNING before it executes, one terminal (SUCCEEDED, FAILED, "
        "INTERRUPTED, ABANDONED), or a refusal (REFUSED, CONFLICT).",
        binds="`rowDigest`, `rowForm`",
        row="the RUNNING row as inserted, in form `tool/2` (with the declaring step's `agent_name`; rows "
        "recorded before it name no form and verify as `tool`); a terminal binds the row after its "
        "terminal update (also when the RUNNING row never committed and the terminal row is inserted "
        "instead: the same row)",
    ),
    EventSpec(
        "EVIDENCE_GUARD_INITIAL",
        "Evidence check",
        RECORDER,
        "Whether the draft cites the knowledge it was given.",
    ),
    EventSpec(
        "EVIDENCE_GUARD_RETRY",
        "Evidence check (retry)",
        RECORDER,
        "The evidence check of the draft written again after the first one failed.",
    ),
    EventSpec(
        "SEMANTIC_GUARD_DECISION",
        "Semantic check",
        RECORDER,
        "The semantic guard model's verdict on whether the cited evidence supports the draft.",
        binds="`reasoningDigest`, `reasoningStepIndex`",
        row="the guard call's reasoning row (agent `semantic_guard`, a negative step index)",
    ),
    EventSpec(
        "RELEASE_DECISION",
        "Release",
        RECORDER,
        "What was released to the reader: PUBLISHED or BLOCKED (WITHDRAWN when the run then failed).",
    ),
    EventSpec(
        "PLAN_DECISION",
        "Plan",
        RECORDER,
        "The AI Ops planner's plan (accepted, unusable, fallback or revised); the plan itself is in the "
        "event, no row.",
    ),
    EventSpec("RUN_CANCELLED", "Cancelled", RECORDER, "The run was cancelled and stopped at a safe point."),
    EventSpec(
        "RUN_FINISHED",
        "Run finished",
        RECORDER,
        "The run's end: its status and the counts of events, steps, tools and reasoning rows its recorder "
        "attempted.",
        binds="`runForm`, `runDigest`, `expected`",
        row="the run's terminal summary (status, release decision, error code, sha256 of `content`, token "
        "ledger, `model_calls`, `usage_unavailable_calls`, `tokens_reconciled`, `expected_*`; form `run/2` "
        "adds what the reader could see: `release_mode`, `draft_chars`, `last_token_at`, "
        "`release_latency_ms`; form `run/3` adds `self_evaluation`, NULL for chat runs; form `run/4` adds "
        "`intent`, `error_message`, `provider`, `finished_at`)",
    ),
    EventSpec(
        "WRITE_FENCED",
        "Stale writes refused",
        RECORDER,
        "How many writes of a previous lease owner the fence refused, written by the current owner.",
    ),
    EventSpec(
        "APPROVAL_REQUESTED",
        "Approval requested",
        RECORDER,
        "A call of a tool that requires approval waits for a person: its arguments and their digest, who "
        "may decide, when the request expires.",
    ),
    EventSpec(
        "APPROVAL_DECIDED",
        "Approval decided",
        RECORDER,
        "A waiting call was approved, rejected or expired: by whom, when, on exactly which arguments "
        "(written by whoever claimed the interrupted run).",
    ),
    EventSpec(
        "RUN_INTERRUPTED",
        "Waiting for approval",
        RECORDER,
        "The attempt ended waiting for decisions on its pending calls, or (`handover: true`) a draining "
        "process handed the run over at a step boundary; the run is not over.",
    ),
    EventSpec(
        "RUN_RESUMED",
        "Resumed",
        RECORDER,
        "A worker claimed the interrupted or handed-over run (a new lease epoch) and continues it.",
    ),
    EventSpec(
        "REASONING_PURGED",
        "Reasoning purged",
        APPENDED,
        "Reasoning rows of the run were purged by age or by request.",
        binds="`rows`",
        row="each purged reasoning row: id, step index, agent, digest of what is now stored",
    ),
    EventSpec(
        "REASONING_REKEYED",
        "Reasoning re-encrypted",
        APPENDED,
        "Reasoning rows of the run were re-encrypted under the newest key.",
        binds="`rows`",
        row="each re-encrypted reasoning row: id, step index, agent, digest of what is now stored",
    ),
    EventSpec(
        "REVIEW_RECORDED",
        "Review",
        APPENDED,
        "An auditor's verdict on the finished run (correct, incorrect, unsafe, needs follow-up).",
        binds="`reviewDigest`",
        row="the review row (`audit_run_review`, form `review`), named by its `reviewId`, inserted in the "
        "same transaction by `audit.write.reviews.record_review`",
    ),
    EventSpec(
        "FEEDBACK_RECORDED",
        "Reader feedback",
        APPENDED,
        "A reader's vote on the run's answer (up or down; a later vote by the same reader supersedes it): "
        "who, the rating, the comment's length and sha256, never the comment.",
    ),
    EventSpec(
        "EVALUATION_RECORDED",
        "Evaluation score",
        APPENDED,
        "An online evaluator scored the finished run: the evaluator's name, version and kind, the score's "
        "value and label, the explanation's length and sha256, and for an LLM judge its model, token "
        "usage, cost and reasoning row.",
        binds="`scoreDigest`; `reasoningDigest` (with `agentName` `judge`, `reasoningStepIndex`)",
        row="the score row (`evaluations_score`, form `evaluation-score`), named by its `scoreId`, inserted "
        "in the same transaction by `evaluations.recording`; a judge's reasoning row (agent `judge`, step "
        "index the event's sequence number)",
        keys=("scoreId", "scoreDigest"),
    ),
)

BY_TYPE: dict[str, EventSpec] = {spec.type: spec for spec in EVENTS}
if len(BY_TYPE) != len(EVENTS):
    raise ValueError("an event type is declared twice")
# Events appended to a finished run's chain by others than its recorder (see the module docstring).
APPENDED_EVENTS = frozenset(spec.type for spec in EVENTS if spec.writer == APPENDED)
# Appended events binding a row of a higher layer's table: type -> (row id key, digest key).
KEYED_ROWS: dict[str, tuple[str, ...]] = {spec.type: spec.keys for spec in EVENTS if spec.keys}


def label(event_type: str) -> str:
    """The event type's name for people; an unknown type (a newer server's) as it is."""
    spec = BY_TYPE.get(event_type)
    return spec.label if spec is not None else event_type


def markdown_table() -> str:
    """The table of docs/architecture.md, *What a record proves*: every event type, who writes it, and
    the rows it binds."""
    lines = ["| event | written by | details key | row it binds |", "|---|---|---|---|"]
    for spec in EVENTS:
        writer = "its recorder" if spec.writer == RECORDER else "appended after the finish"
        lines.append(f"| `{spec.type}` | {writer} | {spec.binds or '—'} | {spec.row or '—: ' + spec.doc} |")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m audit.events: the table for docs/architecture.md
    print(markdown_table())
