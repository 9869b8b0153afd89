"""Scores that need a human (`diagnosis.review_queue`): a run with a score labelled `unsupported` (an
LLM judge found claims the evidence does not support) or `forbidden` (a forbidden command in the
released answer) joins the review queue under the reason `evaluation`, until reviewed. The score's
writer refreshes the run's flag in the score's own transaction (`refresh`); `verify_audit` recomputes
it with the same rule."""

from __future__ import annotations

from django.db.models import Q

from diagnosis.review_queue import Reason, refresh_needs_review, register_reason
from evaluations.models import NEEDS_HUMAN_LABELS, EvaluationScore

KEY = "evaluation"


def reason() -> Reason:
    flagged = EvaluationScore.objects.filter(label__in=NEEDS_HUMAN_LABELS).values("run_id")
    return Reason(KEY, "flagged by an online evaluator", Q(run_id__in=flagged))


def register() -> None:
    register_reason(reason())


def refresh(run_id: str) -> None:
    refresh_needs_review(run_ids=[run_id])
