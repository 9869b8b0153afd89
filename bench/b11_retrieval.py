"""B11 — retrieval quality: recall@1, recall@3 and MRR of the expected runbook.

Two question sets, each asked of `agent.knowledge.retrieval.search_knowledge` (the `lookup_knowledge`
tool's own search, at its largest `top_k`) over the shipped runbooks (`runbooks/`, loaded as a corpus by
`agent.knowledge.corpus.corpus_from_folder`, which parses, chunks and indexes exactly as `load_knowledge`
does; nothing is written to the database):

* the paraphrase set, `benchmarks/retrieval/questions.yaml`: operator questions with typos,
  abbreviations, symptoms rather than titles, in English and Chinese, each language asking about runbooks
  written in the other; its held-out part (`holdout: true`, written with the rest before any tuning) is
  reported on its own;
* the incident scenarios' questions, `benchmarks/incidents/*/scenario.yaml` (`question` and
  `expected.runbooks`; the format is docs/benchmark.md's). A scenario without a question (an alert-only
  AI Ops scenario) or with `expected.runbooks: []` (no runbook covers it) is skipped and counted as
  skipped: whether the agent declines there is the diagnosis scorers' question, not retrieval's.

A question's rank is the position of the first runbook among its `expected` slugs in the order the
search returns runbooks (each runbook at the rank of its best chunk); recall@k counts questions with
rank ≤ k, MRR averages 1/rank (0 when no expected runbook is returned). The measurement is a ranking:
deterministic, the same on every machine, so it needs no repetitions (the table's n is 1).

`python -m bench --only b11` (in the default set; no database work, a few seconds).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

from bench.stats import Row, Spread

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = ROOT / "benchmarks" / "retrieval" / "questions.yaml"
INCIDENTS = ROOT / "benchmarks" / "incidents"
RUNBOOKS = ROOT / "runbooks"
TARGET_R1 = 0.9
TARGET_R3 = 0.97
SEARCH_TOP_K = 10  # retrieval.MAX_TOP_K: every runbook the tool could return


@dataclass(frozen=True)
class Question:
    question: str
    language: str
    expected: tuple[str, ...]
    kind: str
    holdout: bool = False
    source: str = "paraphrase"  # or "scenario:<id>"


@dataclass(frozen=True)
class Scores:
    n: int
    recall1: float
    recall3: float
    mrr: float

    def text(self) -> str:
        return f"R@1 {self.recall1:.3f}  R@3 {self.recall3:.3f}  MRR {self.mrr:.3f}  (n={self.n})"


def load_questions(path: Path = QUESTIONS) -> list[Question]:
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return [
        Question(
            question=str(q["question"]),
            language=str(q["language"]),
            expected=tuple(q["expected"]),
            kind=str(q["kind"]),
            holdout=bool(q.get("holdout", False)),
        )
        for q in data.get("questions", [])
    ]


def load_scenarios(root: Path = INCIDENTS) -> tuple[list[Question], list[str]]:
    """The scenario questions with an expected runbook, and the ids of the scenarios skipped (no question,
    or `expected.runbooks: []`). No folder yet: nothing, nothing skipped."""
    questions: list[Question] = []
    skipped: list[str] = []
    for path in sorted(root.glob("*/scenario.yaml")) if root.is_dir() else []:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        sid = str(data.get("id") or path.parent.name)
        expected = tuple((data.get("expected") or {}).get("runbooks") or ())
        question = data.get("question")
        if not question or not expected:
            skipped.append(sid)
            continue
        tags = [str(t) for t in data.get("tags") or []]
        questions.append(
            Question(
                question=str(question),
                language=str(data.get("language", "en")),
                expected=expected,
                kind="cross-language" if "cross-language" in tags else "scenario",
                source=f"scenario:{sid}",
            )
        )
    return questions, skipped


def runbook_ranking(query: str) -> list[str]:
    """The runbooks `search_knowledge` returns for `query`, best first, each once."""
    from agent.knowledge.retrieval import search_knowledge

    slugs: list[str] = []
    for item in search_knowledge(query, top_k=SEARCH_TOP_K).items:
        if item.slug not in slugs:
            slugs.append(item.slug)
    return slugs


def rank_of(question: Question, ranking: list[str]) -> int:
    """1-based rank of the first expected runbook in `ranking`, 0 when none is there."""
    return next((i for i, slug in enumerate(ranking, start=1) if slug in question.expected), 0)


def score(ranks: Iterable[int]) -> Scores:
    ranks = list(ranks)
    n = len(ranks)
    if not n:
        return Scores(0, float("nan"), float("nan"), float("nan"))
    return Scores(
        n=n,
        recall1=sum(1 for r in ranks if r == 1) / n,
        recall3=sum(1 for r in ranks if 1 <= r <= 3) / n,
        mrr=sum(1 / r for r in ranks if r) / n,
    )


def runbook_language(slug: str) -> str:
    return "zh" if slug.endswith("-zh") else "en"


def is_cross(question: Question) -> bool:
    return all(runbook_language(slug) != question.language for slug in question.expected)


def evaluate(
    questions: list[Question], ranking: Callable[[str], list[str]] = runbook_ranking
) -> list[tuple[Question, int, list[str]]]:
    out = []
    for q in questions:
        found = ranking(q.question)
        out.append((q, rank_of(q, found), found))
    return out


def breakdown(results: list[tuple[Question, int, list[str]]]) -> dict[str, Scores]:
    """Scores overall and per group: held-out/tuning part, language, kind, cross-language or not."""
    groups: dict[str, list[int]] = {"all": []}
    for q, rank, _found in results:
        keys = [
            "all",
            "holdout" if q.holdout else "tuning",
            f"language={q.language}",
            f"kind={q.kind}",
            "cross-language" if is_cross(q) else "same-language",
        ]
        for key in keys:
            groups.setdefault(key, []).append(rank)
    return {key: score(ranks) for key, ranks in groups.items()}


def with_corpus(fn: Callable[[], object], corpus=None) -> object:
    """`fn()` with `corpus` (by default the shipped runbooks, indexed now) as the knowledge base."""
    from agent.knowledge.corpus import corpus_from_folder, use_corpus
    from agent.knowledge.retrieval import reset_override

    token = use_corpus(corpus if corpus is not None else corpus_from_folder(RUNBOOKS))
    try:
        return fn()
    finally:
        reset_override(token)


def _rows(label: str, scores: dict[str, Scores], *, targets: bool) -> list[Row]:
    """The table's rows: overall (with the targets), held out, cross-language and per language; every
    group is in the B11 section of docs/performance.md."""
    rows = []
    for key in ("all", "holdout", "cross-language", "language=en", "language=zh"):
        s = scores.get(key)
        if s is None or not s.n:
            continue
        name = f"{label}: {key}"
        main = targets and key == "all"
        rows.append(
            Row(
                "B11",
                name + " — recall@3",
                s.text(),
                Spread(s.recall3, s.recall3, s.recall3, 1),
                TARGET_R3 if main else None,
                goal="min",
                ratio_unit="",
            )
        )
        if main:
            rows.append(
                Row(
                    "B11",
                    name + " — recall@1",
                    s.text(),
                    Spread(s.recall1, s.recall1, s.recall1, 1),
                    TARGET_R1,
                    goal="min",
                    ratio_unit="",
                )
            )
    return rows


def misses(results: list[tuple[Question, int, list[str]]]) -> list[str]:
    return [
        f"rank {rank or '–'}{' (held out)' if q.holdout else ''}: {q.question!r} → expected "
        f"{'/'.join(q.expected)}, got {', '.join(found[:3])}"
        for q, rank, found in results
        if rank != 1
    ]


def run_all(*, log=print, verbose: bool = False, corpus=None) -> tuple[list[Row], dict]:
    questions = load_questions()
    scenario_questions, skipped = load_scenarios()

    def measure():
        return evaluate(questions), evaluate(scenario_questions)

    paraphrase, scenarios = with_corpus(measure, corpus)
    p_scores, s_scores = breakdown(paraphrase), breakdown(scenarios)
    for key, s in p_scores.items():
        log(f"  B11 paraphrase {key:<26} {s.text()}")
    for key, s in s_scores.items():
        log(f"  B11 scenarios  {key:<26} {s.text()}")
    log(f"  B11 scenarios skipped (no question or expected.runbooks: []): {len(skipped)}")
    for line in misses(paraphrase) if verbose else []:
        log(f"    {line}")
    rows = _rows("paraphrase set", p_scores, targets=True)
    rows += _rows("scenario questions", {"all": s_scores["all"]}, targets=False) if scenarios else []
    evidence = {
        "paraphrase": p_scores,
        "scenarios": s_scores,
        "skipped": skipped,
        "misses": misses(paraphrase),
        "scenario_misses": misses(scenarios),
    }
    return rows, evidence
