"""A runbook folder indexed in memory, to replace the knowledge base for one context (an experiment's
candidate `runbooks`): `corpus_from_folder(path)` parses, validates and chunks every `*.md` file exactly
as `manage.py load_knowledge` does (slug = file name; `ingest.parse_markdown`, `clean_document_fields`,
`chunk_markdown`) and builds the same index `search_knowledge` uses, so a folder equal to the loaded
knowledge base searches, reads (`read_runbook`) and fingerprints (`knowledge_snapshot`) the same. Nothing
is written to the database. `use_corpus(corpus)` / `retrieval.reset_override(token)` bracket its use."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from pathlib import Path

from django.core.exceptions import ValidationError

from agent.knowledge import retrieval
from agent.knowledge.ingest import chunk_markdown, clean_document_fields, parse_markdown


class CorpusError(ValueError):
    """A folder that cannot be a corpus; the message names the file and field, never content."""


@dataclass(frozen=True)
class Corpus:
    source: str
    index: object  # retrieval._Index

    @property
    def snapshot(self) -> retrieval.KnowledgeSnapshot:
        return self.index.snapshot

    @property
    def slugs(self) -> list[str]:
        return [d.slug for d in self.index.documents]


def corpus_from_folder(path: str | Path) -> Corpus:
    root = Path(path)
    if not root.is_dir():
        raise CorpusError(f"{root} is not a directory")
    rows, chunk_rows, errors = [], [], []
    for key, file in enumerate(sorted(root.glob("*.md"))):
        try:
            doc = parse_markdown(file.read_text(encoding="utf-8"))
            fields = clean_document_fields(
                slug=file.name[: -len(".md")],
                title=doc.title,
                tags=doc.tags,
                summary=doc.summary,
                body=doc.body,
                language=doc.language,
            )
        except (UnicodeDecodeError, ValidationError) as exc:
            errors.append(f"{file.name}: {type(exc).__name__}")
            continue
        rows.append((key, fields["slug"], fields["title"], fields["tags"], fields["summary"]))
        chunk_rows += [
            (key, n, draft.heading, draft.text)
            for n, draft in enumerate(chunk_markdown(fields["body"]), start=1)
        ]
    if errors:
        raise CorpusError("invalid runbooks: " + "; ".join(errors))
    index = retrieval._make_index(-1, (len(rows), str(root)), rows, chunk_rows, {})
    return Corpus(source=str(root), index=index)


def use_corpus(corpus: Corpus | None) -> contextvars.Token:
    """Make `corpus` the knowledge base of this context (None: the real one)."""
    return retrieval.override_index(corpus.index if corpus is not None else None)
