from django.contrib import admin, messages
from django.utils.html import format_html

from audit.admin_base import ReadOnlyAdmin
from audit.models import AgentStep, Checkpoint, LogLeaf, ToolInvocation, TraceEvent
from audit.transparency import store
from audit.transparency.keys import verification_keys
from audit.transparency.verify import check_checkpoint, verify_log


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


@admin.register(Checkpoint)
class CheckpointAdmin(ReadOnlyAdmin):
    """The transparency log's signed checkpoints, newest first, each with its verification state: its
    signature by a known key, its link to the previous checkpoint, and its root against the stored tree
    (O(log n) stored nodes per row). The action verifies the whole log as `manage.py verify_audit` does."""

    list_display = ("tree_size", "signed_at", "key_id", "root", "verification")
    search_fields = ("=checkpoint_hash", "=root_hash", "=key_id")
    ordering = ("-tree_size",)
    list_per_page = 25
    actions = ["verify_whole_log"]
    readonly_fields = (
        "tree_size",
        "root_hash",
        "signed_at",
        "key_id",
        "previous_hash",
        "checkpoint_hash",
        "body",
        "signature",
        "verification",
    )

    @admin.display(description="root")
    def root(self, cp: Checkpoint) -> str:
        return f"{cp.root_hash[:16]}…"

    @admin.display(description="verification")
    def verification(self, cp: Checkpoint):
        problems = check_checkpoint(cp, verification_keys())
        previous = (
            Checkpoint.objects.filter(tree_size__lt=cp.tree_size)
            .order_by("-tree_size")
            .values_list("checkpoint_hash", flat=True)
            .first()
        )
        if cp.previous_hash != (previous or ""):
            problems.append("does not name the previous checkpoint")
        try:
            if store.root(cp.tree_size).hex() != cp.root_hash:
                problems.append("root does not match the stored tree")
        except store.TreeIncomplete as exc:
            problems.append(str(exc))
        if problems:
            return format_html('<strong style="color:#ba2121">invalid</strong>: {}', "; ".join(problems))
        return format_html("verified: signed by key {}, root matches the stored tree", cp.key_id)

    @admin.action(description="Verify the whole transparency log (every leaf, node and checkpoint)")
    def verify_whole_log(self, request, queryset):
        result = verify_log()
        if result.ok:
            self.message_user(
                request,
                f"The log verifies: {result.leaves} leaves, {result.checkpoints} checkpoints.",
                messages.SUCCESS,
            )
            return
        for problem in result.invalid[:20]:
            self.message_user(request, problem, messages.ERROR)
        if len(result.invalid) > 20:
            self.message_user(request, f"… {len(result.invalid) - 20} more problem(s)", messages.ERROR)


@admin.register(LogLeaf)
class LogLeafAdmin(ReadOnlyAdmin):
    """The log's leaves: which run sits at which index, and what its leaf commits to."""

    list_display = ("leaf_index", "run_id", "session_id", "appended_at")
    search_fields = ("=run_id", "=session_id")
    ordering = ("-leaf_index",)
    readonly_fields = ("leaf_index", "run_id", "session_id", "leaf_hash", "data", "appended_at")
