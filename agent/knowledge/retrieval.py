"""Knowledge retrieval for the `lookup_knowledge` tool: L0 (document metadata) and L1 (BM25 over chunks).

One public function, `search_knowledge(query, top_k=5) -> RetrievalResult`, synchronous and thread-safe:
L0 matches the query against each document's title, tags and summary and contributes each matching
document's best chunk; L1 ranks every chunk with BM25 (`bm25s`); both share one tokeniser (`text`) and
also search the query's glossary expansion and typo corrections (`query`); scores are normalised, merged
and deduplicated by evidence id, each item naming the layer that chose it. The index is built once per
process, kept in memory, rebuilt when knowledge changed in any process; a warm search issues one query.
Details: docs/architecture.md, *Knowledge (`agent/knowledge/`)*.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import logging
import math
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count, Max

from agent.knowledge import query as rewrite
from agent.knowledge.ingest import knowledge_generation
from agent.knowledge.text import CJK_RE, segmenter, tokenize
from agent.knowledge.text import phrase as _phrase
from diagnosis.evidence import RUNBOOK_CHUNK
from diagnosis.models import KnowledgeChunk, KnowledgeDocument

logger = logging.getLogger(__name__)

DEFAULT_TOP_K = 5
MAX_TOP_K = 10
EVIDENCE_TEXT_CHARS = 1200
QUERY_CHARS = 1000
VERSION_CHECK_SECONDS = 5.0
L0_TAG_WEIGHT = 3.0
L0_TITLE_WEIGHT = 1.5
L0_SUMMARY_WEIGHT = 0.5
L0_MATCH_SCORE = 1.0

LAYER_L0 = "L0"
LAYER_L1 = "L1"
LAYER_BOTH = "L0+L1"

# A well-formed `kb:<slug>#<n>` (groups: slug, ordinal), as declared in `diagnosis.evidence`.
EVIDENCE_ID_RE = RUNBOOK_CHUNK.regex


# ---------------------------------------------------------------------------------------------------
# Public result types
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Evidence:
    """One retrieved chunk. `id` is `kb:<slug>#<n>`; `text` is at most `EVIDENCE_TEXT_CHARS` characters."""

    id: str
    slug: str
    title: str
    heading: str
    text: str
    score: float
    layer: str  # "L0" or "L1"

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "slug": self.slug,
            "title": self.title,
            "heading": self.heading,
            "text": self.text,
            "score": self.score,
            "layer": self.layer,
        }


@dataclass(frozen=True)
class RetrievalResult:
    """What a search found and how: the facts the tool boundary records on the tool invocation.

    `layer` is "L0", "L1", "L0+L1" or "" when nothing matched; `l0_match_count` counts matching documents,
    `l1_match_count` chunks with a positive BM25 score; `details` is `{"l0": [titles], "l1": [{"id",
    "score"}]}` (each at most `top_k` long); `is_truncated` is true when more matches existed than were
    returned or an evidence text was cut.
    """

    items: list[Evidence]
    layer: str
    l0_match_count: int
    l1_match_count: int
    details: dict[str, Any] = field(default_factory=dict)
    is_truncated: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "items": [item.as_dict() for item in self.items],
            "layer": self.layer,
            "l0_match_count": self.l0_match_count,
            "l1_match_count": self.l1_match_count,
            "details": self.details,
            "is_truncated": self.is_truncated,
        }


# ---------------------------------------------------------------------------------------------------
# The index
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Document:
    slug: str
    title: str
    tag_patterns: tuple[tuple[str, re.Pattern[str] | None], ...]  # (phrase, regex or None for CJK)
    tag_weights: tuple[float, ...]  # per tag: L0_TAG_WEIGHT scaled by how rare the tag is (0.5..1)
    title_tokens: frozenset[str]
    summary_tokens: frozenset[str]
    first_chunk: int  # index into _Index.chunks; -1 when the document has no chunk
    chunk_end: int


@dataclass(frozen=True)
class _Chunk:
    evidence_id: str
    document: int
    heading: str
    text: str


@dataclass(frozen=True)
class _Index:
    generation: int
    stamp: tuple[int, Any]
    documents: tuple[_Document, ...]
    chunks: tuple[_Chunk, ...]
    idf: dict[str, float]  # normalised (0..1] IDF of metadata tokens over documents
    bm25: Any  # bm25s.BM25, or None without chunks
    chunk_tokens: dict[str, list[str]]  # indexed text -> tokens, reused by the next rebuild
    snapshot: KnowledgeSnapshot  # the digest of everything a search over this index could return
    typo_keys: dict[str, tuple[str, ...]] = field(default_factory=dict)  # query.typo_keys of the vocabulary


@dataclass(frozen=True)
class KnowledgeSnapshot:
    """What retrieval can return, as one digest: sha256 of the canonical JSON of every document's slug,
    title, tags and summary (what L0 matches) with its chunks' ordinals, headings and texts (what L1
    ranks and the tools return), in slug and ordinal order. Equal corpora give equal digests wherever
    they are loaded from (the database, or a candidate runbook folder: `index_from_documents`)."""

    digest: str
    documents: int
    chunks: int


def _snapshot(
    documents: list[tuple[str, str, list, str]], chunks: dict[str, list[tuple]]
) -> KnowledgeSnapshot:
    """The snapshot of `documents` (slug, title, tags, summary) and their `chunks` by slug (ordinal,
    heading, text)."""
    body = [
        {
            "slug": slug,
            "title": title,
            "tags": list(tags or []),
            "summary": summary,
            "chunks": [[ordinal, heading, text] for ordinal, heading, text in chunks.get(slug, [])],
        }
        for slug, title, tags, summary in sorted(documents)
    ]
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return KnowledgeSnapshot(
        digest=hashlib.sha256(text.encode("utf-8")).hexdigest(),
        documents=len(body),
        chunks=sum(len(v) for v in chunks.values()),
    )


def _tag_pattern(tag: str) -> tuple[str, re.Pattern[str] | None]:
    phrase = _phrase(tag)
    if CJK_RE.search(phrase):
        return phrase.replace(" ", ""), None
    return phrase, re.compile(rf"(?<![a-z0-9]){re.escape(phrase)}(?:s|es)?(?![a-z0-9])")


def _idf(df: int, n: int) -> float:
    """BM25's IDF of a term in `df` of `n` documents, divided by that of a term in one document (0..1]."""
    return math.log(1 + (n - df + 0.5) / (df + 0.5)) / math.log(1 + (n - 0.5) / 1.5)


def _read_stamp() -> tuple[int, Any]:
    row = KnowledgeDocument.objects.aggregate(count=Count("id"), last=Max("updated_at"))
    return (row["count"], row["last"])


def _build_index(generation: int, stamp: tuple[int, Any], known_tokens: dict[str, list[str]]) -> _Index:
    rows = list(
        KnowledgeDocument.objects.order_by("id").values_list("id", "slug", "title", "tags", "summary")
    )
    chunk_rows = list(
        KnowledgeChunk.objects.order_by("document_id", "ordinal").values_list(
            "document_id", "ordinal", "heading", "text"
        )
    )
    return _make_index(generation, stamp, rows, chunk_rows, known_tokens)


def _make_index(
    generation: int,
    stamp: tuple[int, Any],
    rows: list[tuple[Any, str, str, list, str]],
    chunk_rows: list[tuple[Any, int, str, str]],
    known_tokens: dict[str, list[str]],
) -> _Index:
    """The index of documents `rows` (key, slug, title, tags, summary) and their chunks `chunk_rows`
    (document key, ordinal, heading, text), in order."""
    started = time.monotonic()
    import bm25s

    logging.getLogger("bm25s").setLevel(logging.WARNING)
    position = {pk: i for i, (pk, *_rest) in enumerate(rows)}
    chunks: list[_Chunk] = []
    spans: dict[int, list[int]] = {}
    slugs = [slug for _pk, slug, *_rest in rows]
    for document_id, ordinal, heading, text in chunk_rows:
        doc = position.get(document_id)
        if doc is None:  # written between the two reads; picked up by the next rebuild
            continue
        spans.setdefault(doc, []).append(len(chunks))
        chunks.append(_Chunk(RUNBOOK_CHUNK.format(slug=slugs[doc], ordinal=ordinal), doc, heading, text))

    documents: list[_Document] = []
    doc_freq: dict[str, int] = {}
    tag_lists = [
        [t for t in (tags or []) if isinstance(t, str) and t.strip()] for _pk, _s, _t, tags, _m in rows
    ]
    tag_freq: dict[str, int] = {}
    for tags in tag_lists:
        for phrase in {_tag_pattern(tag)[0] for tag in tags}:
            tag_freq[phrase] = tag_freq.get(phrase, 0) + 1
    n = len(rows)
    for i, (_pk, slug, title, _tags, summary) in enumerate(rows):
        tags = tag_lists[i]
        title_tokens = frozenset(tokenize(title))
        summary_tokens = frozenset(tokenize(summary))
        tag_tokens = frozenset(token for tag in tags for token in tokenize(tag))
        for token in title_tokens | summary_tokens | tag_tokens:
            doc_freq[token] = doc_freq.get(token, 0) + 1
        span = spans.get(i, [])
        documents.append(
            _Document(
                slug=slug,
                title=title,
                tag_patterns=tuple(_tag_pattern(tag) for tag in tags),
                tag_weights=tuple(
                    L0_TAG_WEIGHT * (0.5 + 0.5 * _idf(tag_freq[_tag_pattern(tag)[0]], n)) for tag in tags
                ),
                title_tokens=title_tokens,
                summary_tokens=summary_tokens,
                first_chunk=span[0] if span else -1,
                chunk_end=span[-1] + 1 if span else -1,
            )
        )
    idf = {token: _idf(df, n) for token, df in doc_freq.items()}

    bm25 = None
    chunk_tokens: dict[str, list[str]] = {}
    for chunk in chunks:
        indexed = f"{chunk.heading}\n{chunk.text}"
        tokens = known_tokens.get(indexed)
        chunk_tokens[indexed] = tokens if tokens is not None else tokenize(indexed)
    if chunks:
        bm25 = bm25s.BM25(method="lucene")
        bm25.index([chunk_tokens[f"{c.heading}\n{c.text}"] for c in chunks], show_progress=False)
    logger.info(
        "knowledge index built documents=%d chunks=%d ms=%d",
        n,
        len(chunks),
        int((time.monotonic() - started) * 1000),
    )
    by_slug: dict[str, list[tuple]] = {}
    for document_id, ordinal, heading, text in chunk_rows:
        if document_id in position:
            by_slug.setdefault(slugs[position[document_id]], []).append((ordinal, heading, text))
    snapshot = _snapshot([(slug, title, tags, summary) for _pk, slug, title, tags, summary in rows], by_slug)
    typo_keys = rewrite.typo_keys(bm25.vocab_dict if bm25 is not None else ())
    return _Index(
        generation, stamp, tuple(documents), tuple(chunks), idf, bm25, chunk_tokens, snapshot, typo_keys
    )


class _IndexHolder:
    """The process's index: rebuilt on a generation change, or when the stamp (checked at most every
    `VERSION_CHECK_SECONDS`) moved. One builder at a time; readers use an immutable snapshot."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._index: _Index | None = None
        self._checked_at = 0.0
        self._known_tokens: dict[str, list[str]] = {}  # survives reset: tokens depend on the text only
        self.builds = 0

    def _fresh(self, index: _Index | None) -> bool:
        return (
            index is not None
            and index.generation == knowledge_generation()
            and time.monotonic() - self._checked_at < VERSION_CHECK_SECONDS
        )

    def get(self) -> _Index:
        index = self._index
        if self._fresh(index):
            return index
        with self._lock:
            index = self._index
            if self._fresh(index):
                return index
            generation = knowledge_generation()
            stamp = _read_stamp()
            if index is None or index.generation != generation or index.stamp != stamp:
                index = _build_index(generation, stamp, self._known_tokens)
                self._known_tokens = index.chunk_tokens
                self._index = index
                self.builds += 1
            self._checked_at = time.monotonic()
            return index

    def reset(self) -> None:
        with self._lock:
            self._index = None
            self._checked_at = 0.0


_holder = _IndexHolder()


def warm_knowledge_index() -> None:
    """Load jieba's dictionary and build the index now (about a second, once per process) instead of
    during the first search; uses the ORM like a search does."""
    segmenter()
    _holder.get()


# A corpus that replaces the knowledge base for the current context (an experiment's candidate runbook
# folder, `agent.knowledge.corpus`): searches, `read_runbook` and the snapshot read it instead.
_override: contextvars.ContextVar[_Index | None] = contextvars.ContextVar("knowledge_override", default=None)


def _current_index() -> _Index:
    override = _override.get()
    return override if override is not None else _holder.get()


def override_index(index: _Index | None) -> contextvars.Token:
    """Make `index` the corpus of this context (None: the knowledge base again); returns the token
    `reset_override` takes. Tools run in a copy of the caller's context, so a run sees it throughout."""
    return _override.set(index)


def reset_override(token: contextvars.Token) -> None:
    _override.reset(token)


def overridden_sections(slug: str, first: int, last: int) -> list[tuple[int, str, str, str]] | None:
    """The sections `first..last` of runbook `slug` as (ordinal, title, heading, text) in the overriding
    corpus, or None when no corpus overrides the knowledge base here."""
    index = _override.get()
    if index is None:
        return None
    out = []
    for chunk in index.chunks:
        document = index.documents[chunk.document]
        ordinal = RUNBOOK_CHUNK.parse(chunk.evidence_id)["ordinal"]
        if document.slug == slug and first <= ordinal <= last:
            out.append((ordinal, document.title, chunk.heading, chunk.text))
    return out


def knowledge_snapshot() -> KnowledgeSnapshot:
    """The digest of the corpus a search can return now (the process's index, rebuilt if stale, or the
    corpus overriding it in this context)."""
    return _current_index().snapshot


def reset_knowledge_index() -> None:
    """Forget the in-memory index so the next search rebuilds it (tests; after restoring a database)."""
    _holder.reset()


# ---------------------------------------------------------------------------------------------------
# Search
# ---------------------------------------------------------------------------------------------------
def _l0_scores(index: _Index, query: str, query_tokens: set[str]) -> dict[int, float]:
    phrase = _phrase(query)
    compact = phrase.replace(" ", "")
    scores: dict[int, float] = {}
    for i, doc in enumerate(index.documents):
        hits = [
            weight
            for (tag, pattern), weight in zip(doc.tag_patterns, doc.tag_weights, strict=True)
            if tag and (tag in compact if pattern is None else pattern.search(phrase))
        ]
        title = sum(index.idf.get(t, 0.0) for t in query_tokens & doc.title_tokens)
        summary = sum(index.idf.get(t, 0.0) for t in (query_tokens & doc.summary_tokens) - doc.title_tokens)
        score = sum(hits) + L0_TITLE_WEIGHT * title + L0_SUMMARY_WEIGHT * summary
        if hits or score >= L0_MATCH_SCORE:
            scores[i] = score
    return scores


def _bound(text: str) -> tuple[str, bool]:
    if len(text) <= EVIDENCE_TEXT_CHARS:
        return text, False
    return text[: EVIDENCE_TEXT_CHARS - 1].rstrip() + "…", True


def _empty(l0: int = 0, l1: int = 0) -> RetrievalResult:
    return RetrievalResult(
        items=[], layer="", l0_match_count=l0, l1_match_count=l1, details={"l0": [], "l1": []}
    )


def search_knowledge(query: str, top_k: int = DEFAULT_TOP_K) -> RetrievalResult:
    """The best `top_k` (clamped to 1..`MAX_TOP_K`) evidence chunks for `query`; see the module docstring.

    Synchronous (uses the ORM: at most one query when the index is warm, three when it is (re)built).
    A blank query or one without a known token returns an empty result with layer "".
    """
    query = (query or "")[:QUERY_CHARS]
    try:
        top_k = max(1, min(int(top_k), MAX_TOP_K))
    except (TypeError, ValueError):
        top_k = DEFAULT_TOP_K
    query_tokens = list(dict.fromkeys(tokenize(query)))
    if not query_tokens:
        return _empty()
    index = _current_index()
    if not index.documents:
        return _empty()

    import numpy as np

    vocabulary = index.bm25.vocab_dict if index.bm25 is not None else {}
    corrected = rewrite.correct_typos(query, vocabulary, index.typo_keys)
    if corrected:
        query_tokens += [t for t in dict.fromkeys(tokenize(corrected)) if t not in query_tokens]
        query = f"{query} {corrected}"
    weight = rewrite.EXPANSION_WEIGHT
    expansion = rewrite.expand_query(query) if weight > 0 else ""
    extra_tokens = [t for t in dict.fromkeys(tokenize(expansion)) if t not in query_tokens]
    n_chunks = len(index.chunks)
    bm25_scores = np.zeros(n_chunks, dtype="float32")
    if index.bm25 is not None:
        known = [t for t in query_tokens if t in index.bm25.vocab_dict]
        if known:
            bm25_scores = index.bm25.get_scores(known)
        known_extra = [t for t in extra_tokens if t in index.bm25.vocab_dict]
        if known_extra:
            bm25_scores = bm25_scores + weight * index.bm25.get_scores(known_extra)
    l1_positive = np.flatnonzero(bm25_scores > 0)
    best_bm25 = float(bm25_scores.max()) if n_chunks else 0.0

    l0 = _l0_scores(index, query, set(query_tokens))
    if extra_tokens:
        for doc_index, extra in _l0_scores(index, expansion, set(extra_tokens)).items():
            l0[doc_index] = l0.get(doc_index, 0.0) + weight * extra
    best_l0 = max(l0.values(), default=0.0) or 1.0
    combined: dict[int, float] = {}
    chosen_by_l0: set[int] = set()
    for i in l1_positive.tolist():
        combined[i] = float(bm25_scores[i]) / best_bm25
    for doc_index, score in l0.items():
        doc = index.documents[doc_index]
        if doc.first_chunk < 0:
            continue
        span = bm25_scores[doc.first_chunk : doc.chunk_end]
        chunk = doc.first_chunk + int(span.argmax()) if float(span.max()) > 0 else doc.first_chunk
        combined[chunk] = combined.get(chunk, 0.0) + score / best_l0
        chosen_by_l0.add(chunk)
    if not combined:
        return _empty(len(l0), len(l1_positive))

    ranked = sorted(combined.items(), key=lambda pair: (-pair[1], pair[0]))
    items: list[Evidence] = []
    cut = False
    for chunk_index, score in ranked[:top_k]:
        chunk = index.chunks[chunk_index]
        doc = index.documents[chunk.document]
        text, was_cut = _bound(chunk.text)
        cut = cut or was_cut
        items.append(
            Evidence(
                id=chunk.evidence_id,
                slug=doc.slug,
                title=doc.title,
                heading=chunk.heading,
                text=text,
                score=round(score, 4),
                layer=LAYER_L0 if chunk_index in chosen_by_l0 else LAYER_L1,
            )
        )
    returned = [chunk_index for chunk_index, _score in ranked[:top_k]]
    from_l0 = any(i in chosen_by_l0 for i in returned)
    from_l1 = any(bm25_scores[i] > 0 for i in returned)
    layer = LAYER_BOTH if from_l0 and from_l1 else LAYER_L0 if from_l0 else LAYER_L1

    l0_titles = [index.documents[d].title for d, _s in sorted(l0.items(), key=lambda p: (-p[1], p[0]))]
    l1_top = sorted(l1_positive.tolist(), key=lambda i: (-float(bm25_scores[i]), i))[:top_k]
    details = {
        "l0": l0_titles[:top_k],
        "l1": [{"id": index.chunks[i].evidence_id, "score": round(float(bm25_scores[i]), 4)} for i in l1_top],
    }
    return RetrievalResult(
        items=items,
        layer=layer,
        l0_match_count=len(l0),
        l1_match_count=len(l1_positive),
        details=details,
        is_truncated=len(ranked) > top_k or cut,
    )
