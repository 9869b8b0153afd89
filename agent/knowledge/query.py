"""What a query is searched with besides its own words (`retrieval.search_knowledge` uses both):

- `expand_query`: the other language's spellings of the operations concepts it names, from the bilingual
  glossary `data/glossary_zh_en.tsv` (a question in Chinese finds the English runbook and the reverse);
- `correct_typos`: for a latin word no chunk contains, the indexed words one edit away (`typo_keys`).
Both are code and data of the search, like the tokeniser: the knowledge snapshot digests the corpus only.
Measured by B11; details: docs/architecture.md, *Knowledge (`agent/knowledge/`)*.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from agent.knowledge.text import DATA, STOPWORDS_EN, normalize

# How much the expansion's words count against the query's own, in both layers (0: off). Chosen on the
# tuning part of B11's paraphrase set (the plateau 0.7–1.0 of recall@1; docs/performance.md).
EXPANSION_WEIGHT = 0.8
# Latin words shorter than this are never corrected (0: correction off).
TYPO_MIN_CHARS = 4

_WORD_RE = re.compile(r"[a-z]+")
_ALNUM_RE = re.compile(r"[a-z0-9]+")


def _glossary(name: str) -> tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]:
    """The (Chinese spellings, English spellings) lines of a glossary file in `data/`, read once."""
    entries = []
    for line in (DATA / name).read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        zh, en = line.split("\t")
        entries.append(
            (
                tuple(normalize(w) for w in zh.split("|") if w),
                tuple(normalize(w) for w in en.split("|") if w),
            )
        )
    return tuple(entries)


GLOSSARY = _glossary("glossary_zh_en.tsv")
_ENGLISH_TERMS: dict[tuple[str, ...], list[int]] = {}
for _entry, (_zh, _en) in enumerate(GLOSSARY):
    for _term in _en:
        _ENGLISH_TERMS.setdefault(tuple(_ALNUM_RE.findall(_term)), []).append(_entry)
_LONGEST_TERM = max((len(words) for words in _ENGLISH_TERMS), default=0)


def _english_entries(text: str) -> set[int]:
    """The glossary lines with an English spelling in `text` as whole words (a trailing s/es allowed)."""
    words = _ALNUM_RE.findall(text)
    entries: set[int] = set()
    for start in range(len(words)):
        for end in range(start + 1, min(start + _LONGEST_TERM, len(words)) + 1):
            gram, last = tuple(words[start : end - 1]), words[end - 1]
            forms = {last, last[:-1] if last.endswith("s") else "", last[:-2] if last.endswith("es") else ""}
            for form in forms - {""}:
                entries.update(_ENGLISH_TERMS.get((*gram, form), ()))
    return entries


def expand_query(query: str) -> str:
    """The other language's spellings of the glossary concepts `query` names, as one text ("" when none):
    a Chinese spelling is found anywhere in the query, an English one as whole words."""
    normal = normalize(query)
    compact = "".join(normal.split())
    english = _english_entries(normal)
    added: list[str] = []
    for entry, (zh, en) in enumerate(GLOSSARY):
        if any(word.replace(" ", "") in compact for word in zh):
            added.extend(en)
        if entry in english:
            added.extend(zh)
    return " ".join(dict.fromkeys(added))


def _edits(a: str, b: str, limit: int) -> int:
    """Optimal string alignment distance of `a` and `b` (a swap of neighbours is one edit), or
    `limit + 1` once it exceeds `limit`."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    before: list[int] | None = None
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, start=1):
        current = [i] + [0] * len(b)
        for j, cb in enumerate(b, start=1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb))
            if before is not None and i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                current[j] = min(current[j], before[j - 2] + 1)
        if min(current) > limit:
            return limit + 1
        before, previous = previous, current
    return previous[-1]


def _deletions(word: str) -> set[str]:
    """`word` and every word one deleted letter away from it."""
    return {word} | {word[:i] + word[i + 1 :] for i in range(len(word))}


def typo_keys(vocabulary: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """The latin words of an index's `vocabulary` by themselves and by each of their one-letter deletions:
    what `correct_typos` looks a misspelt word up in (two words one edit apart share a key)."""
    keys: dict[str, set[str]] = {}
    for token in vocabulary:
        if len(token) >= TYPO_MIN_CHARS - 1 and _WORD_RE.fullmatch(token):
            for key in _deletions(token):
                keys.setdefault(key, set()).add(token)
    return {key: tuple(sorted(tokens)) for key, tokens in keys.items()}


def correct_typos(query: str, vocabulary: Mapping[str, object], keys: Mapping[str, tuple[str, ...]]) -> str:
    """The indexed words one edit away (an insertion, deletion, substitution or swap of neighbours) from
    each latin word of `query` of at least `TYPO_MIN_CHARS` letters that is not in `vocabulary`, as one
    text ("" when none). Known words and stop words are left alone."""
    if TYPO_MIN_CHARS <= 0:
        return ""
    found: list[str] = []
    for word in dict.fromkeys(_WORD_RE.findall(normalize(query))):
        if len(word) < TYPO_MIN_CHARS or word in vocabulary or word in STOPWORDS_EN:
            continue
        candidates = {c for key in _deletions(word) for c in keys.get(key, ())}
        found.extend(sorted(c for c in candidates if _edits(word, c, 1) <= 1))
    return " ".join(dict.fromkeys(found))
