"""Runs in the admin: a dense list over the runs' stored facts, the one-page run view, the reasoning panel,
the trace download and export; and users' feedback on runs.

The run list stays flat at a million runs (`core.admin_lists`): stored `diagnosis_run` columns only,
indexed orders, filters and searches, capped counts. The run page draws the trace read model
(`audit.read.get_trace`, shaped by `surfaces.admin.run_page`); the downloads are the API's trace body.
Runs are read-only here. Reasoning is loaded on request by a separate view that checks
`reasoning.view_reasoning_content` and logs the read, exactly like the API.
Details: docs/admin.md, *The run list* and *The run page*; docs/contributing.md, *A new admin page*.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse, HttpResponseRedirect, StreamingHttpResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.text import Truncator
from rest_framework.renderers import JSONRenderer

from access.reasoning_reads import read_reasoning
from access.stepup import BROWSER_OTP_MESSAGE, otp_satisfied
from agent.runtime import approval_queue, approvals
from audit.read import get_trace
from audit.transparency.evidence import build_bundle
from core.admin_lists import ScalableListAdmin
from core.db_router import primary_reads, render_from_replica
from diagnosis.models import DiagnosisRun, RunFeedback, RunStatus
from diagnosis.selectors import all_feedback, search_runs
from reasoning.models import REASONING_PERMISSION, AccessChannel
from surfaces.admin import configs, datasets, drafts, evaluation_views, oversight
from surfaces.admin.analyse import analyse_view
from surfaces.admin.dashboard import dashboard_view
from surfaces.admin.display import (
    QUERY_PREVIEW_CHARS,
    column,
    delivery_note,
    format_ms,
    label,
    provider_chip,
)
from surfaces.admin.display import chip as _chip
from surfaces.admin.evaluation_views import EvaluationColumn
from surfaces.admin.filters import (
    AuditCompleteFilter,
    CostFilter,
    ProviderFilter,
    ReconciledFilter,
    UnverifiedDeliveredFilter,
)
from surfaces.admin.gaps import gaps_view
from surfaces.admin.keys import keys_view
from surfaces.admin.ledger import run_cost_label
from surfaces.admin.mcp import mcp_view
from surfaces.admin.run_page import build_run_page
from surfaces.api.audit_serializers import serialize_trace
from surfaces.api.trace_export import jsonl_lines
from telemetry.selectors import export_of_run, exporter_enabled

# The run page's query that loads the reasoning panel on arrival (after the TOTP step-up).
RELOAD_REASONING = "load=reasoning"
CONSOLE_MEDIA = forms.Media(css={"all": ("surfaces/admin/console.css",)})


def run_trace(run: DiagnosisRun, *, viewer) -> dict[str, Any]:
    """Exactly the API's trace body for this run as `viewer` would get it (`runResolution` EXACT; the
    feedback shown is the viewer's own, as in the API)."""
    return serialize_trace(get_trace(run=run, viewer=viewer))


@admin.register(DiagnosisRun)
class DiagnosisRunAdmin(EvaluationColumn, ScalableListAdmin, admin.ModelAdmin):
    """Runs: a dense list over stored facts (see the module docstring), and a read-only one-page run view.

    Nobody adds, changes or deletes a run here. `change_view` is replaced by the run page; `reasoning/`
    (POST, CSRF-protected) returns the reasoning panel to holders of `reasoning.view_reasoning_content` and
    logs the read; `trace.json` downloads one trace, `evidence.json` its evidence bundle; the
    `export_traces` action downloads several traces.
    """

    list_display = (
        "run_and_session",
        "query_preview",
        "status_chip",
        "intent_label",
        "provider_label",
        "release_chip",
        "tokens",
        "reconciled",
        "audit_complete_flag",
        "duration",
        "cost_cell",
        "evaluation_score",
        "config",
        "created",
    )
    # The first cell links the run page and, below it, the session page (two links, so no automatic one).
    list_display_links = None
    list_filter = (
        ("created_at", admin.DateFieldListFilter),
        "status",
        "release_decision",
        "intent",
        ProviderFilter,
        ("tokens_reconciled", ReconciledFilter),
        CostFilter,
        AuditCompleteFilter,
        UnverifiedDeliveredFilter,
        configs.ConfigurationFilter,
        datasets.ReviewVerdictFilter,
    )
    # The sessions of the page's runs by a second query on their unique key, for the links to their
    # pages (a join made MariaDB scan chat_session first).
    list_select_related = False
    list_prefetch_related = ("session",)
    search_fields = ("run_id",)  # enables the search box; `get_search_results` decides what it matches
    search_help_text = (
        "A run id or session id (or its beginning), or words of the question. Words found in more than "
        "1,000 runs, and Chinese text, are searched in the newest 20,000 runs."
    )
    ordering = ("-created_at", "-id")
    list_per_page = 100
    actions = ["export_traces", "compare_runs", datasets.add_to_dataset]

    @property
    def media(self):
        return super().media + CONSOLE_MEDIA

    def get_queryset(self, request):
        # The run page links the session too: its row by the unique key, in the same query (eq_ref).
        return evaluation_views.annotate(super().get_queryset(request).select_related("session"))

    def get_search_results(self, request, queryset, search_term):
        return search_runs(queryset=queryset, term=search_term), False

    def changelist_view(self, request, extra_context=None):
        # The run list and run page are wide tables and a time axis: they use the full width (the
        # breadcrumbs lead back); every other admin page keeps the navigation sidebar.
        return super().changelist_view(request, {"is_nav_sidebar_enabled": False, **(extra_context or {})})

    # -- list columns ---------------------------------------------------------------------------
    @admin.display(
        description=column("run · session", "the run's id (its page) and, below it, its session's id"),
        ordering="run_id",
    )
    def run_and_session(self, run: DiagnosisRun):
        return format_html(
            '<a class="dc-mono dc-run-link" href="{}">{}</a><br>'
            '<a class="dc-mono dc-quiet" href="{}" title="session">{}</a>',
            reverse("admin:diagnosis_diagnosisrun_change", args=[run.pk]),
            run.run_id,
            reverse("admin:diagnosis_chatsession_change", args=[run.session.pk]),
            run.session_id,
        )

    @admin.display(description=column("intent", "what the router decided the question is"))
    def intent_label(self, run: DiagnosisRun):
        if not run.intent:
            return "—"
        return format_html('<span title="{}">{}</span>', run.intent, label(run.intent))

    @admin.display(description=column("provider", "who answered (DEMO: the offline demo model)"))
    def provider_label(self, run: DiagnosisRun):
        return provider_chip(run.provider)

    @admin.display(
        description=column("tokens", "tokens of every model call of the run: router, agent and guards"),
        ordering="tokens_total",
    )
    def tokens(self, run: DiagnosisRun) -> int:
        return run.tokens_total

    @admin.display(
        description=column("cost", "the run's model cost at the prices in force (grey: not priced)"),
        ordering="cost",
    )
    def cost_cell(self, run: DiagnosisRun):
        text, priced, note = run_cost_label(run)
        return format_html(
            '<span class="dc-cost{}" title="{}">{}</span>', "" if priced else " dc-quiet", note, text
        )

    @admin.display(description=column("config", "the configuration fingerprint: models, prompts, tools"))
    def config(self, run: DiagnosisRun):
        return configs.config_cell(run)

    @admin.display(
        description=column("created", "when the run was created (month-day time, server time zone)"),
        ordering="created_at",
    )
    def created(self, run: DiagnosisRun):
        at = timezone.localtime(run.created_at)
        return format_html('<span title="{}">{}</span>', at.isoformat(), at.strftime("%m-%d %H:%M:%S"))

    @admin.display(description=column("query", "the question as stored (secrets redacted)"))
    def query_preview(self, run: DiagnosisRun) -> str:
        return Truncator(" ".join(run.query.split())).chars(QUERY_PREVIEW_CHARS)

    @admin.display(description=column("status", "where the run is: pending, running, succeeded, failed …"))
    def status_chip(self, run: DiagnosisRun):
        return _chip(run.status)

    @admin.display(description=column("release", "the release decision: published, or blocked by the guards"))
    def release_chip(self, run: DiagnosisRun):
        chip = _chip(run.release_decision)
        if not run.draft_chars:
            return chip
        note = delivery_note(run)
        tone = note[0] if note else "warn"
        return format_html(
            '{} <span class="dc-chip dc-{}" title="{}">draft shown</span>',
            chip,
            tone,
            note[1] if note else "",
        )

    @admin.display(
        description=column("reconciled", "the stored model calls agree with the ledger and the provider"),
        boolean=True,
    )
    def reconciled(self, run: DiagnosisRun) -> bool:
        return run.tokens_reconciled

    @admin.display(
        description=column("audit complete", "every audit row the run should have written is stored"),
        boolean=True,
    )
    def audit_complete_flag(self, run: DiagnosisRun) -> bool:
        return run.audit_complete

    @admin.display(
        description=column("duration", "from the run's start to its end, as measured"),
        ordering="total_duration_ms",
    )
    def duration(self, run: DiagnosisRun) -> str:
        return format_ms(run.total_duration_ms)

    # -- permissions: read-only for everyone ----------------------------------------------------
    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    # -- the run page -----------------------------------------------------------------------------
    def get_urls(self):
        info = self.opts.app_label, self.opts.model_name
        wrap = self.admin_site.admin_view
        return [
            # The review queue and the comparison of two runs (surfaces.admin.oversight).
            path("queue/", wrap(self.queue_view), name="{}_{}_queue".format(*info)),
            path("queue/claim/", wrap(self.queue_claim_view), name="{}_{}_queue_claim".format(*info)),
            path("queue/next/", wrap(self.queue_next_view), name="{}_{}_queue_next".format(*info)),
            path("compare/", wrap(self.compare_view), name="{}_{}_compare".format(*info)),
            path("<path:object_id>/review/", wrap(self.review_view), name="{}_{}_review".format(*info)),
            path("approvals/", wrap(self.approvals_view), name="{}_{}_approvals".format(*info)),
            path(
                "<path:object_id>/approvals/<str:tool_call_id>/",
                wrap(self.decide_view),  # POST only, CSRF-protected by admin_view
                name="{}_{}_decide".format(*info),
            ),
            path(
                "dashboard/",
                wrap(self.dashboard),
                name="{}_{}_dashboard".format(*info),
            ),
            path("keys/", wrap(self.keys_view), name="{}_{}_keys".format(*info)),
            path("mcp/", wrap(self.mcp_view), name="{}_{}_mcp".format(*info)),
            path("datasets/add/", wrap(self.add_to_dataset_view), name="{}_{}_add_to_dataset".format(*info)),
            path(
                "configurations/<str:fingerprint>/",
                wrap(self.configuration_view),
                name="{}_{}_configuration".format(*info),
            ),
            path("analyse/", wrap(self.analyse_view), name="{}_{}_analyse".format(*info)),
            path("gaps/", wrap(self.gaps_view), name="{}_{}_gaps".format(*info)),
            path(
                "<path:object_id>/reasoning/",
                wrap(self.reasoning_view),  # admin_view adds login, staff, never_cache and csrf_protect
                name="{}_{}_reasoning".format(*info),
            ),
            path(
                "<path:object_id>/trace.json",
                wrap(self.trace_json_view),
                name="{}_{}_trace_json".format(*info),
            ),
            path(
                "<path:object_id>/evidence.json",
                wrap(self.evidence_view),
                name="{}_{}_evidence".format(*info),
            ),
            *super().get_urls(),
        ]

    def approvals_view(self, request):
        """The tool calls waiting for a decision (for users with `diagnosis.approve_tool_call`)."""
        if not approvals.may_approve(request.user):
            raise PermissionDenied
        info = self.opts.app_label, self.opts.model_name
        waiting = [
            (item, reverse("admin:{}_{}_change".format(*info), args=[pk]))
            for item, pk in _with_pks(approval_queue.waiting_approvals(user=request.user))
        ]
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Tool calls waiting for approval",
            "waiting": waiting,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/diagnosis/diagnosisrun/approvals.html", context)

    def decide_view(self, request, object_id, tool_call_id):
        """Approve or reject a waiting call from the run page (the same service as the API)."""
        if request.method != "POST":
            raise PermissionDenied
        run = self._viewable_run(request, object_id)
        decision = approvals.DECISIONS.get(request.POST.get("decision", ""))
        if decision is None:
            raise PermissionDenied
        try:
            decided = approvals.decide(
                run=run,
                tool_call_id=tool_call_id,
                decision=decision,
                user=request.user,
                note=request.POST.get("note", "")[: approvals.NOTE_CHARS],
                arguments_digest_seen=request.POST.get("argumentsDigest") or None,
            )
        except approvals.ApprovalError as exc:
            if exc.decided is not None:  # refused as expired, and the expiry recorded
                approvals.publish_decision(exc.decided)
            messages.error(request, f"Not decided ({exc.code}): {exc}")
            # The note typed is offered again on the run page (unless the call is no longer waiting).
            drafts.keep(
                request,
                f"approval:{run.run_id}",
                {"call": tool_call_id, "note": request.POST.get("note", "")},
            )
        else:
            approvals.publish_decision(decided)
            messages.success(
                request, f"{decided.decision}: {tool_call_id} (recorded at sequence {decided.sequence_no})."
            )
        info = self.opts.app_label, self.opts.model_name
        return HttpResponseRedirect(reverse("admin:{}_{}_change".format(*info), args=[run.pk]))

    def dashboard(self, request):
        """The oversight dashboard (`surfaces.admin.dashboard`): staff who may view runs."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        return dashboard_view(self, request)

    def add_to_dataset_view(self, request):
        if not self.has_view_permission(request):
            raise PermissionDenied
        return datasets.add_to_dataset_view(self, request)

    def configuration_view(self, request, fingerprint):
        if not self.has_view_permission(request):
            raise PermissionDenied
        return configs.configuration_view(self, request, fingerprint)

    def keys_view(self, request):
        """The transparency log's public keys (`surfaces.admin.keys`): staff who may view runs."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        return keys_view(self, request)

    def mcp_view(self, request):
        """The MCP servers and their tools (`surfaces.admin.mcp`): staff who may view runs."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        return mcp_view(self, request)

    def analyse_view(self, request):
        """ "Analyse an alert" (`surfaces.admin.analyse`): staff who may view runs start an AI Ops run."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        return analyse_view(self, request)

    def gaps_view(self, request):
        """The questions the runbooks do not answer (`surfaces.admin.gaps`): staff who may view runs."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        return gaps_view(self, request)

    def _viewable_run(self, request, object_id) -> DiagnosisRun:
        run = self.get_object(request, unquote(object_id))
        if run is None:
            raise Http404("No such run.")
        if not self.has_view_permission(request, run):
            raise PermissionDenied
        return run

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """The run page (GET only: runs are never edited here), read from the replica when one is usable
        (`core.db_router`); what decides or claims (approvals waiting, the review form) reads the primary."""
        if request.method not in ("GET", "HEAD"):
            raise PermissionDenied
        return render_from_replica(lambda: self._run_page(request, object_id, extra_context))

    def _run_page(self, request, object_id, extra_context):
        run = self.get_object(request, unquote(object_id))
        if run is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        if not self.has_view_permission(request, run):
            raise PermissionDenied
        page = build_run_page(get_trace(run=run, viewer=request.user))
        info = self.opts.app_label, self.opts.model_name
        with primary_reads():
            waiting = [
                (w, reverse("admin:{}_{}_decide".format(*info), args=[run.pk, w.tool_call_id]))
                for w in (
                    approval_queue.waiting_in_run(run_id=run.run_id)
                    if run.status == RunStatus.INTERRUPTED
                    else []
                )
            ]
            review_context = oversight.review_form_context(request, run)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "title": f"Run {run.run_id}",
            "subtitle": None,
            "original": run,
            "run": run,
            "page": page,
            "media": self.media,
            "is_nav_sidebar_enabled": False,
            "has_view_permission": True,
            "can_read_reasoning": request.user.has_perm(REASONING_PERMISSION),
            "reasoning_url": reverse("admin:{}_{}_reasoning".format(*info), args=[run.pk]),
            "trace_json_url": reverse("admin:{}_{}_trace_json".format(*info), args=[run.pk]),
            "evidence_url": reverse("admin:{}_{}_evidence".format(*info), args=[run.pk]),
            # One query more, only where traces are exported (docs/observability.md).
            "trace_export": export_of_run(run_id=run.run_id) if exporter_enabled() else None,
            "otel_enabled": exporter_enabled(),
            "session_url": reverse("admin:diagnosis_chatsession_change", args=[run.session.pk]),
            "waiting_approvals": waiting,
            "can_approve": approvals.may_approve(request.user),
            "approval_draft": drafts.take(request, f"approval:{run.run_id}"),
            "all_feedback": all_feedback(run_id=run.run_id),
            "events_url": reverse("admin:audit_traceevent_changelist") + "?" + urlencode({"q": run.run_id}),
            **review_context,
            **evaluation_views.run_page_context(run),
            **(extra_context or {}),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/diagnosis/diagnosisrun/run_page.html", context)

    # -- reviews, the review queue, compare (surfaces.admin.oversight) ------------------------------
    def review_view(self, request, object_id):
        return oversight.review_view(self, request, object_id)

    def queue_view(self, request):
        return oversight.queue_view(self, request)

    def queue_claim_view(self, request):
        return oversight.claim_view(self, request)

    def queue_next_view(self, request):
        return oversight.next_view(self, request)

    def compare_view(self, request):
        return oversight.compare_view(self, request)

    @admin.action(description="Compare the two selected runs side by side", permissions=["view"])
    def compare_runs(self, request, queryset):
        ids = list(queryset.order_by("created_at", "id").values_list("run_id", flat=True)[:3])
        if len(ids) != 2:
            self.message_user(request, "Select exactly two runs to compare.", messages.ERROR)
            return None
        return HttpResponseRedirect(oversight.compare_url(ids[0], ids[1]))

    def reasoning_view(self, request, object_id):
        """The reasoning panel: 403 without `reasoning.view_reasoning_content`; one access-log row
        (channel ADMIN) per successful read, written before the content is returned."""
        if not request.user.has_perm(REASONING_PERMISSION):
            raise PermissionDenied
        if request.method != "POST":
            return HttpResponse(status=405, headers={"Allow": "POST"})
        run = self._viewable_run(request, object_id)
        partial = request.headers.get("X-Requested-With") == "fetch"
        run_url = reverse("admin:diagnosis_diagnosisrun_change", args=[run.pk])
        if not otp_satisfied(request):
            # REASONING_REQUIRE_OTP: this session has not passed a TOTP check (access.stepup).
            context = {
                **self.admin_site.each_context(request),
                "run": run,
                "run_url": run_url,
                # Back to the run page's panel, which loads the reasoning by itself (reasoning.js).
                "verify_url": reverse("verify-otp")
                + "?"
                + urlencode({"next": f"{run_url}?{RELOAD_REASONING}#reasoning"}),
                "message": BROWSER_OTP_MESSAGE,
            }
            template = "admin/access/otp_required_panel.html" if partial else "admin/access/otp_required.html"
            return TemplateResponse(request, template, context, status=403, headers={"X-Step-Up": "otp"})
        # Logged before the content leaves the process: if that write fails, nothing is returned.
        records = read_reasoning(user=request.user, run=run, request=request, channel=AccessChannel.ADMIN)
        template = (
            "admin/diagnosis/diagnosisrun/reasoning_panel.html"
            if partial
            else "admin/diagnosis/diagnosisrun/reasoning_page.html"
        )
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Reasoning of run {run.run_id}",
            "run": run,
            "records": records,
            "run_url": run_url,
        }
        request.current_app = self.admin_site.name
        response = TemplateResponse(request, template, context)
        response["Cache-Control"] = "no-store"
        return response

    def trace_json_view(self, request, object_id):
        run = self._viewable_run(request, object_id)
        return _traces_download([run_trace(run, viewer=request.user)], f"trace-{run.run_id}.json")

    def evidence_view(self, request, object_id):
        """The run's evidence bundle, exactly the API's (`audit.transparency.evidence`); verify it with
        `python -m audit.verify_bundle FILE --public-key KEY`."""
        run = self._viewable_run(request, object_id)
        return _download(build_bundle(run=run), f"evidence-{run.run_id}.json")

    @admin.action(
        description="Export selected runs' traces as JSON Lines (API trace shape, no reasoning; "
        "“select all” exports the whole filtered list)",
        permissions=["view"],
    )
    def export_traces(self, request, queryset):
        """Streamed, one trace per line, read `surfaces.api.trace_export`'s chunk at a time: any number of
        runs (the filtered list with Django's "select all"), in memory bounded by one chunk. Each line is the
        API's trace body for this user (with their own feedback)."""
        stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
        response = StreamingHttpResponse(
            jsonl_lines(queryset.select_related(None), viewer=request.user),
            content_type="application/x-ndjson",
        )
        response["Content-Disposition"] = f'attachment; filename="traces-{stamp}.jsonl"'
        response["Cache-Control"] = "no-store"
        return response


def _traces_download(traces: list[dict[str, Any]], filename: str) -> HttpResponse:
    """`{"traces": [...]}`, each element exactly the API's trace response, rendered by DRF's renderer."""
    return _download({"traces": traces}, filename)


def _download(data: dict[str, Any], filename: str) -> HttpResponse:
    body = JSONRenderer().render(data)
    response = HttpResponse(body, content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    response["Cache-Control"] = "no-store"
    return response


@admin.register(RunFeedback)
class RunFeedbackAdmin(ScalableListAdmin, admin.ModelAdmin):
    """Users' verdicts on runs, read-only fields; written through the API (`services.submit_feedback`).
    Newest first by primary key; the rating filter and the run id search are indexed."""

    list_display = ("run_id", "user", "rating", "comment", "created_at")
    list_filter = ("rating",)
    list_select_related = False
    list_prefetch_related = ("user",)
    search_fields = ("=run__run_id",)
    ordering = ("-id",)
    sortable_by = ("run_id",)
    readonly_fields = ("run", "user", "rating", "comment", "created_at", "updated_at")

    def has_add_permission(self, request) -> bool:
        return False


def _with_pks(waiting):
    """Each waiting call with its run's primary key (one query for the page)."""
    pks = dict(
        DiagnosisRun.objects.filter(run_id__in={w.run_id for w in waiting}).values_list("run_id", "pk")
    )
    return [(w, pks[w.run_id]) for w in waiting if w.run_id in pks]
