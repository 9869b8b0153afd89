"""Sessions in the admin: folders of runs, each with its runs inline (newest first, linking to their run
pages). Read-only: a session is never added or deleted here."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import Count
from django.utils.text import Truncator

from diagnosis.admin.display import QUERY_PREVIEW_CHARS
from diagnosis.models import ChatSession, DiagnosisRun


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
class ChatSessionAdmin(admin.ModelAdmin):
    """Sessions (folders of runs) with their runs inline; never added or deleted here."""

    list_display = ("session_id", "owner", "title", "run_count", "created_at")
    search_fields = ("=session_id", "title")
    list_select_related = ("owner",)
    readonly_fields = ("session_id", "owner", "created_at", "updated_at")
    date_hierarchy = "created_at"
    inlines = [RunInline]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(_run_count=Count("runs"))

    @admin.display(description="runs", ordering="_run_count")
    def run_count(self, session: ChatSession) -> int:
        return session._run_count

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
