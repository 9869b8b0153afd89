"""The questions the runbooks do not answer (issue 47, item 5): the production runs of a period that were
blocked, out of scope, voted down or scored low by an online evaluator (`gap_runs`, one query), their
stored — redacted — questions grouped by `evaluations.clusters`, each group named by its terms, counted,
its runs listed, and the closest runbook the knowledge retrieval finds for its most typical question
(`find_gaps`). Never the reasoning, the answer or any other text of the runs. Read by the console page
(`surfaces.admin.gaps`) and `manage.py question_gaps`. Details: docs/admin.md, *Unanswered questions*.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from django.db.models import Exists, OuterRef, Q

from agent.knowledge.retrieval import search_knowledge
from agent.redaction import Redactor
from diagnosis.models import TERMINAL_RUN_STATUSES, DiagnosisRun, Intent, ReleaseDecision
from diagnosis.selectors import PRODUCTION
from evaluations import clusters
from evaluations.models import EvaluationScore

# A run scored below this by any evaluator (`EvaluationScore.value`, in [0, 1]) counts as low-scoring.
DEFAULT_BELOW = 0.5
# The newest runs of the period read (a period with more says so: `GapReport.capped`).
MAX_RUNS = 5000
# Distinct questions clustered (the most frequent first); the rest are counted as left out.
MAX_QUESTIONS = 1000
# Groups shown, largest first; each lists at most `RUN_LINKS` of its runs (newest first).
MAX_CLUSTERS = 50
RUN_LINKS = 20
QUESTION_CHARS = 300

BLOCKED, OUT_OF_SCOPE, DOWNVOTED, LOW_SCORE = "blocked", "out_of_scope", "downvoted", "low_score"
REASON_LABELS = {
    BLOCKED: "blocked",
    OUT_OF_SCOPE: "out of scope",
    DOWNVOTED: "voted down",
    LOW_SCORE: "low score",
}


@dataclass(frozen=True, slots=True)
class GapRun:
    pk: int
    run_id: str
    question: str
    created_at: dt.datetime
    reasons: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ClosestRunbook:
    slug: str
    title: str
    evidence_id: str
    score: float


@dataclass(slots=True)
class Gap:
    terms: list[str]
    question: str  # the group's most typical (redacted) question
    runs: int
    questions: int  # distinct questions
    reasons: dict[str, int]
    run_links: list[GapRun]
    closest: ClosestRunbook | None = None

    @property
    def label(self) -> str:
        return ", ".join(self.terms) if self.terms else "(no words to group by)"

    @property
    def statement(self) -> str:
        closest = (
            f"the closest is “{self.closest.title}” ({self.closest.evidence_id}, "
            f"score {self.closest.score:.2f})"
            if self.closest
            else "no runbook comes close"
        )
        return f"No runbook covers “{self.label}”: {closest}."


@dataclass(slots=True)
class GapReport:
    since: dt.datetime
    until: dt.datetime
    below: float
    runs: int
    capped: bool
    questions_left_out: int
    gaps: list[Gap] = field(default_factory=list)
    clusters_left_out: int = 0


def gap_runs(
    *, since: dt.datetime, until: dt.datetime, below: float = DEFAULT_BELOW, limit: int = MAX_RUNS
) -> list[GapRun]:
    """The finished production runs created in [since, until) that were blocked by the guards, routed
    out of scope, voted down, or scored below `below` by any evaluator, newest first, at most `limit`:
    one query over `diagnosis_run` (the score test an EXISTS on the score's run index), reading only
    the columns the report shows."""
    low = EvaluationScore.objects.filter(run_id=OuterRef("run_id"), value__lt=below)
    rows = (
        DiagnosisRun.objects.filter(
            PRODUCTION,
            created_at__gte=since,
            created_at__lt=until,
            status__in=TERMINAL_RUN_STATUSES,
        )
        .annotate(low_score=Exists(low))
        .filter(
            Q(release_decision=ReleaseDecision.BLOCKED)
            | Q(intent=Intent.OUT_OF_SCOPE)
            | Q(downvoted=True)
            | Q(low_score=True)
        )
        .order_by("-created_at", "-id")
        .values_list(
            "pk", "run_id", "query", "created_at", "release_decision", "intent", "downvoted", "low_score"
        )
    )
    out = []
    for pk, run_id, query, created_at, decision, intent, downvoted, low_score in rows[:limit]:
        reasons = tuple(
            key
            for key, holds in (
                (BLOCKED, decision == ReleaseDecision.BLOCKED),
                (OUT_OF_SCOPE, intent == Intent.OUT_OF_SCOPE),
                (DOWNVOTED, downvoted),
                (LOW_SCORE, low_score),
            )
            if holds
        )
        out.append(GapRun(pk, run_id, query, created_at, reasons))
    return out


def _redacted(questions: list[str]) -> list[str]:
    """Each stored question redacted once more (it was redacted before it was stored; a run older than
    redaction, or a rule added since, is covered here too), cut to `QUESTION_CHARS`."""
    redactor = Redactor()
    return [redactor.redact(q, count=False)[:QUESTION_CHARS] for q in questions]


def find_gaps(
    *,
    since: dt.datetime,
    until: dt.datetime,
    below: float = DEFAULT_BELOW,
    threshold: float = clusters.DEFAULT_THRESHOLD,
    max_clusters: int = MAX_CLUSTERS,
) -> GapReport:
    """The report of the period (module docstring). Queries: one for the runs, and the retrieval's own
    (at most its index build, once), whatever the number of runs or groups."""
    runs = gap_runs(since=since, until=until, below=below, limit=MAX_RUNS + 1)
    capped = len(runs) > MAX_RUNS
    runs = runs[:MAX_RUNS]
    by_question: dict[str, list[GapRun]] = {}
    for run in runs:
        by_question.setdefault(" ".join(run.question.split()).lower(), []).append(run)
    ranked = sorted(by_question.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    kept, left_out = ranked[:MAX_QUESTIONS], ranked[MAX_QUESTIONS:]
    texts = _redacted([group[0].question for _key, group in kept])
    weights = [len(group) for _key, group in kept]
    vectors = clusters.tfidf(texts)
    labels = clusters.agglomerate(vectors.matrix, threshold=threshold, weights=weights)
    # Questions without a term to group by (only a placeholder, only numbers) form one group.
    empty = vectors.matrix.any(axis=1) == False  # noqa: E712 (numpy element-wise)
    members: dict[int, list[int]] = {}
    for row, label in enumerate(labels):
        members.setdefault(-1 if empty[row] else label, []).append(row)
    gaps = []
    for key, rows in members.items():
        row_weights = [weights[r] for r in rows]
        group_runs = sorted(
            (run for r in rows for run in kept[r][1]), key=lambda run: (run.created_at, run.pk), reverse=True
        )
        reasons: dict[str, int] = {}
        for run in group_runs:
            for reason in run.reasons:
                reasons[reason] = reasons.get(reason, 0) + 1
        typical = clusters.medoid(vectors, rows, weights=row_weights)
        gaps.append(
            Gap(
                terms=[] if key == -1 else clusters.name_of(vectors, rows, weights=row_weights),
                question=texts[typical],
                runs=len(group_runs),
                questions=len(rows),
                reasons=reasons,
                run_links=[
                    GapRun(r.pk, r.run_id, "", r.created_at, r.reasons) for r in group_runs[:RUN_LINKS]
                ],
            )
        )
    gaps.sort(key=lambda g: (-g.runs, -g.questions, g.label))
    shown = gaps[:max_clusters]
    for gap in shown:
        gap.closest = closest_runbook(gap.question)
    return GapReport(
        since=since,
        until=until,
        below=below,
        runs=len(runs),
        capped=capped,
        questions_left_out=sum(len(group) for _key, group in left_out),
        gaps=shown,
        clusters_left_out=len(gaps) - len(shown),
    )


def closest_runbook(question: str) -> ClosestRunbook | None:
    """The runbook chunk the knowledge retrieval ranks first for `question`, with its score (the
    retrieval's own, relative to its best BM25 match plus the metadata layer's), or None."""
    found = search_knowledge(question, top_k=1)
    if not found.items:
        return None
    top = found.items[0]
    return ClosestRunbook(slug=top.slug, title=top.title, evidence_id=top.id, score=top.score)
