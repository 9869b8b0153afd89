"""Load markdown runbooks (`*.md` with front matter) from a directory into the knowledge base."""

from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from agent.knowledge.ingest import (
    SLUG_CHARS,
    clean_document_fields,
    delete_document,
    parse_markdown,
    upsert_document,
)
from diagnosis.models import KnowledgeDocument


def stored_path(path: Path) -> str:
    """The path recorded on the document: relative to the project when inside it, else absolute."""
    path = path.resolve()
    try:
        return str(path.relative_to(Path(settings.BASE_DIR).resolve()))
    except ValueError:
        return str(path)


class Command(BaseCommand):
    help = (
        "Load DIR/*.md (front matter: title, tags: [a, b], summary, optional language) as knowledge "
        "documents; slug = file name without .md. Idempotent: unchanged files are skipped, changed ones "
        "re-chunked. All files are validated before anything is written."
    )

    def add_arguments(self, parser):
        parser.add_argument("directory", help="directory holding the *.md runbooks")
        parser.add_argument(
            "--prune",
            action="store_true",
            help="delete documents loaded from this directory whose file no longer exists",
        )

    def handle(self, *args, directory, prune=False, **options):
        root = Path(directory)
        if not root.is_dir():
            raise CommandError(f"{directory} is not a directory.")
        files = sorted(root.glob("*.md"))
        parsed, errors = [], []
        for path in files:
            slug = path.name[: -len(".md")]
            try:
                doc = parse_markdown(path.read_text(encoding="utf-8"))
                clean_document_fields(
                    slug=slug,
                    title=doc.title,
                    tags=doc.tags,
                    summary=doc.summary,
                    body=doc.body,
                    language=doc.language,
                )
            except UnicodeDecodeError:
                errors.append(f"{path.name}: not UTF-8")
                continue
            except ValidationError as exc:
                messages = exc.message_dict if hasattr(exc, "error_dict") else {"file": exc.messages}
                if "slug" in messages:
                    messages["slug"] = [f"file name must be a slug of at most {SLUG_CHARS} characters"]
                detail = "; ".join(f"{key}: {' '.join(msgs)}" for key, msgs in messages.items())
                errors.append(f"{path.name}: {detail}")
                continue
            parsed.append((slug, stored_path(path), doc))
        if errors:
            raise CommandError("Nothing loaded; invalid files:\n  " + "\n  ".join(errors))

        counts = {"created": 0, "updated": 0, "unchanged": 0}
        chunks = rechunked = 0
        for slug, source_path, doc in parsed:
            result = upsert_document(
                slug=slug,
                title=doc.title,
                tags=doc.tags,
                summary=doc.summary,
                body=doc.body,
                language=doc.language,
                source_path=source_path,
            )
            counts[result.outcome] += 1
            chunks += result.chunk_count
            rechunked += int(result.rechunked)

        pruned = 0
        if prune:
            present = {stored_path(path) for path in files}
            folder = stored_path(root)
            for document in KnowledgeDocument.objects.filter(source_path__startswith=folder).only(
                "slug", "source_path"
            ):
                if str(Path(document.source_path).parent) == folder and document.source_path not in present:
                    pruned += int(delete_document(slug=document.slug))

        summary = (
            f"Knowledge from {directory}: {len(files)} files, {counts['created']} created, "
            f"{counts['updated']} updated, {counts['unchanged']} unchanged, {rechunked} re-chunked, "
            f"{chunks} chunks"
        )
        if prune:
            summary += f", {pruned} pruned"
        self.stdout.write(summary + ".")
