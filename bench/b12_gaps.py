"""B12 (issue 47, item 5): the in-memory cost of grouping unanswered questions (`evaluations.clusters`).

The report reads its runs in one query (tested in tests/evaluations/test_gaps.py); what grows with the
period is the grouping: TF-IDF over the retrieval's tokeniser and the average linkage. This measures
both on synthetic questions (words of the labelled set, five topics' openings plus six random words,
so that groups form) at 100, 300 and 1,000 distinct questions (`evaluations.gaps.MAX_QUESTIONS`), jieba
warm, median and max of 5 repetitions. Alone: `DEBUG=true .venv/bin/python -m bench.b12_gaps`; not in
`python -m bench`'s table. Figures: docs/admin.md, *Unanswered questions*.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import time
from pathlib import Path

SIZES = (100, 300, 1000)
REPS = 5
LABELLED = Path(__file__).resolve().parents[1] / "tests" / "evaluations" / "data" / "gap_questions.json"


def questions(n: int, seed: int = 1) -> list[str]:
    topics = list(json.loads(LABELLED.read_text(encoding="utf-8"))["topics"].values())
    words = [w for qs in topics for q in qs for w in q.split()]
    rng = random.Random(seed)
    return [" ".join(rng.choice(topics)[0].split()[:5] + rng.sample(words, 6)) for _ in range(n)]


def main() -> None:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    from evaluations import clusters

    clusters.tfidf(questions(10))  # jieba's dictionary loaded (once per process, as in the server)
    for n in SIZES:
        texts = questions(n)
        vec, link = [], []
        for _ in range(REPS):
            t0 = time.perf_counter()
            vectors = clusters.tfidf(texts)
            t1 = time.perf_counter()
            labels = clusters.agglomerate(vectors.matrix)
            vec.append(t1 - t0)
            link.append(time.perf_counter() - t1)
        print(
            f"{n:5d} questions: tf-idf median {statistics.median(vec) * 1000:7.1f} ms (max "
            f"{max(vec) * 1000:7.1f}), linkage median {statistics.median(link) * 1000:7.1f} ms (max "
            f"{max(link) * 1000:7.1f}); {len(set(labels))} groups, {len(vectors.vocabulary)} terms"
        )


if __name__ == "__main__":
    main()
