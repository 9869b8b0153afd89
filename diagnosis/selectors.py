"""Reads of the identity layer: which sessions and runs a user may see, run lists, a viewer's feedback.

Visibility (API contract, *Authentication*): a user sees the sessions they own; staff (and superusers)
see every session. A run is visible when its session is. Everything here returns `None` or an empty
queryset for what the user may not see, exactly as for what does not exist, so that callers answer both
with the same 404.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Count, Max, OuterRef, QuerySet, Subquery

from diagnosis.models import AiOpsAlert, ChatSession, DiagnosisRun, RunFeedback

MAX_ID_CHARS = 64


class RunResolution:
    """How a trace's run was chosen: named exactly by `runId`, or the session's latest run."""

    EXACT = "EXACT"
    LATEST = "LATEST"


@dataclass(frozen=True, slots=True)
class RunFilters:
    """Filters of the run list; None means "any"."""

    status: str | None = None
    release_decision: str | None = None
    intent: str | None = None
    created_after: dt.datetime | None = None
    created_before: dt.datetime | None = None


@dataclass(frozen=True, slots=True)
class FeedbackView:
    """One user's feedback on a run, as the trace shows it."""

    rating: str
    comment: str
    created_at: dt.datetime


def sees_all_sessions(user: AbstractBaseUser | AnonymousUser) -> bool:
    return bool(user.is_authenticated and user.is_active and (user.is_staff or user.is_superuser))


def visible_sessions(*, user: AbstractBaseUser | AnonymousUser) -> QuerySet[ChatSession]:
    if not user.is_authenticated or not user.is_active:
        return ChatSession.objects.none()
    if sees_all_sessions(user):
        return ChatSession.objects.all()
    return ChatSession.objects.filter(owner=user)


def session_list(*, user: AbstractBaseUser | AnonymousUser) -> QuerySet[ChatSession]:
    """Visible sessions, newest first, with `run_count` and `last_run_at` (one query per page)."""
    return (
        visible_sessions(user=user)
        .select_related("owner")
        .annotate(run_count=Count("runs"), last_run_at=Max("runs__created_at"))
        .order_by("-created_at", "-id")
    )


def _valid_id(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_ID_CHARS


def get_visible_session(*, user: AbstractBaseUser | AnonymousUser, session_id: str) -> ChatSession | None:
    if not _valid_id(session_id):
        return None
    return visible_sessions(user=user).filter(session_id=session_id).first()


def owned_session(*, user: AbstractBaseUser, session_id: str) -> ChatSession | None:
    """The session `session_id` if `user` owns it (new runs go only into one's own sessions, staff
    included); else None, as for one that does not exist."""
    if not _valid_id(session_id):
        return None
    return ChatSession.objects.filter(session_id=session_id, owner=user).first()


def run_list(*, session: ChatSession, filters: RunFilters | None = None) -> QuerySet[DiagnosisRun]:
    """The session's runs, newest first, filtered."""
    filters = filters or RunFilters()
    qs = DiagnosisRun.objects.filter(session_id=session.session_id)
    if filters.status:
        qs = qs.filter(status=filters.status)
    if filters.release_decision:
        qs = qs.filter(release_decision=filters.release_decision)
    if filters.intent:
        qs = qs.filter(intent=filters.intent)
    if filters.created_after:
        qs = qs.filter(created_at__gte=filters.created_after)
    if filters.created_before:
        qs = qs.filter(created_at__lt=filters.created_before)
    return qs.order_by("-created_at", "-id")


def get_visible_run(
    *,
    user: AbstractBaseUser | AnonymousUser,
    session_id: str | None = None,
    run_id: str | None = None,
    with_feedback: bool = False,
) -> DiagnosisRun | None:
    """The run the user asks for if they may see it; else None, as for a run that does not exist.

    The one visibility rule of every transport (REST, SSE, WebSocket): the run `run_id` of session
    `session_id`; the session's latest run when `run_id` is None; the run `run_id` in any session when
    `session_id` is None (the WebSocket names runs alone). Ids that are not strings of 1..`MAX_ID_CHARS`
    characters find nothing. One query; with `with_feedback` the viewer's own feedback is annotated onto
    the run (read it with `viewer_feedback`)."""
    if session_id is None and run_id is None:
        return None
    if (session_id is not None and not _valid_id(session_id)) or (
        run_id is not None and not _valid_id(run_id)
    ):
        return None
    if not user.is_authenticated or not user.is_active:
        return None
    qs = (
        DiagnosisRun.objects.all()
        if session_id is None
        else DiagnosisRun.objects.filter(session_id=session_id)
    )
    if not sees_all_sessions(user):
        qs = qs.filter(session__owner=user)
    if with_feedback:
        mine = RunFeedback.objects.filter(run_id=OuterRef("run_id"), user_id=user.pk)
        qs = qs.annotate(
            viewer_feedback_rating=Subquery(mine.values("rating")[:1]),
            viewer_feedback_comment=Subquery(mine.values("comment")[:1]),
            viewer_feedback_created_at=Subquery(mine.values("created_at")[:1]),
        )
    if run_id is not None:
        return qs.filter(run_id=run_id).first()
    return qs.order_by("-created_at", "-id").first()


def viewer_feedback(run: DiagnosisRun) -> FeedbackView | None:
    """The feedback annotated by `get_visible_run(with_feedback=True)`, or None."""
    rating = getattr(run, "viewer_feedback_rating", None)
    if rating is None:
        return None
    return FeedbackView(
        rating=rating,
        comment=run.viewer_feedback_comment or "",
        created_at=run.viewer_feedback_created_at,
    )


def get_feedback(*, run_id: str, user: AbstractBaseUser) -> FeedbackView | None:
    """One user's feedback on a run (one query), for callers that did not annotate it."""
    row = RunFeedback.objects.filter(run_id=run_id, user_id=user.pk).values_list(
        "rating", "comment", "created_at"
    )
    found = row.first()
    return FeedbackView(rating=found[0], comment=found[1], created_at=found[2]) if found else None


def aiops_analyses(
    *,
    alertname: str | None = None,
    severity: str | None = None,
    status: str | None = None,
    release_decision: str | None = None,
) -> QuerySet[AiOpsAlert]:
    """AI Ops analyses as their alert rows with the run, newest first (one query per page; the alert's
    own indexes serve the order and the `alertname`/`severity` filters). Staff only: callers check."""
    rows = AiOpsAlert.objects.select_related("run")
    if alertname:
        rows = rows.filter(alertname=alertname)
    if severity:
        rows = rows.filter(severity=severity)
    if status:
        rows = rows.filter(run__status=status)
    if release_decision:
        rows = rows.filter(run__release_decision=release_decision)
    return rows.order_by("-created_at", "-id")
