"""Grouping short questions by their words: TF-IDF vectors over the knowledge retrieval's own tokeniser
(`agent.knowledge.text.tokenize`: jieba for Chinese, latin words and their parts, the same stop
words) and average-linkage agglomerative clustering over their cosine similarities, stopped at a
similarity threshold; each cluster named by its heaviest terms. Pure numpy, deterministic, no database.
Why not a library, and how well it groups (purity on a labelled set): docs/admin.md, *Unanswered questions*.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agent.knowledge.text import CJK_RE, tokenize
from agent.redaction import PLACEHOLDER

# Two questions (or groups) join while the mean cosine similarity of their members is at least this:
# chosen on the labelled set of tests/evaluations/test_gaps.py, where 0.06 … 0.08 give purity 1.0 and
# inverse purity ≥ 0.97, 0.04 merges two topics and 0.15 splits them into twice as many groups.
DEFAULT_THRESHOLD = 0.08
NAME_TERMS = 3


def terms(text: str) -> list[str]:
    """The tokens of a (redacted) question that say what it is about: the retrieval's tokens, without
    redaction placeholders (a secret's kind is no topic), bare numbers and single Chinese characters
    (为, 到, 新: jieba's particles and fragments, which the retrieval's stop words leave in)."""
    return [
        t
        for t in tokenize(PLACEHOLDER.sub(" ", text))
        if not t.isdigit() and not (len(t) == 1 and CJK_RE.match(t))
    ]


@dataclass(frozen=True, slots=True)
class Vectors:
    matrix: np.ndarray  # one L2-normalised TF-IDF row per text (a zero row for a text without terms)
    vocabulary: tuple[str, ...]


def tfidf(texts: Sequence[str]) -> Vectors:
    """Sublinear TF (1 + log tf) times smoothed IDF (log((1 + n) / (1 + df)) + 1), rows L2-normalised."""
    counts = [Counter(terms(text)) for text in texts]
    df: Counter[str] = Counter()
    for c in counts:
        df.update(c.keys())
    vocabulary = tuple(sorted(df))
    column = {term: j for j, term in enumerate(vocabulary)}
    n = len(texts)
    idf = np.array([math.log((1 + n) / (1 + df[t])) + 1.0 for t in vocabulary], dtype="float64")
    # float32: a thousand questions over a few thousand terms stay a few megabytes (the matrix is dense).
    matrix = np.zeros((n, len(vocabulary)), dtype="float32")
    for i, c in enumerate(counts):
        for term, tf in c.items():
            matrix[i, column[term]] = (1.0 + math.log(tf)) * idf[column[term]]
    norms = np.linalg.norm(matrix, axis=1)
    matrix[norms > 0] /= norms[norms > 0, None]
    return Vectors(matrix, vocabulary)


def agglomerate(matrix: np.ndarray, *, threshold: float = DEFAULT_THRESHOLD, weights=None) -> list[int]:
    """Average-linkage agglomerative clustering of the rows of `matrix` (L2-normalised) by cosine
    similarity: repeatedly merge the two groups whose members' mean pairwise similarity (weighted by
    `weights`, each row's multiplicity; 1 each by default) is highest, while it is at least
    `threshold`. Returns a label per row: the index of its group's first row. Each group's best
    partner is cached per row (Lance–Williams update of the merged row), so a merge costs O(n) besides
    the rows whose best partner was one of the merged pair; ties go to the lower index."""
    n = matrix.shape[0]
    if n == 0:
        return []
    sim = (matrix @ matrix.T).astype("float64")
    np.fill_diagonal(sim, -np.inf)
    size = np.ones(n) if weights is None else np.asarray(weights, dtype="float64").copy()
    alive = np.ones(n, dtype=bool)
    parent = list(range(n))
    best = sim.argmax(axis=1)
    best_sim = sim[np.arange(n), best]
    while True:
        candidates = np.where(alive, best_sim, -np.inf)
        i = int(candidates.argmax())
        if not candidates[i] >= threshold:
            break
        j = int(best[i])
        i, j = min(i, j), max(i, j)
        merged = (size[i] * sim[i] + size[j] * sim[j]) / (size[i] + size[j])
        sim[i, :] = merged
        sim[:, i] = merged
        sim[i, i] = -np.inf
        sim[j, :] = -np.inf
        sim[:, j] = -np.inf
        size[i] += size[j]
        alive[j] = False
        parent[j] = i
        best_sim[j] = -np.inf
        # Rows whose best partner was i or j look again; the others compare with the merged row only.
        stale = np.flatnonzero(alive & ((best == i) | (best == j)))
        for k in stale.tolist():
            best[k] = int(sim[k].argmax())
            best_sim[k] = sim[k, best[k]]
        better = alive & (sim[:, i] > best_sim)
        best[better] = i
        best_sim[better] = sim[better, i]
        best[i] = int(sim[i].argmax())
        best_sim[i] = sim[i, best[i]]
    labels = []
    for k in range(n):
        root = k
        while parent[root] != root:
            root = parent[root]
        labels.append(root)
    return labels


def name_of(vectors: Vectors, rows: Sequence[int], *, weights=None, count: int = NAME_TERMS) -> list[str]:
    """The `count` terms with the largest summed TF-IDF weight over `rows` (ties: alphabetical), a
    term that is part of a heavier one left out (jieba's search mode yields both 数据库 and 数据)."""
    w = np.ones(len(rows)) if weights is None else np.asarray(weights, dtype="float64")
    total = (vectors.matrix[list(rows)] * w[:, None]).sum(axis=0)
    # At equal weight the longer term first, so that 流水线 is kept and its parts 流水, 水线 are not.
    order = sorted(
        np.flatnonzero(total > 0).tolist(),
        key=lambda j: (-round(float(total[j]), 9), -len(vectors.vocabulary[j]), vectors.vocabulary[j]),
    )
    chosen: list[str] = []
    for j in order:
        term = vectors.vocabulary[j]
        if any(term in kept for kept in chosen):
            continue
        chosen.append(term)
        if len(chosen) == count:
            break
    return chosen


def medoid(vectors: Vectors, rows: Sequence[int], *, weights=None) -> int:
    """The row of `rows` most similar, on average, to the others (the cluster's most typical text)."""
    block = vectors.matrix[list(rows)]
    w = np.ones(len(rows)) if weights is None else np.asarray(weights, dtype="float64")
    scores = (block @ block.T) @ w
    return list(rows)[int(scores.argmax())]
