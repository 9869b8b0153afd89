"""Writes of the knowledge base: parse runbook markdown, cut it into chunks, upsert documents.

`upsert_document` is the one way a `KnowledgeDocument` is written (`load_knowledge` and the admin): it
re-chunks whenever the body changes and bumps `knowledge_generation()`, so this process's retrieval
index rebuilds (other processes notice the documents' version stamp). `chunk_markdown` never crosses a
section or splits a fenced code block.
Details: docs/architecture.md, *Knowledge (`agent/knowledge/`)* (storage and chunking).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import threading
from dataclasses import dataclass

from django.core.exceptions import ValidationError
from django.db import transaction

from diagnosis.models import KNOWLEDGE_SLUG_PATTERN, KnowledgeChunk, KnowledgeDocument, KnowledgeLanguage

MIN_CHUNK_CHARS = 300
MAX_CHUNK_CHARS = 1200
HEADING_CHARS = 200
TITLE_CHARS = 200
SLUG_CHARS = 100
MAX_TAGS = 20
TAG_CHARS = 50
FRONT_MATTER_KEYS = ("title", "tags", "summary", "language")

_SLUG_RE = re.compile(rf"^{KNOWLEDGE_SLUG_PATTERN}\Z")
_CJK_RE = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_LATIN_RE = re.compile(r"[A-Za-z]")
_FENCE_RE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_SECTION_RE = re.compile(r"^ {0,3}(#{1,2})[ \t]+(.*?)[ \t]*#*[ \t]*$")
_SUBHEADING_RE = re.compile(r"^ {0,3}#{3,6}[ \t]+\S")
_SENTENCE_END_RE = re.compile(r"(?<=[.!?。！？；;])\s+|(?<=[。！？；])")

# ---------------------------------------------------------------------------------------------------
# Generation counter: bumped by every write, read by the retrieval index to know it is stale.
# ---------------------------------------------------------------------------------------------------
_generation_lock = threading.Lock()
_generation_counter = itertools.count(1)
_generation = 0


def knowledge_generation() -> int:
    """A number that changes whenever this process wrote knowledge (and again when that write commits)."""
    return _generation


def _bump_generation() -> None:
    global _generation
    with _generation_lock:
        _generation = next(_generation_counter)


# ---------------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ParsedDocument:
    """A markdown file split into its front matter and body; `language` is None when not declared."""

    title: str
    tags: list[str]
    summary: str
    body: str
    language: str | None = None


@dataclass(frozen=True)
class ChunkDraft:
    heading: str
    text: str


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def parse_markdown(text: str) -> ParsedDocument:
    """Parse `---` front matter (`title`, `tags: [a, b]`, `summary`, optional `language`) and the body.

    The front matter is a flat `key: value` list; a value in brackets is a comma-separated list. Unknown
    keys, a missing title or an unterminated block raise `ValidationError` (a typo must not pass silently).
    """
    text = text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    lines = text.split("\n")
    if not lines or lines[0].strip() != "---":
        raise ValidationError("The file must start with a '---' front matter block.")
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    except StopIteration:
        raise ValidationError("The front matter block is not closed by '---'.") from None
    meta: dict[str, str | list[str]] = {}
    for number, line in enumerate(lines[1:end], start=2):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition(":")
        key = key.strip()
        if not sep or not re.fullmatch(r"[A-Za-z_]+", key):
            raise ValidationError(f"Front matter line {number} is not 'key: value'.")
        if key not in FRONT_MATTER_KEYS:
            allowed = ", ".join(FRONT_MATTER_KEYS)
            raise ValidationError(f"Unknown front matter key {key!r} on line {number} (allowed: {allowed}).")
        if key in meta:
            raise ValidationError(f"Front matter key {key!r} appears twice.")
        value = value.strip()
        if value.startswith("["):
            if not value.endswith("]"):
                raise ValidationError(f"Front matter list on line {number} is not closed by ']'.")
            meta[key] = [_unquote(item) for item in value[1:-1].split(",") if item.strip()]
        else:
            meta[key] = _unquote(value)
    tags = meta.get("tags", [])
    if isinstance(tags, str):
        tags = [tags] if tags else []
    for key in ("title", "summary", "language"):
        if isinstance(meta.get(key), list):
            raise ValidationError(f"Front matter key {key!r} must be a single value.")
    title = str(meta.get("title", "")).strip()
    if not title:
        raise ValidationError("The front matter has no 'title'.")
    return ParsedDocument(
        title=title,
        tags=list(tags),
        summary=str(meta.get("summary", "")).strip(),
        body="\n".join(lines[end + 1 :]).strip("\n"),
        language=(str(meta["language"]).strip() or None) if "language" in meta else None,
    )


def detect_language(text: str) -> str:
    """`zh` when CJK characters make up at least a fifth of the letters, else `en`."""
    cjk = len(_CJK_RE.findall(text))
    latin = len(_LATIN_RE.findall(text))
    if cjk and cjk >= 0.2 * (cjk + latin):
        return KnowledgeLanguage.CHINESE
    return KnowledgeLanguage.ENGLISH


# ---------------------------------------------------------------------------------------------------
# Chunking
# ---------------------------------------------------------------------------------------------------
@dataclass
class _Block:
    text: str
    has_fence: bool


def _sections(body: str) -> list[tuple[str, list[_Block]]]:
    """Split into (heading, blocks) at `#`/`##` lines outside fences; blocks are blank-line separated."""
    sections: list[tuple[str, list[_Block]]] = [("", [])]
    lines: list[str] = []
    has_fence = False
    fence: str | None = None

    def close_block() -> None:
        nonlocal lines, has_fence
        if any(line.strip() for line in lines):
            sections[-1][1].append(_Block("\n".join(lines).strip("\n"), has_fence))
        lines, has_fence = [], False

    for line in body.split("\n"):
        if fence is not None:
            lines.append(line)
            stripped = line.strip()
            if stripped.startswith(fence) and set(stripped) == {fence[0]}:
                fence = None
            continue
        opener = _FENCE_RE.match(line)
        if opener:
            fence, has_fence = opener.group(1), True
            lines.append(line)
            continue
        heading = _SECTION_RE.match(line)
        if heading:
            close_block()
            sections.append((heading.group(2).strip()[:HEADING_CHARS], []))
            continue
        if not line.strip():
            close_block()
            continue
        lines.append(line)
    close_block()
    return [(heading, blocks) for heading, blocks in sections if blocks]


def _split_prose(text: str, limit: int) -> list[str]:
    """Cut an over-long prose block at sentence ends (hard cut at whitespace for a giant sentence)."""
    pieces: list[str] = []
    current = ""
    for sentence in (s for s in _SENTENCE_END_RE.split(text) if s.strip()):
        while len(sentence) > limit:
            cut = sentence.rfind(" ", 0, limit)
            cut = cut if cut > limit // 2 else limit
            if current:
                pieces.append(current)
                current = ""
            pieces.append(sentence[:cut].rstrip())
            sentence = sentence[cut:].lstrip()
        joiner = "" if not current or _CJK_RE.match(sentence[:1]) else " "
        if current and len(current) + len(joiner) + len(sentence) > limit:
            pieces.append(current)
            current = sentence
        else:
            current = f"{current}{joiner}{sentence}" if current else sentence
    if current:
        pieces.append(current)
    return pieces


def _is_lead_in(block: _Block) -> bool:
    if block.has_fence:
        return False
    last_line = block.text.rstrip().rsplit("\n", 1)[-1]
    return block.text.rstrip().endswith((":", "：")) or bool(_SUBHEADING_RE.match(last_line))


def _units(blocks: list[_Block], limit: int) -> list[str]:
    """Indivisible pieces: a lead-in glued to its following block; long prose cut at sentences."""
    units: list[str] = []
    pending: list[str] = []
    for index, block in enumerate(blocks):
        is_last = index == len(blocks) - 1
        if _is_lead_in(block) and not is_last:
            pending.append(block.text)
            continue
        if block.has_fence or len("\n\n".join([*pending, block.text])) <= limit:
            units.append("\n\n".join([*pending, block.text]))
        else:
            pieces = _split_prose(block.text, limit)
            if pending:
                head = "\n\n".join([*pending, pieces[0]])
                if len(head) <= limit:
                    pieces[0] = head
                else:
                    units.extend(pending)
            units.extend(pieces)
        pending = []
    return units


def chunk_markdown(
    body: str, *, min_chars: int = MIN_CHUNK_CHARS, max_chars: int = MAX_CHUNK_CHARS
) -> list[ChunkDraft]:
    """Cut a markdown body into chunks of about `min_chars`..`max_chars`, per section (see module doc)."""
    drafts: list[ChunkDraft] = []
    for heading, blocks in _sections(body.replace("\r\n", "\n").replace("\r", "\n")):
        chunks: list[str] = []
        for unit in _units(blocks, max_chars):
            if chunks and len(chunks[-1]) + 2 + len(unit) <= max_chars:
                chunks[-1] = f"{chunks[-1]}\n\n{unit}"
            else:
                chunks.append(unit)
        small_tail = len(chunks) >= 2 and len(chunks[-1]) < min_chars
        if small_tail and len(chunks[-2]) + 2 + len(chunks[-1]) <= max_chars:
            chunks[-2:] = [f"{chunks[-2]}\n\n{chunks[-1]}"]
        drafts.extend(ChunkDraft(heading=heading, text=text) for text in chunks)
    return drafts


# ---------------------------------------------------------------------------------------------------
# Services
# ---------------------------------------------------------------------------------------------------
def content_sha256(*, title: str, tags: list[str], summary: str, language: str, body: str) -> str:
    """The fingerprint `load_knowledge` compares to skip unchanged files."""
    canonical = json.dumps(
        {"title": title, "tags": tags, "summary": summary, "language": language, "body": body},
        ensure_ascii=False,
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def normalize_tags(tags: list[str] | tuple[str, ...]) -> list[str]:
    """Trimmed, de-duplicated (case-insensitively, first spelling kept) tags in their given order."""
    if isinstance(tags, str) or not isinstance(tags, list | tuple):
        raise ValidationError({"tags": "Tags must be a list of strings."})
    seen: set[str] = set()
    result: list[str] = []
    for tag in tags:
        if not isinstance(tag, str):
            raise ValidationError({"tags": "Tags must be a list of strings."})
        tag = " ".join(tag.split())
        if not tag or tag.casefold() in seen:
            continue
        if len(tag) > TAG_CHARS:
            raise ValidationError({"tags": f"A tag is at most {TAG_CHARS} characters."})
        seen.add(tag.casefold())
        result.append(tag)
    if len(result) > MAX_TAGS:
        raise ValidationError({"tags": f"At most {MAX_TAGS} tags."})
    return result


def clean_document_fields(
    *, slug: str, title: str, tags: list[str], summary: str, body: str, language: str | None = None
) -> dict:
    """Validate and normalise a document's fields; raises `ValidationError` keyed by field."""
    errors: dict[str, str] = {}
    slug = (slug or "").strip()
    if not slug or len(slug) > SLUG_CHARS or not _SLUG_RE.match(slug):
        errors["slug"] = (
            f"A slug is 1..{SLUG_CHARS} lowercase letters and digits separated by single '-' or '_'."
        )
    title = " ".join((title or "").split())
    if not title or len(title) > TITLE_CHARS:
        errors["title"] = f"A title is 1..{TITLE_CHARS} characters."
    body = (body or "").replace("\r\n", "\n").replace("\r", "\n").strip("\n")
    if not body.strip():
        errors["body"] = "The body is empty."
    if language and language not in KnowledgeLanguage.values:
        errors["language"] = f"Language must be one of {', '.join(KnowledgeLanguage.values)}."
    try:
        clean_tags = normalize_tags(tags if tags is not None else [])
    except ValidationError as exc:
        errors.update(exc.message_dict)
        clean_tags = []
    if errors:
        raise ValidationError(errors)
    summary = " ".join((summary or "").split())
    return {
        "slug": slug,
        "title": title,
        "tags": clean_tags,
        "summary": summary,
        "body": body,
        "language": language or detect_language(f"{title}\n{summary}\n{body}"),
    }


@dataclass(frozen=True)
class UpsertResult:
    """`outcome` is `created`, `updated` or `unchanged`; `rechunked` says whether chunks were rebuilt."""

    document: KnowledgeDocument
    outcome: str
    rechunked: bool
    chunk_count: int


def upsert_document(
    *,
    slug: str,
    title: str,
    tags: list[str],
    summary: str,
    body: str,
    language: str | None = None,
    source_path: str = "",
) -> UpsertResult:
    """Create or update the document `slug`; rebuild its chunks when the body changed.

    An unchanged document (same fingerprint and source path) is not written. `language` is detected
    from the text when not given. Raises `ValidationError` on invalid fields.
    """
    fields = clean_document_fields(
        slug=slug, title=title, tags=tags, summary=summary, body=body, language=language
    )
    sha = content_sha256(
        title=fields["title"],
        tags=fields["tags"],
        summary=fields["summary"],
        language=fields["language"],
        body=fields["body"],
    )
    source_path = (source_path or "")[:500]
    with transaction.atomic():
        document = KnowledgeDocument.objects.select_for_update().filter(slug=fields["slug"]).first()
        if document is not None and document.content_sha256 == sha and document.source_path == source_path:
            return UpsertResult(document, "unchanged", False, document.chunks.count())
        outcome = "created" if document is None else "updated"
        if document is None:
            document = KnowledgeDocument(slug=fields["slug"])
            body_changed = True
        else:
            body_changed = document.body != fields["body"] or not document.chunks.exists()
        for name in ("title", "tags", "summary", "body", "language"):
            setattr(document, name, fields[name])
        document.source_path = source_path
        document.content_sha256 = sha
        document.save()
        if body_changed:
            document.chunks.all().delete()
            drafts = chunk_markdown(document.body)
            KnowledgeChunk.objects.bulk_create(
                KnowledgeChunk(document=document, ordinal=n, heading=draft.heading, text=draft.text)
                for n, draft in enumerate(drafts, start=1)
            )
            chunk_count = len(drafts)
        else:
            chunk_count = document.chunks.count()
        _bump_generation()
        transaction.on_commit(_bump_generation)
    return UpsertResult(document, outcome, body_changed, chunk_count)


def delete_document(*, slug: str) -> bool:
    """Delete the document `slug` and its chunks; False when there was none."""
    with transaction.atomic():
        deleted, _ = KnowledgeDocument.objects.filter(slug=slug).delete()
        if deleted:
            _bump_generation()
            transaction.on_commit(_bump_generation)
    return bool(deleted)
