from django.contrib import admin

from audit.write.runtime_facts import step_label
from core.admin_base import ReadOnlyAdmin
from reasoning.models import AgentReasoningAudit, ReasoningAccessLog


@admin.register(AgentReasoningAudit)
class AgentReasoningAuditAdmin(ReadOnlyAdmin):
    """Metadata only: the content columns are never shown in list or form views. Auditors read content
    through the gated reasoning panel / API, where every read is logged."""

    list_display = (
        "run_id",
        "step",
        "reasoning_available",
        "content_source",
        "content_bytes",
        "purged_at",
        "created_at",
    )
    list_filter = (("created_at", admin.DateFieldListFilter), "reasoning_available", "content_source")
    search_fields = ("=run_id", "=session_id")
    exclude = ("reasoning_content", "assistant_text")
    ordering = ("-created_at",)
    sortable_by = ("created_at",)  # every order and filter is an index (`reasoning.models`)

    @admin.display(description="step", ordering="step_index")
    def step(self, row: AgentReasoningAudit) -> str:
        return step_label(row.step_index, row.agent_name)

    def get_queryset(self, request):
        # The text columns are not even read (nor decrypted) for these views.
        return super().get_queryset(request).defer("reasoning_content", "assistant_text")


@admin.register(ReasoningAccessLog)
class ReasoningAccessLogAdmin(ReadOnlyAdmin):
    """Who read which run's reasoning; superusers only."""

    list_display = (
        "accessed_at",
        "username",
        "session_id",
        "run_id",
        "records_returned",
        "channel",
        "client_address",
    )
    list_filter = (("accessed_at", admin.DateFieldListFilter), "channel")
    search_fields = ("=run_id", "=session_id", "=username")
    ordering = ("-accessed_at",)
    sortable_by = ("accessed_at",)

    def has_module_permission(self, request) -> bool:
        return request.user.is_active and request.user.is_superuser

    def has_view_permission(self, request, obj=None) -> bool:
        return request.user.is_active and request.user.is_superuser
