"""Writes of the identity layer: sessions, runs and feedback. Keyword-only arguments; no audit records
here (those go through `audit.recorder`)."""

from __future__ import annotations

import secrets
import time

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.utils import timezone

from diagnosis.models import ChatSession, DiagnosisRun, FeedbackRating, RunFeedback

TITLE_CHARS = 200
QUERY_MAX_CHARS = 8000


class InvalidQuery(ValueError):
    """A query a run cannot be created for; the message is safe to show (it names no content)."""


def validate_query(query: object) -> str:
    """`query` if it is a non-blank string of at most `QUERY_MAX_CHARS` characters, else `InvalidQuery`."""
    if not isinstance(query, str) or not query.strip():
        raise InvalidQuery("query must be a non-empty string.")
    if len(query) > QUERY_MAX_CHARS:
        raise InvalidQuery(f"query must be at most {QUERY_MAX_CHARS} characters.")
    return query


def new_id(prefix: str) -> str:
    """An opaque, roughly time-ordered id: prefix, 12 hex digits of milliseconds, 16 random hex digits."""
    return f"{prefix}_{int(time.time() * 1000):012x}{secrets.token_hex(8)}"


def create_session(*, owner: AbstractBaseUser, title: str = "", session_id: str | None = None) -> ChatSession:
    return ChatSession.objects.create(
        session_id=session_id or new_id("ses"), owner=owner, title=title[:TITLE_CHARS]
    )


def create_run(*, session: ChatSession, query: str, agent_flow: str = "DIAGNOSIS_AGENT") -> DiagnosisRun:
    """A PENDING run of `query` in `session`; the session takes the first query as its title."""
    if not session.title:
        session.title = " ".join(query.split())[:TITLE_CHARS]
        session.save(update_fields=["title", "updated_at"])
    return DiagnosisRun.objects.create(
        run_id=new_id("run"), session=session, query=query, agent_flow=agent_flow
    )


FEEDBACK_COMMENT_CHARS = 2000


def submit_feedback(
    *, run: DiagnosisRun, user: AbstractBaseUser, rating: str, comment: str = ""
) -> RunFeedback:
    """Record `user`'s verdict on `run`: one feedback per user and run, a second submission replaces the
    first (rating, comment and `created_at` become the new verdict's). Safe under concurrent submissions
    (the unique constraint decides; `update_or_create` retries as an update)."""
    if rating not in FeedbackRating.values:
        raise ValidationError({"rating": f"must be one of {', '.join(FeedbackRating.values)}"})
    if len(comment) > FEEDBACK_COMMENT_CHARS:
        raise ValidationError({"comment": f"at most {FEEDBACK_COMMENT_CHARS} characters"})
    feedback, _ = RunFeedback.objects.update_or_create(
        run=run, user=user, defaults={"rating": rating, "comment": comment, "created_at": timezone.now()}
    )
    return feedback
