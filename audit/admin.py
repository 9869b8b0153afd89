from django.contrib import admin

from audit.admin_base import ReadOnlyAdmin
from audit.models import AgentStep, ToolInvocation, TraceEvent


@admin.register(TraceEvent)
class TraceEventAdmin(ReadOnlyAdmin):
    list_display = ("run_id", "sequence_no", "phase", "event_type", "status", "summary", "created_at")
    list_filter = ("phase", "event_type")
    search_fields = ("=run__run_id", "=session_id")
    list_select_related = False
    ordering = ("-created_at",)


@admin.register(AgentStep)
class AgentStepAdmin(ReadOnlyAdmin):
    list_display = (
        "run_id",
        "step_index",
        "agent_name",
        "model",
        "has_tool_call",
        "finish_reason",
        "total_tokens",
        "usage_available",
        "reasoning_available",
        "content_source",
        "created_at",
    )
    list_filter = ("usage_available", "reasoning_available", "content_source")
    search_fields = ("=run__run_id", "=session_id")
    ordering = ("-created_at",)


@admin.register(ToolInvocation)
class ToolInvocationAdmin(ReadOnlyAdmin):
    list_display = (
        "run_id",
        "tool_call_id",
        "tool_name",
        "status",
        "retrieval_layer",
        "output_length",
        "duration_ms",
        "started_at",
    )
    list_filter = ("status", "tool_name", "retrieval_layer")
    search_fields = ("=run__run_id", "=session_id", "=tool_call_id")
    ordering = ("-created_at",)
