"""Sessions in the admin: folders of runs, each with its runs inline (newest first, linking to their run
pages). Read-only: a session is never added or deleted here.

The list reads the session's stored `run_count` and `last_run_at` (no join over runs), orders by the
indexed `(-created_at, -id)`, counts at most 10 000 rows (`core.admin_lists`), filters by indexed date
ranges and searches a session id by its beginning on the unique index."""

from __future__ import annotations

from django.contrib import admin
from django.utils.text import Truncator

from core.admin_lists import ScalableListAdmin
from diagnosis.models import ChatSession, DiagnosisRun
from surfaces.admin.display import QUERY_PREVIEW_CHARS


class RunInline(admin.TabularInline):
    """A session's runs, newest first, each linking to its run page."""

    model = DiagnosisRun
    fields = (
        "run_id",
        "query_preview",
        "status",
        "intent",
        "release_decision",
        "tokens_total",
        "tokens_reconciled",
        "created_at",
    )
    readonly_fields = fields
    ordering = ("-created_at",)
    extra = 0
    can_delete = False
    show_change_link = True

    @admin.display(description="query")
    def query_preview(self, run: DiagnosisRun) -> str:
        return Truncator(run.query).chars(QUERY_PREVIEW_CHARS)

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(ChatSession)
class ChatSessionAdmin(ScalableListAdmin, admin.ModelAdmin):
    """Sessions (folders of runs) with their runs inline; never added or deleted here."""

    list_display = ("session_id", "owner", "title", "run_count", "last_run_at", "created_at")
    list_filter = (("created_at", admin.DateFieldListFilter), ("last_run_at", admin.DateFieldListFilter))
    sortable_by = ("session_id", "last_run_at", "created_at")
    search_fields = ("^session_id",)
    search_help_text = "A session id or its beginning."
    list_select_related = False
    list_prefetch_related = ("owner",)  # a second query by primary key: no join in the page query
    readonly_fields = ("session_id", "owner", "run_count", "last_run_at", "created_at", "updated_at")
    ordering = ("-created_at", "-id")
    inlines = [RunInline]

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
