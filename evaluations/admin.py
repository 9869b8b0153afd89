"""Evaluators in the admin (staff with the model permissions configure them) and their scores
(read-only: a score is part of the run's record, changed only by a database writer, which
`verify_audit` names).

The list says when each evaluator last scored and how many runs wait for it, and whether the
background duties of the serving processes score them (`EVALUATION_DUTY_INTERVAL_SECONDS`).
An evaluator that has scored a run is frozen: its configuration is shown read-only and only `enabled`
may change, so every score names exactly the configuration that gave it. "New version" copies the
selected evaluators to their next version (enabled) and disables the old rows.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib import admin, messages
from django.db import transaction
from django.db.models import Max

from core.admin_base import ReadOnlyAdmin
from evaluations.models import EvaluationScore, Evaluator
from evaluations.selectors import waiting

CONFIG_FIELDS = (
    "name",
    "version",
    "kind",
    "description",
    "judge_model",
    "judge_prompt",
    "min_coverage",
    "min_chars",
    "max_chars",
    "forbidden_patterns",
    "max_latency_ms",
    "max_cost_usd",
    "flows",
    "intents",
    "release_decisions",
    "sample_rate",
)


def next_version(evaluator: Evaluator) -> Evaluator:
    """Copy `evaluator` to the next free version of its name (enabled); disable the old row."""
    with transaction.atomic():
        top = (
            Evaluator.objects.select_for_update().filter(name=evaluator.name).aggregate(v=Max("version"))["v"]
        )
        copy = Evaluator.objects.get(pk=evaluator.pk)
        copy.pk = None
        copy.version = (top or 0) + 1
        copy.enabled = True
        copy.save()
        Evaluator.objects.filter(pk=evaluator.pk).update(enabled=False)
    return copy


@admin.register(Evaluator)
class EvaluatorAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "version",
        "kind",
        "enabled",
        "sample_rate",
        "flows",
        "intents",
        "release_decisions",
        "last_scored",
        "waiting_runs",
    )
    list_filter = ("kind", "enabled")
    search_fields = ("name", "description")
    ordering = ("name", "-version")
    actions = ("new_version",)
    change_list_template = "admin/evaluations/evaluator/change_list.html"

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(last_score_at=Max("scores__created_at"))

    @admin.display(description="last scored", ordering="last_score_at", empty_value="never")
    def last_scored(self, obj):
        return obj.last_score_at

    @admin.display(description="runs waiting")
    def waiting_runs(self, obj) -> int:
        return waiting(evaluator=obj)

    def changelist_view(self, request, extra_context=None):
        interval = float(settings.EVALUATION_DUTY_INTERVAL_SECONDS)
        extra = {"duty_interval": interval, "lookback_hours": float(settings.EVALUATION_LOOKBACK_HOURS)}
        return super().changelist_view(request, {**(extra_context or {}), **extra})

    def get_readonly_fields(self, request, obj=None):
        if obj is not None and obj.scores.exists():
            return (*CONFIG_FIELDS, "created_at")
        return ("created_at",)

    def has_delete_permission(self, request, obj=None) -> bool:
        return super().has_delete_permission(request, obj) and not (obj is not None and obj.scores.exists())

    @admin.action(description="New version (copy, enable it, disable this one)", permissions=["add"])
    def new_version(self, request, queryset):
        made = [next_version(e) for e in queryset]
        self.message_user(
            request, "Created " + ", ".join(e.label for e in made) + ".", level=messages.SUCCESS
        )


@admin.register(EvaluationScore)
class EvaluationScoreAdmin(ReadOnlyAdmin):
    list_display = (
        "run_id",
        "evaluator_name",
        "evaluator_version",
        "label",
        "value",
        "judge_model",
        "created_at",
    )
    list_filter = ("evaluator_name", "label", "kind")
    search_fields = ("run_id", "score_id", "fingerprint")
    ordering = ("-created_at", "-id")
