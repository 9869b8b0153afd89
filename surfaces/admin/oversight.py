"""The auditor's pages beside the run list: the review form's target, the review queue and the
comparison of two runs. Views of `DiagnosisRunAdmin` (wrapped by `admin_view`: login, staff,
never_cache, csrf_protect); each reads through selectors and writes through `audit.write.reviews`.

`review_view` (POST `<run>/review/`) records a review and returns to the run page or the queue's next
run; `queue_view`, `claim_view` and `next_view` show and claim the runs that need a human
(`diagnosis.review_queue`); `compare_view` draws two runs side by side (`surfaces.admin.compare`).
Details: docs/admin.md, *Reviews*, *The review queue* and *Compare two runs*.
"""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode

from audit.models import REVIEW_NOTE_CHARS, ReviewVerdict
from audit.read import get_trace
from audit.write.reviews import (
    RunNotFinished,
    claim_run,
    may_review,
    next_in_queue,
    record_review,
    release_claim,
)
from diagnosis.models import DiagnosisRun
from diagnosis.review_queue import REASONS, queue_counts, queued_runs, reason, reasons_of
from diagnosis.selectors import run_configurations
from surfaces.admin import drafts
from surfaces.admin.compare import compare_traces
from surfaces.api.trace_render import trace_data

QUEUE_PAGE = 50
FROM_QUEUE = "queue"


def run_url(run: DiagnosisRun, *, from_queue: bool = False) -> str:
    url = reverse("admin:diagnosis_diagnosisrun_change", args=[run.pk])
    return url + ("?" + urlencode({"from": FROM_QUEUE}) if from_queue else "") + "#reviews"


def queue_url(reason_key: str = "") -> str:
    url = reverse("admin:diagnosis_diagnosisrun_queue")
    return url + ("?" + urlencode({"reason": reason_key}) if reason_key else "")


def review_form_context(request, run: DiagnosisRun) -> dict:
    """What the run page's review form needs (shown to holders of `audit.review_run` on finished runs)."""
    return {
        "can_review": may_review(request.user) and run.is_terminal,
        "review_draft": drafts.take(request, review_draft_key(run)),  # what a refused review held
        "review_url": reverse("admin:diagnosis_diagnosisrun_review", args=[run.pk]),
        "review_verdicts": ReviewVerdict.choices,
        "review_note_chars": REVIEW_NOTE_CHARS,
        "from_queue": request.GET.get("from") == FROM_QUEUE,
        "queue_url": queue_url(),
    }


def review_draft_key(run: DiagnosisRun) -> str:
    return f"review:{run.run_id}"


def _post_only(request):
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    return None


def review_view(model_admin, request, object_id):
    if (refused := _post_only(request)) is not None:
        return refused
    run = model_admin._viewable_run(request, object_id)
    try:
        record_review(
            run=run,
            user=request.user,
            verdict=request.POST.get("verdict", ""),
            note=request.POST.get("note", ""),
        )
    except (ValidationError, RunNotFinished) as exc:
        text = "; ".join(exc.messages) if isinstance(exc, ValidationError) else "the run has not finished"
        drafts.keep(
            request,
            review_draft_key(run),
            {"verdict": request.POST.get("verdict", ""), "note": request.POST.get("note", "")},
        )
        model_admin.message_user(request, f"Review not recorded: {text}.", messages.ERROR)
        return HttpResponseRedirect(run_url(run))
    model_admin.message_user(request, f"Review of {run.run_id} recorded.", messages.SUCCESS)
    if request.POST.get("from") == FROM_QUEUE:
        return _open_next(model_admin, request, reason_key=request.POST.get("reason", ""))
    return HttpResponseRedirect(run_url(run))


def _open_next(model_admin, request, *, reason_key: str = ""):
    chosen = reason(reason_key) if reason_key else None
    run = next_in_queue(user=request.user, reason_q=chosen.q if chosen else None)
    if run is None:
        model_admin.message_user(request, "The review queue is empty.", messages.INFO)
        return HttpResponseRedirect(queue_url(reason_key))
    return HttpResponseRedirect(run_url(run, from_queue=True))


def queue_view(model_admin, request):
    reason_key = request.GET.get("reason", "")
    if reason_key and reason(reason_key) is None:
        reason_key = ""
    total, counts = queue_counts()
    paginator = Paginator(queued_runs(reason_key=reason_key or None), QUEUE_PAGE)
    # The capped count of the chosen view bounds the pages (no full COUNT over the table).
    shown = total if not reason_key else next(c for c in counts if c.key == reason_key)
    paginator.count = shown.count
    page = paginator.get_page(request.GET.get("page"))
    now = timezone.now()
    me = request.user.get_username()
    rows = [
        {
            "run": run,
            "url": run_url(run, from_queue=True),
            "reasons": reasons_of(run),
            "claimed_by": run.review_claimed_by
            if run.review_claim_expires_at and run.review_claim_expires_at > now
            else "",
            "mine": run.review_claimed_by == me,
        }
        for run in page.object_list
    ]
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.opts,
        "title": "Review queue",
        "rows": rows,
        "page_obj": page,
        "total": total,
        "counts": counts,
        "reason_key": reason_key,
        "reasons": REASONS,
        "can_review": may_review(request.user),
        "claim_url": reverse("admin:diagnosis_diagnosisrun_queue_claim"),
        "next_url": reverse("admin:diagnosis_diagnosisrun_queue_next"),
        "queue_url": queue_url(),
        "media": model_admin.media,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/diagnosis/diagnosisrun/review_queue.html", context)


def claim_view(model_admin, request):
    if (refused := _post_only(request)) is not None:
        return refused
    if not may_review(request.user):
        raise PermissionDenied
    run = get_object_or_404(DiagnosisRun, run_id=request.POST.get("run_id", ""))
    reason_key = request.POST.get("reason", "")
    if request.POST.get("release"):
        release_claim(run_id=run.run_id, user=request.user)
        model_admin.message_user(request, f"Claim on {run.run_id} released.", messages.INFO)
    elif claim_run(run_id=run.run_id, user=request.user):
        model_admin.message_user(request, f"{run.run_id} is yours to review.", messages.SUCCESS)
    else:
        model_admin.message_user(request, f"{run.run_id} is claimed by someone else.", messages.WARNING)
    return HttpResponseRedirect(queue_url(reason_key))


def next_view(model_admin, request):
    if (refused := _post_only(request)) is not None:
        return refused
    if not may_review(request.user):
        raise PermissionDenied
    return _open_next(model_admin, request, reason_key=request.POST.get("reason", ""))


def compare_view(model_admin, request):
    ids = [request.GET.get("a", ""), request.GET.get("b", "")]
    runs = []
    for run_id in ids:
        run = model_admin.get_queryset(request).filter(run_id=run_id).first()
        if run is None or not model_admin.has_view_permission(request, run):
            model_admin.message_user(
                request, "Compare needs two run ids the list shows (?a=…&b=…).", messages.ERROR
            )
            return HttpResponseRedirect(reverse("admin:diagnosis_diagnosisrun_changelist"))
        runs.append(run)
    left, right = (trace_data(get_trace(run=run, viewer=request.user)) for run in runs)
    stored = run_configurations(fingerprints=[run.config_fingerprint for run in runs])
    texts = tuple(dict(getattr(stored.get(run.config_fingerprint), "prompts", None) or {}) for run in runs)
    comparison = compare_traces(left, right, prompts=texts)
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.opts,
        "title": f"Compare {ids[0]} and {ids[1]}",
        "comparison": comparison,
        "left_run": runs[0],
        "right_run": runs[1],
        "left_url": reverse("admin:diagnosis_diagnosisrun_change", args=[runs[0].pk]),
        "right_url": reverse("admin:diagnosis_diagnosisrun_change", args=[runs[1].pk]),
        "swap_url": compare_url(ids[1], ids[0]),
        "media": model_admin.media,
        "is_nav_sidebar_enabled": False,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/diagnosis/diagnosisrun/compare.html", context)


def compare_url(left_id: str, right_id: str) -> str:
    return reverse("admin:diagnosis_diagnosisrun_compare") + "?" + urlencode({"a": left_id, "b": right_id})
