"""Reads of the knowledge base for pages: one runbook with its chunks in order (the runbook view that
citation links open, `surfaces.chat.pages.knowledge_document`).

Search is `agent.knowledge.retrieval`'s; writes are `agent.knowledge.ingest`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from diagnosis.models import KnowledgeChunk, KnowledgeDocument


@dataclass(frozen=True, slots=True)
class RunbookView:
    """A document and its chunks ordered by `ordinal` (the `n` of the evidence id `kb:<slug>#<n>`)."""

    document: KnowledgeDocument
    chunks: list[KnowledgeChunk]


def get_runbook(*, slug: str) -> RunbookView | None:
    """The runbook `slug` with its chunks (two queries), or None when no such document exists. Each chunk
    holds `document` already, so `chunk.evidence_id` costs no query."""
    document = KnowledgeDocument.objects.filter(slug=slug).first()
    if document is None:
        return None
    chunks: list[KnowledgeChunk] = list(document.chunks.order_by("ordinal"))
    return RunbookView(document=document, chunks=chunks)
