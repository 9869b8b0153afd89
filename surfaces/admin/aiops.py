"""AI Ops analyses in the admin: one row per analysis (its alert and its run), filterable by alert name,
severity, source and the run's status and release decision, linking to the run page where the report,
the planner and executor lanes and the whole record are. Read-only: analyses start from the webhook,
the API, `manage.py aiops` or the "Analyse an alert" page (`surfaces.admin.analyse`)."""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from core.admin_base import ReadOnlyAdmin
from diagnosis.models import AiOpsAlert
from surfaces.admin.display import chip, provider_chip
from surfaces.admin.runs import CONSOLE_MEDIA

MAX_FILTER_CHOICES = 50


class _DistinctValueFilter(admin.SimpleListFilter):
    """A filter over the distinct values of one indexed column (at most `MAX_FILTER_CHOICES`)."""

    field = ""

    def lookups(self, request, model_admin):
        values = (
            AiOpsAlert.objects.exclude(**{self.field: ""})
            .order_by(self.field)
            .values_list(self.field, flat=True)
            .distinct()[:MAX_FILTER_CHOICES]
        )
        return [(v, v) for v in values]

    def queryset(self, request, queryset):
        value = self.value()
        return queryset.filter(**{self.field: value}) if value else queryset


class AlertNameFilter(_DistinctValueFilter):
    title = "alert name"
    parameter_name = "alertname"
    field = "alertname"


class SeverityFilter(_DistinctValueFilter):
    title = "severity"
    parameter_name = "severity"
    field = "severity"


@admin.register(AiOpsAlert)
class AiOpsAnalysisAdmin(ReadOnlyAdmin):
    """AI Ops analyses, newest first; each row links to its run page (the report and its record)."""

    list_display = (
        "run_link",
        "alertname_label",
        "severity_label",
        "source",
        "provider_label",
        "status_chip",
        "release_chip",
        "alert_count",
        "notifications",
        "created",
    )
    list_display_links = None
    list_filter = (
        AlertNameFilter,
        SeverityFilter,
        "source",
        "run__status",
        "run__release_decision",
    )
    list_prefetch_related = ("run",)
    search_fields = ("=alertname",)
    search_help_text = "Exact run id or alert name."
    ordering = ("-created_at", "-id")
    list_per_page = 100
    show_full_result_count = False

    @property
    def media(self):
        return super().media + CONSOLE_MEDIA

    def get_search_results(self, request, queryset, search_term):
        # A run id is matched exactly on the row's own unique column (no join, no case folding).
        term = search_term.strip()
        if term.startswith("run_"):
            return queryset.filter(run_id=term), False
        return super().get_search_results(request, queryset, search_term)

    def changelist_view(self, request, extra_context=None):
        return super().changelist_view(request, {"is_nav_sidebar_enabled": False, **(extra_context or {})})

    @admin.display(description="provider")
    def provider_label(self, alert: AiOpsAlert):
        return provider_chip(alert.run.provider)

    @admin.display(description="run", ordering="run_id")
    def run_link(self, alert: AiOpsAlert):
        return format_html(
            '<a class="dc-mono dc-run-link" href="{}">{}</a>',
            reverse("admin:diagnosis_diagnosisrun_change", args=[alert.run.pk]),
            alert.run_id,
        )

    @admin.display(description="alert", ordering="alertname")
    def alertname_label(self, alert: AiOpsAlert) -> str:
        return alert.alertname or "—"

    @admin.display(description="severity", ordering="severity")
    def severity_label(self, alert: AiOpsAlert) -> str:
        return alert.severity or "—"

    @admin.display(description="status")
    def status_chip(self, alert: AiOpsAlert):
        return chip(alert.run.status)

    @admin.display(description="release")
    def release_chip(self, alert: AiOpsAlert):
        return chip(alert.run.release_decision)

    @admin.display(description="created", ordering="created_at")
    def created(self, alert: AiOpsAlert):
        at = timezone.localtime(alert.created_at)
        return format_html('<span title="{}">{}</span>', at.isoformat(), at.strftime("%m-%d %H:%M:%S"))
