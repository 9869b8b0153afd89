"""The knowledge base in the admin: runbook documents, edited through the ingest service (so that a changed
body is re-chunked and the retrieval index notices), with their chunks read-only inline."""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db.models import Count

from agent.knowledge import ingest
from diagnosis.models import KnowledgeChunk, KnowledgeDocument


class KnowledgeDocumentForm(forms.ModelForm):
    """Tags are edited as comma-separated text; every field is validated by the knowledge service."""

    tags = forms.CharField(required=False, help_text="Comma-separated, e.g. mysql, replication, lag.")

    class Meta:
        model = KnowledgeDocument
        fields = ("slug", "title", "tags", "summary", "body", "language")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk and isinstance(self.instance.tags, list):
            self.initial["tags"] = ", ".join(self.instance.tags)

    def clean_tags(self) -> list[str]:
        return [tag.strip() for tag in (self.cleaned_data.get("tags") or "").split(",") if tag.strip()]

    def clean(self):
        cleaned = super().clean()
        slug = self.instance.slug if self.instance.pk else cleaned.get("slug", "")
        try:
            fields = ingest.clean_document_fields(
                slug=slug,
                title=cleaned.get("title", ""),
                tags=cleaned.get("tags", []),
                summary=cleaned.get("summary", ""),
                body=cleaned.get("body", ""),
                language=cleaned.get("language") or None,
            )
        except ValidationError as exc:
            for name, messages in exc.message_dict.items():
                if name not in self.errors:  # a field's own error already says it
                    self.add_error(name if name in self.fields else None, messages)
            return cleaned
        cleaned.update({name: fields[name] for name in ("title", "tags", "summary", "body", "language")})
        return cleaned


class KnowledgeChunkInline(admin.TabularInline):
    model = KnowledgeChunk
    fields = ("ordinal", "heading", "text_preview", "length")
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ("ordinal",)

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    @admin.display(description="text")
    def text_preview(self, obj: KnowledgeChunk) -> str:
        return obj.text if len(obj.text) <= 300 else obj.text[:299] + "…"

    @admin.display(description="characters")
    def length(self, obj: KnowledgeChunk) -> int:
        return len(obj.text)


@admin.register(KnowledgeDocument)
class KnowledgeDocumentAdmin(admin.ModelAdmin):
    """Runbooks for `lookup_knowledge`. Saving goes through `agent.knowledge.ingest.upsert_document`,
    so a changed body is re-chunked and the retrieval index notices; the slug is fixed once created."""

    form = KnowledgeDocumentForm
    list_display = ("slug", "title", "language", "chunk_count", "updated_at")
    list_filter = ("language",)
    search_fields = ("slug", "title", "summary")
    readonly_fields = ("source_path", "content_sha256", "created_at", "updated_at")
    inlines = [KnowledgeChunkInline]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(_chunk_count=Count("chunks"))

    def get_readonly_fields(self, request, obj=None):
        return ("slug", *self.readonly_fields) if obj is not None else self.readonly_fields

    @admin.display(description="chunks", ordering="_chunk_count")
    def chunk_count(self, obj: KnowledgeDocument) -> int:
        return obj._chunk_count

    def save_model(self, request, obj, form, change) -> None:
        result = ingest.upsert_document(
            slug=obj.slug,
            title=obj.title,
            tags=obj.tags,
            summary=obj.summary,
            body=obj.body,
            language=obj.language or None,
            source_path=obj.source_path,
        )
        saved = result.document
        for name in ("id", "slug", "title", "tags", "summary", "body", "language", "content_sha256"):
            setattr(obj, name, getattr(saved, name))
        obj.created_at, obj.updated_at = saved.created_at, saved.updated_at
        obj._state.adding = False

    def delete_model(self, request, obj) -> None:
        ingest.delete_document(slug=obj.slug)

    def delete_queryset(self, request, queryset) -> None:
        for slug in list(queryset.values_list("slug", flat=True)):
            ingest.delete_document(slug=slug)
