"""Datasets and experiments in the admin: read-only (like django-auditlog's log), because versions and
items are append-only and an experiment is a record of what ran.

Datasets list their versions and items, download a version as `items.jsonl`, and replay a version
under a candidate (the action needs `experiments.add_experiment`; it runs synchronously, so a large
dataset belongs to `manage.py run_experiment`). Experiments show their results page
(`experiments.results`).
Details: docs/experiments.md and docs/admin.md, *Datasets and experiments*.
"""

from __future__ import annotations

import json

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect, StreamingHttpResponse
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse

from agent.runtime.candidate import Candidate, CandidateError
from core.admin_base import ReadOnlyAdmin
from experiments.datasets import export_jsonl
from experiments.models import Dataset, DatasetItem, Experiment
from experiments.results import experiment_results
from experiments.runner import run_experiment

ADMIN_MAX_ITEMS = 200  # larger datasets: manage.py run_experiment


class ItemInline(admin.TabularInline):
    model = DatasetItem
    fields = ("position", "source_run_id", "question", "release_decision", "reference", "reviews", "scores")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Dataset)
class DatasetAdmin(ReadOnlyAdmin):
    """Dataset versions (read-only); `items.jsonl` and the experiment action (module docstring)."""

    list_display = ("name", "version", "item_count", "origin", "note", "created_by", "created_at", "download")
    list_filter = ("name", "origin")
    readonly_fields = (
        "name",
        "version",
        "parent",
        "origin",
        "note",
        "created_by",
        "created_at",
        "item_count",
    )
    inlines = [ItemInline]
    actions = ["start_experiment"]

    @admin.display(description="JSON Lines")
    def download(self, dataset: Dataset):
        from django.utils.html import format_html

        return format_html(
            '<a href="{}">items.jsonl</a>', reverse("admin:experiments_dataset_jsonl", args=[dataset.pk])
        )

    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path("<int:pk>/items.jsonl", wrap(self.jsonl_view), name="experiments_dataset_jsonl"),
            path("<int:pk>/experiment/", wrap(self.experiment_view), name="experiments_dataset_experiment"),
            *super().get_urls(),
        ]

    def jsonl_view(self, request, pk):
        if not self.has_view_permission(request):
            raise PermissionDenied
        dataset = get_object_or_404(Dataset, pk=pk)
        response = StreamingHttpResponse(
            export_jsonl(dataset), content_type="application/jsonl; charset=utf-8"
        )
        filename = f"{dataset.name}-v{dataset.version}.jsonl".replace(" ", "_").replace('"', "")
        response["Content-Disposition"] = f'attachment; filename="{filename}"'
        return response

    @admin.action(description="Run an experiment on the selected version", permissions=["view"])
    def start_experiment(self, request, queryset):
        chosen = list(queryset[:2])
        if len(chosen) != 1:
            self.message_user(request, "Select exactly one dataset version.", messages.ERROR)
            return None
        return HttpResponseRedirect(reverse("admin:experiments_dataset_experiment", args=[chosen[0].pk]))

    def experiment_view(self, request, pk):
        if not request.user.has_perm("experiments.add_experiment"):
            raise PermissionDenied
        dataset = get_object_or_404(Dataset, pk=pk)
        error, text = "", request.POST.get("candidate", "") if request.method == "POST" else ""
        if request.method == "POST":
            try:
                if dataset.item_count > ADMIN_MAX_ITEMS:
                    raise CandidateError(f"more than {ADMIN_MAX_ITEMS} items: use manage.py run_experiment")
                try:
                    data = json.loads(text or "{}")
                except ValueError:
                    raise CandidateError("the candidate is not JSON") from None
                experiment = run_experiment(
                    dataset=dataset,
                    candidate=Candidate.from_mapping(data),
                    user=request.user,
                    name=request.POST.get("name", ""),
                )
            except CandidateError as exc:
                error = str(exc)
            else:
                return HttpResponseRedirect(
                    reverse("admin:experiments_experiment_change", args=[experiment.pk])
                )
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Run an experiment on {dataset}",
            "dataset": dataset,
            "candidate": text,
            "name": request.POST.get("name", "") if request.method == "POST" else "",  # kept on a refusal
            "error": error,
        }
        return TemplateResponse(request, "admin/experiments/dataset/run_experiment.html", context)


@admin.register(DatasetItem)
class DatasetItemAdmin(ReadOnlyAdmin):
    list_display = ("dataset", "position", "source_run_id", "question", "release_decision")
    list_filter = ("dataset__name",)
    search_fields = ("source_run_id",)


@admin.register(Experiment)
class ExperimentAdmin(ReadOnlyAdmin):
    """Experiments (read-only); the change page is the results page."""

    list_display = (
        "name",
        "dataset",
        "status",
        "candidate_fingerprint",
        "created_by",
        "created_at",
        "finished_at",
    )
    list_filter = ("status",)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        if not self.has_view_permission(request):
            raise PermissionDenied
        experiment = get_object_or_404(Experiment, pk=object_id)
        results = experiment_results(experiment)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Experiment {experiment.name}",
            "experiment": experiment,
            "results": results,
            "candidate_json": json.dumps(experiment.candidate, indent=2, ensure_ascii=False),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/experiments/experiment/results.html", context)
