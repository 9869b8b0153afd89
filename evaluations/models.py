"""Online evaluators and the scores they give finished runs (issue 34 item 2).

`Evaluator`: a name and a version (a new version is a new row), a kind (an LLM judge, or a deterministic
check), a filter on the run and a deterministic sampling rate. `EvaluationScore`: one evaluator
version's score of one run, unique per pair (the fence against scoring twice), bound into the run's
chain by its `EVALUATION_RECORDED` event. `EvaluationClaim`: a worker's claim on a pair while it scores
it (operational state, no evidence).
Details: docs/evaluations.md.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

DEFAULT_FORBIDDEN = "\n".join(
    (
        r"\brm\s+-[a-zA-Z]*r[a-zA-Z]*f\b",
        r"\brm\s+-[a-zA-Z]*f[a-zA-Z]*r\b",
        r"\bmkfs(\.\w+)?\b",
        r"\bdd\s+if=.*\bof=/dev/",
        r":\(\)\s*\{\s*:\|:&\s*\};:",
        r"\bchmod\s+-R\s+777\s+/",
    )
)

DEFAULT_JUDGE_PROMPT = """You grade an answer given to an operator by a diagnosis agent.
Decide whether every claim of the answer is supported by the evidence quoted below (runbook chunks
the answer cites by id). Reply with one JSON object and nothing else:
{"score": <0.0 to 1.0, the share of claims supported>, "label": "supported" | "partially_supported" |
"unsupported", "explanation": "<one or two sentences>"}

Question:
{question}

Answer:
{answer}

Evidence:
{evidence}
"""


class EvaluatorKind(models.TextChoices):
    LLM_JUDGE = "llm_judge", "LLM judge"
    CITATION_COVERAGE = "citation_coverage", "Citation coverage"
    ANSWER_LENGTH = "answer_length", "Answer length bounds"
    FORBIDDEN_COMMANDS = "forbidden_commands", "Forbidden commands"
    LATENCY_BOUND = "latency_bound", "Latency bound"
    COST_BOUND = "cost_bound", "Cost bound"
    # The incident benchmark's diagnosis scorers (evaluations.diagnosis; docs/benchmark.md)
    DIAGNOSIS_SCORE = "diagnosis_score", "Diagnosis: scenario score"
    DIAGNOSIS_CITED_CHUNK = "diagnosis_cited_chunk", "Diagnosis: cited the expected chunk"
    DIAGNOSIS_ROOT_CAUSE = "diagnosis_root_cause", "Diagnosis: named the root cause"
    DIAGNOSIS_TOOLS = "diagnosis_tools", "Diagnosis: called the needed tools"
    DIAGNOSIS_NO_FORBIDDEN = "diagnosis_no_forbidden", "Diagnosis: took no forbidden action"
    DIAGNOSIS_EFFICIENCY = "diagnosis_efficiency", "Diagnosis: tool-call efficiency"
    DIAGNOSIS_DECLINED = "diagnosis_declined", "Diagnosis: declined correctly"


# The labels that put a run in the review queue (`diagnosis.review_queue`): an answer a judge found
# unsupported, a forbidden command in a released answer.
NEEDS_HUMAN_LABELS = ("unsupported", "forbidden")


def _csv(value: str) -> list[str]:
    return [part.strip() for part in (value or "").split(",") if part.strip()]


class Evaluator(models.Model):
    """One version of an online evaluator (see the module docstring). Once it has scored a run its
    configuration is frozen (the admin shows it read-only; "new version" copies it to the next
    version); only `enabled` may change."""

    name = models.CharField(max_length=100)
    version = models.PositiveIntegerField(default=1)
    kind = models.CharField(max_length=32, choices=EvaluatorKind.choices)
    enabled = models.BooleanField(default=True)
    description = models.CharField(max_length=500, blank=True, default="")
    # LLM judge
    judge_model = models.CharField(
        max_length=200,
        blank=True,
        default="",
        help_text="Model id; empty: the guard model (LLM_GUARD_MODEL).",
    )
    judge_prompt = models.TextField(
        blank=True,
        default="",
        help_text="Template with {question}, {answer}, {evidence}; empty: the built-in grading prompt.",
    )
    # Deterministic bounds
    min_coverage = models.FloatField(
        default=0.8,
        validators=[MinValueValidator(0.0), MaxValueValidator(1.0)],
        help_text="Citation coverage: the share of claims citing evidence below which the label is "
        "'uncovered'.",
    )
    min_chars = models.PositiveIntegerField(null=True, blank=True)
    max_chars = models.PositiveIntegerField(null=True, blank=True)
    forbidden_patterns = models.TextField(
        blank=True, default=DEFAULT_FORBIDDEN, help_text="Forbidden commands: one regular expression a line."
    )
    max_latency_ms = models.PositiveIntegerField(null=True, blank=True)
    max_cost_usd = models.DecimalField(max_digits=20, decimal_places=10, null=True, blank=True)
    # Which runs
    flows = models.CharField(max_length=200, blank=True, default="", help_text="Comma-separated; empty: all.")
    intents = models.CharField(
        max_length=200, blank=True, default="", help_text="Comma-separated; empty: all."
    )
    release_decisions = models.CharField(
        max_length=200, blank=True, default="", help_text="Comma-separated; empty: all."
    )
    sample_rate = models.FloatField(
        default=1.0,
        validators=[MinValueValidator(0.0), MaxValueValidator(1.0)],
        help_text="Share of matching runs scored (by a hash of the evaluator's name and the run id).",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name", "-version"]
        constraints = [
            models.UniqueConstraint(fields=["name", "version"], name="uniq_evaluator_name_version")
        ]

    def __str__(self) -> str:
        return f"{self.name} v{self.version}"

    @property
    def label(self) -> str:
        return f"{self.name} v{self.version}"

    def flow_list(self) -> list[str]:
        return _csv(self.flows)

    def intent_list(self) -> list[str]:
        return _csv(self.intents)

    def release_list(self) -> list[str]:
        return _csv(self.release_decisions)

    def clean(self) -> None:
        import re

        errors: dict[str, str] = {}
        if self.kind == EvaluatorKind.ANSWER_LENGTH and self.min_chars is None and self.max_chars is None:
            errors["max_chars"] = "An answer-length evaluator needs a minimum or a maximum."
        if self.min_chars is not None and self.max_chars is not None and self.min_chars > self.max_chars:
            errors["max_chars"] = "The maximum is below the minimum."
        if self.kind == EvaluatorKind.LATENCY_BOUND and self.max_latency_ms is None:
            errors["max_latency_ms"] = "A latency bound needs its maximum."
        if self.kind == EvaluatorKind.COST_BOUND and self.max_cost_usd is None:
            errors["max_cost_usd"] = "A cost bound needs its maximum."
        if self.kind == EvaluatorKind.FORBIDDEN_COMMANDS:
            for line in (self.forbidden_patterns or "").splitlines():
                if line.strip():
                    try:
                        re.compile(line.strip())
                    except re.error as exc:
                        errors["forbidden_patterns"] = f"Not a regular expression: {line.strip()!r} ({exc})"
        if self.kind == EvaluatorKind.LLM_JUDGE and self.judge_prompt:
            missing = [k for k in ("{question}", "{answer}") if k not in self.judge_prompt]
            if missing:
                errors["judge_prompt"] = f"The prompt must contain {', '.join(missing)}."
        if errors:
            raise ValidationError(errors)


class EvaluationScore(models.Model):
    """One evaluator version's score of one finished run (see the module docstring). `value` is in
    [0, 1] (None: not measurable, e.g. an unpriced run under a cost bound, or a judge that failed);
    `label` a word (`supported`, `covered`, `forbidden`, …); the judge columns are empty for a
    deterministic evaluator. `fingerprint`: the run's configuration fingerprint when it was scored."""

    score_id = models.CharField(max_length=64, unique=True)
    run_id = models.CharField(max_length=64)
    session_id = models.CharField(max_length=64)
    evaluator = models.ForeignKey(Evaluator, on_delete=models.PROTECT, related_name="scores")
    evaluator_name = models.CharField(max_length=100)
    evaluator_version = models.PositiveIntegerField()
    kind = models.CharField(max_length=32, choices=EvaluatorKind.choices)
    value = models.FloatField(null=True, blank=True)
    label = models.CharField(max_length=32)
    explanation = models.TextField(blank=True, default="")
    fingerprint = models.CharField(max_length=64, blank=True, default="")
    judge_model = models.CharField(max_length=200, blank=True, default="")
    judge_input_tokens = models.IntegerField(null=True, blank=True)
    judge_output_tokens = models.IntegerField(null=True, blank=True)
    judge_reasoning_tokens = models.IntegerField(null=True, blank=True)
    judge_cost_usd = models.DecimalField(max_digits=20, decimal_places=10, null=True, blank=True)
    judge_cost_status = models.CharField(max_length=32, blank=True, default="")
    judge_duration_ms = models.IntegerField(null=True, blank=True)
    sequence_no = models.IntegerField()
    created_at = models.DateTimeField()

    class Meta:
        db_table = "evaluations_score"
        ordering = ["run_id", "sequence_no"]
        constraints = [
            models.UniqueConstraint(fields=["run_id", "evaluator"], name="uniq_score_run_evaluator"),
        ]
        indexes = [
            models.Index(fields=["evaluator", "created_at"], name="idx_score_evaluator_created"),
            models.Index(fields=["fingerprint", "created_at"], name="idx_score_fingerprint_created"),
            models.Index(fields=["label", "created_at"], name="idx_score_label_created"),
        ]

    def __str__(self) -> str:
        return f"{self.evaluator_name} v{self.evaluator_version} on {self.run_id}: {self.label}"

    @property
    def needs_human(self) -> bool:
        return self.label in NEEDS_HUMAN_LABELS


class EvaluationClaim(models.Model):
    """A worker's claim on scoring one run with one evaluator (unique per pair: the first insert wins;
    a claim older than `EVALUATION_CLAIM_SECONDS` is taken over by a conditional update)."""

    run_id = models.CharField(max_length=64)
    evaluator = models.ForeignKey(Evaluator, on_delete=models.CASCADE, related_name="+")
    owner = models.CharField(max_length=128)
    claimed_at = models.DateTimeField()
    attempts = models.IntegerField(default=1)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run_id", "evaluator"], name="uniq_claim_run_evaluator")
        ]

    def __str__(self) -> str:
        return f"{self.run_id} by {self.owner}"
