from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.utils.html import format_html

from audit.events import EVENTS
from audit.models import (
    HOLD_PERMISSION,
    AgentStep,
    Checkpoint,
    GovernanceEvent,
    LegalHold,
    LogLeaf,
    RunReview,
    RunTombstone,
    ToolInvocation,
    TraceEvent,
)
from audit.transparency import store
from audit.transparency.checkpoints import check_checkpoint
from audit.transparency.keys import verification_keys
from audit.transparency.verify import verify_log
from audit.write.retention import lift_hold, place_hold
from core.admin_base import ReadOnlyAdmin


class EventTypeFilter(admin.SimpleListFilter):
    """By event type, offering the types the registry declares (`audit.events`): no scan of the table
    for its distinct values, and a filter a new type joins without a migration."""

    title = "event type"
    parameter_name = "event_type__exact"

    def lookups(self, request, model_admin):
        return [(spec.type, spec.label) for spec in EVENTS]

    def queryset(self, request, queryset):
        return queryset.filter(event_type=self.value()) if self.value() else queryset


@admin.register(TraceEvent)
class TraceEventAdmin(ReadOnlyAdmin):
    list_display = ("run_id", "sequence_no", "phase", "event_type", "status", "summary", "created_at")
    list_filter = (("created_at", admin.DateFieldListFilter), "phase", EventTypeFilter)
    search_fields = ("=run__run_id", "=session_id")
    list_select_related = False
    ordering = ("-created_at",)
    sortable_by = ("created_at",)  # every order and filter is an index (`audit.models`)


@admin.register(RunReview)
class RunReviewAdmin(ReadOnlyAdmin):
    """Human reviews of runs (`audit.write.reviews`): append-only, never edited or deleted, for anyone; each
    is bound into its run's chain by digest. Reviews are recorded on the run page or through the API."""

    list_display = ("run_id", "sequence_no", "verdict", "reviewer_username", "created_at")
    list_filter = (("created_at", admin.DateFieldListFilter),)
    search_fields = ("=run__run_id", "=review_id")
    list_select_related = False
    ordering = ("-created_at",)
    sortable_by = ("created_at",)


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
    list_filter = (
        ("created_at", admin.DateFieldListFilter),
        "agent_name",
        "usage_available",
        "reasoning_available",
        "content_source",
    )
    search_fields = ("=run__run_id", "=session_id")
    ordering = ("-created_at",)
    sortable_by = ("created_at",)


class RetrievalLayerFilter(admin.SimpleListFilter):
    """The tool calls by retrieval layer; calls that retrieved nothing (an empty layer) are "none", a
    choice with a name (an empty link text reads as nothing to a screen reader)."""

    title = "retrieval layer"
    parameter_name = "retrieval_layer"
    NONE = "none"

    def lookups(self, request, model_admin):
        layers = (
            ToolInvocation.objects.order_by("retrieval_layer")
            .values_list("retrieval_layer", flat=True)
            .distinct()[:50]
        )
        return [(layer or self.NONE, layer or "none (no retrieval)") for layer in layers]

    def queryset(self, request, queryset):
        value = self.value()
        if not value:
            return queryset
        return queryset.filter(retrieval_layer="" if value == self.NONE else value)


@admin.register(ToolInvocation)
class ToolInvocationAdmin(ReadOnlyAdmin):
    list_display = (
        "run_id",
        "tool_call_id",
        "agent_name",
        "step_index",
        "tool_name",
        "status",
        "retrieval_layer",
        "output_length",
        "duration_ms",
        "started_at",
    )
    list_filter = (("created_at", admin.DateFieldListFilter), "status", "tool_name", RetrievalLayerFilter)
    search_fields = ("=run__run_id", "=session_id")
    ordering = ("-created_at",)
    sortable_by = ()  # newest first by the indexed created_at only


@admin.register(Checkpoint)
class CheckpointAdmin(ReadOnlyAdmin):
    """The transparency log's signed checkpoints, newest first, each with its verification state: its
        signature by a known key, its link to the previous checkpoint, and its root against the stored tree
        (O(log n) stored nodes per row). The action verifies the whole log as `manage.py verify_audit` does,
    with or without ticked rows."""

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
        "link",
        "link_signature",
        "verification",
    )

    # Actions that act on the whole log, not on the ticked rows: they run without a selection.
    WHOLE_LOG_ACTIONS = frozenset({"verify_whole_log"})

    def changelist_view(self, request, extra_context=None):
        if (
            request.method == "POST"
            and request.POST.get("action") in self.WHOLE_LOG_ACTIONS
            and not request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
        ):
            # Django's admin refuses an action without ticked rows; this one needs none. It is sent as
            # "every row selected" (`select_across`: the queryset is not narrowed to the ticked ids).
            request.POST = request.POST.copy()
            request.POST["select_across"] = "1"
            request.POST.setlist(helpers.ACTION_CHECKBOX_NAME, ["all"])
        return super().changelist_view(request, extra_context)

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
    """The log's leaves: which run (or which governance chain head) sits at which index, and what its
    leaf commits to."""

    list_display = ("leaf_index", "run_id", "governance_sequence_no", "session_id", "appended_at")
    search_fields = ("=run_id", "=session_id")
    ordering = ("-leaf_index",)
    readonly_fields = (
        "leaf_index",
        "run_id",
        "governance_sequence_no",
        "session_id",
        "leaf_hash",
        "data",
        "appended_at",
    )


class LegalHoldForm(forms.ModelForm):
    """Placing a hold: scope, target and reason. Lifting one (on an active hold's page): the reason."""

    lift = forms.CharField(
        label="lift reason", required=False, max_length=1000, help_text="Give a reason to lift this hold."
    )

    class Meta:
        model = LegalHold
        fields = ("scope", "target_id", "reason")


# What a hold records once placed (and lifted): shown, never editable.
_HOLD_RECORD = (
    "scope",
    "target_id",
    "reason",
    "placed_by_username",
    "placed_at",
    "lifted_by_username",
    "lifted_at",
    "lift_reason",
)


@admin.register(LegalHold)
class LegalHoldAdmin(admin.ModelAdmin):
    """Legal holds on sessions and runs (`audit.write.retention`): placed and lifted only by holders of
    `audit.place_legal_hold`, through the services that record who, when and why; never deleted."""

    form = LegalHoldForm
    list_display = ("scope", "target_id", "reason", "placed_by_username", "placed_at", "active", "lifted_at")
    list_filter = ("scope", ("lifted_at", admin.EmptyFieldListFilter))
    search_fields = ("=target_id", "placed_by_username")
    ordering = ("-placed_at",)

    @admin.display(boolean=True, description="active")
    def active(self, hold: LegalHold) -> bool:
        return hold.active

    def _may(self, request) -> bool:
        return request.user.is_active and request.user.has_perm(HOLD_PERMISSION)

    def has_add_permission(self, request) -> bool:
        return self._may(request)

    def has_change_permission(self, request, obj=None) -> bool:
        return self._may(request) and (obj is None or obj.active)

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def get_fields(self, request, obj=None):
        if obj is None:
            return ("scope", "target_id", "reason")
        return (*_HOLD_RECORD, *(("lift",) if obj.active and self._may(request) else ()))

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return ()
        return _HOLD_RECORD

    def save_model(self, request, obj, form, change):
        if not change:
            placed = place_hold(
                user=request.user,
                scope=form.cleaned_data["scope"],
                target_id=form.cleaned_data["target_id"],
                reason=form.cleaned_data["reason"],
            )
            obj.pk = placed.pk
            obj.refresh_from_db()
        elif form.cleaned_data.get("lift"):
            lift_hold(user=request.user, hold=obj, reason=form.cleaned_data["lift"])
            obj.refresh_from_db()


@admin.register(RunTombstone)
class RunTombstoneAdmin(ReadOnlyAdmin):
    """What is left of runs purged by retention: ids, leaf, when, why, how many rows."""

    list_display = ("run_id", "session_id", "leaf_index", "finished_at", "purged_at", "purged_by")
    search_fields = ("=run_id", "=session_id")
    ordering = ("-purged_at",)


@admin.register(GovernanceEvent)
class GovernanceEventAdmin(ReadOnlyAdmin):
    """The governance chain: every change to who may do what (access.signals, access.services). Read
    only for everyone; superusers only, like the reasoning access log."""

    list_display = (
        "sequence_no",
        "created_at",
        "event_type",
        "actor",
        "subject_user",
        "group",
        "permission",
    )
    list_filter = ("event_type",)
    search_fields = ("subject_user", "actor", "group", "permission")
    date_hierarchy = "created_at"
    ordering = ("-sequence_no",)

    def has_module_permission(self, request) -> bool:
        return request.user.is_active and request.user.is_superuser

    def has_view_permission(self, request, obj=None) -> bool:
        return request.user.is_active and request.user.is_superuser
