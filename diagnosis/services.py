"""Writes of the identity layer: sessions and runs. Keyword-only arguments; no audit records here
(those go through `audit.recorder`)."""

from __future__ import annotations

import secrets
import time

from django.contrib.auth.models import AbstractBaseUser

from diagnosis.models import ChatSession, DiagnosisRun

TITLE_CHARS = 200


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
