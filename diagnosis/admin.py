from django.contrib import admin

from diagnosis.models import ChatSession, DiagnosisRun, RunFeedback


class RunInline(admin.TabularInline):
    model = DiagnosisRun
    fields = ("run_id", "status", "intent", "release_decision", "tokens_total", "created_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(ChatSession)
class ChatSessionAdmin(admin.ModelAdmin):
    list_display = ("session_id", "owner", "title", "created_at")
    search_fields = ("=session_id", "title")
    list_select_related = ("owner",)
    readonly_fields = ("session_id", "owner", "created_at", "updated_at")
    inlines = [RunInline]

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(DiagnosisRun)
class DiagnosisRunAdmin(admin.ModelAdmin):
    list_display = (
        "run_id",
        "session_id",
        "status",
        "intent",
        "release_decision",
        "tokens_total",
        "tokens_reconciled",
        "created_at",
    )
    list_filter = ("status", "release_decision", "intent", "tokens_reconciled")
    search_fields = ("=run_id", "=session__session_id", "query")
    date_hierarchy = "created_at"

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(RunFeedback)
class RunFeedbackAdmin(admin.ModelAdmin):
    list_display = ("run_id", "user", "rating", "created_at")
    list_filter = ("rating",)
    list_select_related = ("user",)
    readonly_fields = ("run", "user", "rating", "comment", "created_at", "updated_at")

    def has_add_permission(self, request) -> bool:
        return False
