"""Adding runs to a dataset from the console (issue 34 item 3): the run list's action *Add the selected
runs to a dataset* (with Django's "select all N" it takes the whole filtered list: e.g. *review verdict:
incorrect* and a created range), the run page's *Add to dataset* link, and the review-verdict filter
that makes "every run reviewed incorrect last month" one click.

Both lead to one form (`datasets/add/?run=…`, or the action's selection carried as `run` values): the
dataset's name (an existing one, offered, or a new one) and a note; POST writes a new version through
`experiments.datasets.add_runs` (append-only) and opens it. Needs `experiments.add_dataset` besides
the run admin's view permission.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import urlencode

from audit.models import ReviewVerdict
from experiments.datasets import MAX_ADD, DatasetError, add_runs
from experiments.models import Dataset

PERMISSION = "experiments.add_dataset"


class ReviewVerdictFilter(admin.SimpleListFilter):
    """Runs by their latest review's verdict (`review_verdict`), or not reviewed."""

    title = "review verdict"
    parameter_name = "review_verdict"

    def lookups(self, request, model_admin):
        return [("none", "Not reviewed"), *ReviewVerdict.choices]

    def queryset(self, request, queryset):
        value = self.value()
        if value == "none":
            return queryset.filter(review_verdict="")
        if value in ReviewVerdict.values:
            return queryset.filter(review_verdict=value)
        return queryset


def add_url(run_ids) -> str:
    return (
        reverse("admin:diagnosis_diagnosisrun_add_to_dataset") + "?" + urlencode({"run": list(run_ids)}, True)
    )


@admin.action(description="Add the selected runs to a dataset", permissions=["view"])
def add_to_dataset(model_admin, request, queryset):
    if not request.user.has_perm(PERMISSION):
        model_admin.message_user(
            request, "Adding to datasets needs the permission to add datasets.", messages.ERROR
        )
        return None
    ids = list(queryset.order_by("created_at", "id").values_list("run_id", flat=True)[: MAX_ADD + 1])
    if len(ids) > MAX_ADD:
        model_admin.message_user(
            request, f"At most {MAX_ADD} runs at a time: narrow the filter.", messages.ERROR
        )
        return None
    return _form(model_admin, request, ids, note=_filter_note(request))


def _filter_note(request) -> str:
    """The list's filters the selection came from, as the version's note."""
    query = request.META.get("HTTP_REFERER", "").partition("?")[2]
    return f"from the run list: {query}"[:500] if query else "selected in the run list"


def _form(model_admin, request, run_ids, *, note: str = "", error: str = ""):
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.opts,
        "title": "Add runs to a dataset",
        "run_ids": run_ids,
        "names": list(Dataset.objects.order_by("name").values_list("name", flat=True).distinct()),
        "note": note,
        "error": error,
        "action_url": reverse("admin:diagnosis_diagnosisrun_add_to_dataset"),
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/diagnosis/diagnosisrun/add_to_dataset.html", context)


def add_to_dataset_view(model_admin, request):
    """GET `?run=…` (repeated): the form; POST `run`, `name`, `note`: the new version."""
    if not request.user.has_perm(PERMISSION):
        raise PermissionDenied
    source = request.POST if request.method == "POST" else request.GET
    run_ids = [r for r in source.getlist("run") if r][:MAX_ADD]
    visible = set(
        model_admin.get_queryset(request).filter(run_id__in=run_ids).values_list("run_id", flat=True)
    )
    run_ids = [r for r in run_ids if r in visible]
    if request.method != "POST":
        return _form(model_admin, request, run_ids, note=source.get("note", ""))
    try:
        dataset = add_runs(
            name=request.POST.get("name", ""),
            runs=run_ids,
            by=request.user.get_username(),
            note=request.POST.get("note", ""),
        )
    except DatasetError as exc:
        return _form(model_admin, request, run_ids, note=request.POST.get("note", ""), error=str(exc))
    model_admin.message_user(request, f"{dataset}: {dataset.item_count} items.", messages.SUCCESS)
    return HttpResponseRedirect(reverse("admin:experiments_dataset_change", args=[dataset.pk]))
