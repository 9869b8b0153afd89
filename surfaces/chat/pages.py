"""The front door (`/`), the chat page (`/chat/`), a run-id link into the admin's run page, and the
read-only runbook view that citation links open (`/knowledge/<slug>/`).

The chat page is a plain template and one static script (no build step, no CDN) speaking the SSE chat
API with the session cookie and the CSRF token: progress, drafts when streamed, tools, the release and
the outcome's `contentHtml`, cancel, and reattaching after the last id when the connection drops.
Details: docs/chat.md, *The chat page*.
"""

from __future__ import annotations

from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.templatetags.static import static
from django.urls import reverse
from django.views.decorators.csrf import ensure_csrf_cookie
from django.views.decorators.http import require_GET

from agent.knowledge.selectors import get_runbook
from agent.runtime.approvals import may_approve
from diagnosis.models import DiagnosisRun
from diagnosis.selectors import get_visible_session
from diagnosis.services import QUERY_MAX_CHARS
from surfaces.answers import render_answer
from surfaces.chat.service import max_active_runs


@require_GET
def front_door(request: HttpRequest) -> HttpResponse:
    """`GET /`: the chat for a signed-in user, else the login page that leads back to it."""
    chat = reverse("chat")
    if request.user.is_authenticated:
        return redirect(chat)
    return redirect_to_login(chat)


@require_GET
@login_required
@ensure_csrf_cookie
def chat_page(request: HttpRequest) -> HttpResponse:
    """`GET /chat/[?session=<id>]`: ask a question and watch the run (login required).

    A conversation the user may see but does not own (staff reading someone else's) is shown read-only:
    its owner is named and there is no composer, since new runs go only into one's own sessions
    (`surfaces.chat.service.start_chat`). One that is not visible is left to the page, which says it
    could not be opened (the API's 404)."""
    session_id = request.GET.get("session")
    session = get_visible_session(user=request.user, session_id=session_id) if session_id else None
    read_only_owner = (
        session.owner.get_username() if session is not None and session.owner_id != request.user.pk else None
    )
    return render(
        request,
        "chat.html",
        {
            "read_only_owner": read_only_owner,
            "query_max_chars": QUERY_MAX_CHARS,
            "max_active_runs": max_active_runs(),
            "show_admin_links": request.user.is_staff,
            # The waiting approvals panel (surfaces/static/surfaces/approvals.js) for approvers.
            "can_approve": may_approve(request.user),
        },
    )


@require_GET
def favicon(request: HttpRequest) -> HttpResponse:
    """`GET /favicon.ico` (what browsers ask every page for): the product's icon, a static SVG."""
    return redirect(static("surfaces/favicon.svg"))


@require_GET
@staff_member_required
def run_admin_redirect(request: HttpRequest, run_id: str) -> HttpResponse:
    """`GET /chat/runs/<runId>/admin/`: redirect to the run's page in the admin (staff only)."""
    pk = DiagnosisRun.objects.filter(run_id=run_id).values_list("pk", flat=True).first()
    if pk is None:
        raise Http404("No such run.")
    return redirect(reverse("admin:diagnosis_diagnosisrun_change", args=[pk]))


@require_GET
@login_required
def knowledge_document(request: HttpRequest, slug: str) -> HttpResponse:
    """`GET /knowledge/<slug>/[?chunk=N]`: a runbook read-only, its chunks in order, each anchored
    `chunk-<n>`; chunk N (the one a citation `[kb:<slug>#N]` names) is highlighted on the server, so the
    link works without JavaScript.

    Any signed-in user may read it: the runbooks are the evidence every answer is checked against, and a
    chat user must be able to check a citation in one click. Anonymous: the login page. An unknown
    document, or a `chunk` that is not one of its ordinals: 404.
    """
    runbook = get_runbook(slug=slug)
    if runbook is None:
        raise Http404("No such runbook.")
    cited: int | None = None
    wanted = request.GET.get("chunk")
    if wanted is not None:
        ordinals = {chunk.ordinal for chunk in runbook.chunks}
        if not (wanted.isascii() and wanted.isdigit()) or int(wanted) not in ordinals:
            raise Http404("No such chunk.")
        cited = int(wanted)
    chunks = []
    previous_heading = None
    for chunk in runbook.chunks:
        chunks.append(
            {
                "ordinal": chunk.ordinal,
                "evidence_id": chunk.evidence_id,
                "heading": chunk.heading if chunk.heading != previous_heading else "",
                "html": render_answer(chunk.text),
                "cited": chunk.ordinal == cited,
            }
        )
        previous_heading = chunk.heading
    return render(
        request,
        "knowledge_document.html",
        {"document": runbook.document, "chunks": chunks, "cited": cited},
    )
