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
from surfaces.admin.display import chip, column, provider_chip
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
        "source_label",
        "provider_label",
        "status_chip",
        "release_chip",
        "alerts",
        "notified",
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

    @admin.display(description=column("provider", "who answered (DEMO: the offline demo model)"))
    def provider_label(self, alert: AiOpsAlert):
        return provider_chip(alert.run.provider)

    @admin.display(description=column("run", "the analysis run (its page)"), ordering="run_id")
    def run_link(self, alert: AiOpsAlert):
        return format_html(
            '<a class="dc-mono dc-run-link" href="{}">{}</a>',
            reverse("admin:diagnosis_diagnosisrun_change", args=[alert.run.pk]),
            alert.run_id,
        )

    @admin.display(description=column("alert", "the alert's name (alertname)"), ordering="alertname")
    def alertname_label(self, alert: AiOpsAlert) -> str:
        return alert.alertname or "—"

    @admin.display(description=column("severity", "the alert's severity label"), ordering="severity")
    def severity_label(self, alert: AiOpsAlert) -> str:
        return alert.severity or "—"

    @admin.display(description=column("source", "who started it: Alertmanager's webhook, staff, a shell"))
    def source_label(self, alert: AiOpsAlert) -> str:
        return alert.get_source_display()

    @admin.display(description=column("status", "where the run is: pending, running, succeeded …"))
    def status_chip(self, alert: AiOpsAlert):
        return chip(alert.run.status)

    @admin.display(description=column("release", "published, or blocked by the guards"))
    def release_chip(self, alert: AiOpsAlert):
        return chip(alert.run.release_decision)

    # The two bare numbers of the list, said in words (surfaces.admin.display.column).
    @admin.display(
        description=column("alerts", "alerts firing in the group when the analysis started"),
        ordering="alert_count",
    )
    def alerts(self, alert: AiOpsAlert) -> int:
        return alert.alert_count

    @admin.display(
        description=column("notified", "times Alertmanager sent this firing (re-sends start no new run)"),
        ordering="notifications",
    )
    def notified(self, alert: AiOpsAlert) -> int:
        return alert.notifications

    @admin.display(
        description=column("created", "when the analysis started (server time zone)"), ordering="created_at"
    )
    def created(self, alert: AiOpsAlert):
        at = timezone.localtime(alert.created_at)
        return format_html('<span title="{}">{}</span>', at.isoformat(), at.strftime("%m-%d %H:%M:%S"))
