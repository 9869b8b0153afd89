"""Writes of the identity layer: sessions, runs, the run's lease and feedback. Keyword-only arguments; no
audit records here (those go through `audit.write`, which also writes the run's terminal row).

The run's lease (`lease_owner`, `lease_expires_at`, `lease_epoch`) is written only here: a claim by the
executor (`claim_run`), its renewal (`renew_lease`), a sweeper's takeover (`claim_expired_run`) and a
cancel request (`request_run_cancel`). Every claim increments `lease_epoch`, the fencing token the
recorder's writes are conditional on; the recorder's `finish` releases the lease.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import secrets
import time
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import DatabaseError, connection, transaction
from django.db.models import Count, Exists, F, IntegerField, Max, OuterRef, Q, Subquery, Value
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from core import writeauth
from core.compiled import CompiledQuery
from core.db_router import read_alias
from core.failover import LOOK_UP_PAUSES, lost_or_conflicted, reconnect_if_lost
from diagnosis.models import (
    AgentFlow,
    ChatSession,
    DiagnosisRun,
    FeedbackRating,
    ReleaseMode,
    RunConfiguration,
    RunFeedback,
    RunPurpose,
    RunStatus,
)
from diagnosis.review_queue import refresh_needs_review

ACTIVE_RUN_STATUSES = (RunStatus.PENDING, RunStatus.RUNNING)

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


def create_session(
    *,
    owner: AbstractBaseUser,
    title: str = "",
    session_id: str | None = None,
    purpose: str = RunPurpose.PRODUCTION,
) -> ChatSession:
    return ChatSession.objects.create(
        session_id=session_id or new_id("ses"), owner=owner, title=title[:TITLE_CHARS], purpose=purpose
    )


def create_run(
    *,
    session: ChatSession,
    query: str,
    agent_flow: str = "DIAGNOSIS_AGENT",
    redaction: dict[str, Any] | None = None,
) -> DiagnosisRun:
    """A PENDING run of `query` in `session`; the session takes the first query as its title and counts
    the run in its stored `run_count` and `last_run_at` (one transaction; the session's row is written
    once, title and counts in one UPDATE; the run's row once, its creation tag in its INSERT). `query`
    is already redacted by the caller (`agent.redaction`); `redaction` is what that replaced (facts
    only, never originals). The run takes its session's `purpose` (an experiment's session holds only
    experiment replays). No savepoint of its own: inside a caller's transaction an error rolls that
    transaction back."""
    with transaction.atomic(savepoint=False):
        titled: dict[str, Any] = {}
        if not session.title:
            session.title = " ".join(query.split())[:TITLE_CHARS]
            session.updated_at = timezone.now()
            titled = {"title": session.title, "updated_at": session.updated_at}
        run = DiagnosisRun(
            run_id=new_id("run"),
            session=session,
            query=query,
            agent_flow=agent_flow,
            redaction=redaction,
            purpose=session.purpose,
            created_at=timezone.now(),
        )
        # Tagged before the INSERT, the row written once. The creation time is stored as it is here: UTC
        # to the microsecond (MariaDB DATETIME(6), SQLite's text; Django 5.2 drops microseconds on no
        # backend it supports), so the tag covers what is read back (tests/diagnosis/test_create_run.py).
        run.created_tag = writeauth.tag(writeauth.RUN_CREATED, identity_digest(run))
        run.save(force_insert=True)
        # The session's stored list facts (and its first title), in the run's transaction.
        ChatSession.objects.filter(pk=session.pk).update(
            run_count=F("run_count") + 1,
            last_run_at=Greatest(Coalesce("last_run_at", Value(run.created_at)), Value(run.created_at)),
            **titled,
        )
    return run


def identity_digest(run: DiagnosisRun) -> str:
    """The SHA-256 of what a run is, as created — its id, session, the user's question, the flow, its
    purpose and creation time (UTC, microseconds) — as the compact JSON array of those strings: the one
    home of what the creation tag covers."""
    created = run.created_at.astimezone(dt.UTC).isoformat(timespec="microseconds") if run.created_at else ""
    identity = [run.run_id, run.session_id, run.query, run.agent_flow, run.purpose, created]
    text = json.dumps(identity, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def created_by_the_service(run: DiagnosisRun) -> bool:
    """Whether the run row carries a creation tag that verifies over its identity as it is now: one the
    service created through `create_run`, unchanged since (`core.writeauth`)."""
    return writeauth.verifier().valid(writeauth.RUN_CREATED, identity_digest(run), run.created_tag)


def refresh_session_facts(*, session_ids) -> int:
    """Recount the stored `run_count` and `last_run_at` of the sessions `session_ids` from their runs
    (after runs were deleted: the retention purge); one UPDATE, each session through its runs' index."""
    runs = DiagnosisRun.objects.filter(session_id=OuterRef("session_id")).order_by().values("session_id")
    return ChatSession.objects.filter(session_id__in=list(session_ids)).update(
        run_count=Coalesce(
            Subquery(runs.annotate(n=Count("pk")).values("n")[:1], output_field=IntegerField()), 0
        ),
        last_run_at=Subquery(runs.annotate(m=Max("created_at")).values("m")[:1]),
    )


# ---------------------------------------------------------------------------------------------------
# The run's lease
# ---------------------------------------------------------------------------------------------------
def lease_seconds() -> float:
    """How long a claim or renewal holds a run (`settings.RUN_LEASE_SECONDS`, default 30)."""
    return float(settings.RUN_LEASE_SECONDS)


def release_mode() -> ReleaseMode:
    """The release policy runs start under (`settings.CHAT_RELEASE`; the check `diagnosis.E001` refuses
    any other value at start-up, so this never guesses)."""
    return ReleaseMode(str(settings.CHAT_RELEASE).strip().lower())


def _lease_until(now: dt.datetime) -> dt.datetime:
    return now + dt.timedelta(seconds=lease_seconds())


# The run row by id, compiled once (`core.compiled`): built per claim, the query cost more CPU than the
# database spent on it.
_RUN_BY_ID = CompiledQuery(
    lambda run_id: DiagnosisRun.objects.filter(run_id=run_id).order_by("pk")[:1], run_id=str
)


def run_by_id(run_id: str) -> DiagnosisRun | None:
    """The run `run_id` as `DiagnosisRun.objects.filter(run_id=…).first()` returns it (every column,
    from the database reads go to now), or None."""
    alias = read_alias()
    rows = _RUN_BY_ID.rows(alias, run_id=run_id)
    return DiagnosisRun.from_db(alias, _RUN_BY_ID.names(alias), rows[0]) if rows else None


def claim_run(*, run_id: str, owner: str) -> DiagnosisRun | None:
    """Take the lease of a PENDING run whose lease is free or expired, with the next epoch; the run as
    claimed, or None when it is not claimable (another claim won, or it is no longer PENDING). The
    update is conditional on the epoch read, so two claimants never share an epoch."""
    run = run_by_id(run_id)
    now = timezone.now()
    if run is None:
        return None
    until = _lease_until(now)
    claim = (
        DiagnosisRun.objects.filter(run_id=run_id, status=RunStatus.PENDING, lease_epoch=run.lease_epoch)
        .filter(Q(lease_owner="") | Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now))
        .update
    )
    fields = {"lease_owner": owner, "lease_expires_at": until, "lease_epoch": F("lease_epoch") + 1}
    try:
        claimed = claim(**fields)
    except DatabaseError as exc:
        if not lost_or_conflicted(exc) or connection.in_atomic_block:
            raise
        claimed = _claim_after_failover(run, owner=owner, claim=lambda: claim(**fields))
    if not claimed:
        return None
    run.lease_owner, run.lease_expires_at, run.lease_epoch = owner, until, run.lease_epoch + 1
    return run


def _claim_after_failover(run: DiagnosisRun, *, owner: str, claim) -> bool:
    """The claim's answer was lost with its connection (a failover) or Galera refused it: read the row
    again on a connection that answers (a causal read behind Galera) — our owner at the next epoch: it
    landed; still at the epoch read: it did not, claim once more; anything else: another claim won."""
    for pause in LOOK_UP_PAUSES:
        time.sleep(pause)
        reconnect_if_lost()
        try:
            owner_now, epoch_now = (
                DiagnosisRun.objects.filter(pk=run.pk).values_list("lease_owner", "lease_epoch").get()
            )
            if owner_now == owner and epoch_now == run.lease_epoch + 1:
                return True
            return epoch_now == run.lease_epoch and bool(claim())
        except DatabaseError as exc:
            if not lost_or_conflicted(exc):
                raise
    return False


QUEUED_FLOWS = (AgentFlow.AI_OPS,)


def queued_runs(*, flows: tuple[str, ...] = QUEUED_FLOWS):
    """PENDING runs of the queued flows that nobody has claimed yet, oldest first (the queue; served by
    the index on (agent_flow, status, created_at)). Chat runs are never queued: the process that
    created one executes it."""
    return DiagnosisRun.objects.filter(
        agent_flow__in=flows, status=RunStatus.PENDING, lease_owner="", cancel_requested=False
    ).order_by("created_at", "id")


def claim_next_queued(*, owner: str, flows: tuple[str, ...] = QUEUED_FLOWS) -> DiagnosisRun | None:
    """Claim the oldest queued run (see `queued_runs`) for `owner`, with the next lease epoch, or None
    when the queue is empty. On MariaDB/MySQL the candidate row is locked with `SELECT … FOR UPDATE
    SKIP LOCKED`, so concurrent workers take different runs without waiting for each other; on SQLite
    (no row locks) writers are serialised by the database and the claim's conditional update decides.
    Either way two workers never hold the same run: the claim is `claim_run`'s conditional update."""
    return _claim_oldest(lambda: queued_runs(flows=flows), owner=owner)


def _claim_oldest(candidates, *, owner: str) -> DiagnosisRun | None:
    """Claim the first run of `candidates()` (a queryset, oldest first) for `owner`: its row locked with
    SKIP LOCKED where the database has it, the claim `claim_run`'s conditional update; a claim lost to
    another claimant is tried again on the next candidate (five times at most)."""
    skip_locked = connection.features.has_select_for_update_skip_locked
    for _attempt in range(5):
        with transaction.atomic():
            run_ids = candidates().values_list("run_id", flat=True)
            if skip_locked:
                run_ids = run_ids.select_for_update(skip_locked=True)
            run_id = run_ids.first()
            if run_id is None:
                return None
            run = claim_run(run_id=run_id, owner=owner)
        if run is not None:
            return run
    return None


def handover_claim_by(*, agent_flow: str) -> dt.datetime:
    """Until when a handed-over run waits to be claimed (then the sweeper fails it): a queued flow's run
    goes back to the queue and waits as a queued run does (`AIOPS_QUEUE_TIMEOUT_SECONDS`); a chat run,
    adopted by any serving process within seconds, waits one lease period."""
    seconds = settings.AIOPS_QUEUE_TIMEOUT_SECONDS if agent_flow in QUEUED_FLOWS else lease_seconds()
    return timezone.now() + dt.timedelta(seconds=float(seconds))


def handed_over_runs():
    """Chat runs a draining process handed over (`agent.runtime.drain`): started, PENDING again with no
    owner and a claim-by time (the sweeper fails one nobody claims by then), oldest hand-over first. A
    queued flow's handed-over run is in the queue instead (`queued_runs`)."""
    return (
        DiagnosisRun.objects.filter(
            status=RunStatus.PENDING, lease_owner="", started_at__isnull=False, lease_expires_at__isnull=False
        )
        .exclude(agent_flow__in=QUEUED_FLOWS)
        .order_by("lease_expires_at", "id")
    )


def claim_handed_over(*, owner: str) -> DiagnosisRun | None:
    """Claim the oldest handed-over run for `owner` with the next lease epoch (`claim_run`'s conditional
    update: two processes never both hold it), or None when there is none."""
    return _claim_oldest(handed_over_runs, owner=owner)


def renew_lease(*, run_id: str, owner: str, epoch: int) -> str:
    """Extend the lease held as (`owner`, `epoch`): "ok", "cancel" (a cancel was requested; the lease is
    extended) or "lost" (another claim took the run, or it ended)."""
    until = _lease_until(timezone.now())
    mine = DiagnosisRun.objects.filter(run_id=run_id, lease_owner=owner, lease_epoch=epoch)
    if mine.filter(cancel_requested=False).update(lease_expires_at=until):
        return "ok"
    if mine.update(lease_expires_at=until):
        return "cancel"
    return "lost"


def claim_expired_run(*, run: DiagnosisRun, owner: str, now: dt.datetime | None = None) -> int | None:
    """A sweeper's takeover of `run` exactly as observed (status, owner, expiry and epoch: a run whose
    owner renewed meanwhile, or that another sweeper took, is left alone). Returns the new epoch, or None
    when the run changed since it was read."""
    now = now or timezone.now()
    taken = DiagnosisRun.objects.filter(
        pk=run.pk,
        status=run.status,
        lease_owner=run.lease_owner,
        lease_expires_at=run.lease_expires_at,
        lease_epoch=run.lease_epoch,
    ).update(lease_owner=owner, lease_expires_at=_lease_until(now), lease_epoch=F("lease_epoch") + 1)
    return run.lease_epoch + 1 if taken else None


def request_run_cancel(*, run_id: str) -> str:
    """Set `cancel_requested` on an active run (its owner's heartbeat reads it); returns the run's status
    as stored after the update ("" when there is no such run)."""
    DiagnosisRun.objects.filter(run_id=run_id, status__in=ACTIVE_RUN_STATUSES).update(cancel_requested=True)
    return DiagnosisRun.objects.filter(run_id=run_id).values_list("status", flat=True).first() or ""


FEEDBACK_COMMENT_CHARS = 2000


def submit_feedback(
    *, run: DiagnosisRun, user: AbstractBaseUser, rating: str, comment: str = ""
) -> RunFeedback:
    """Record `user`'s verdict on `run`: one feedback per user and run, a second submission replaces the
    first (rating, comment and `created_at` become the new verdict's). The run's `downvoted` and
    `needs_review` facts are rewritten in the same transaction (`diagnosis.review_queue`). Safe under
    concurrent submissions (the unique constraint decides; `update_or_create` retries as an update)."""
    if rating not in FeedbackRating.values:
        raise ValidationError({"rating": f"must be one of {', '.join(FeedbackRating.values)}"})
    if len(comment) > FEEDBACK_COMMENT_CHARS:
        raise ValidationError({"comment": f"at most {FEEDBACK_COMMENT_CHARS} characters"})
    with transaction.atomic():
        feedback, _ = RunFeedback.objects.update_or_create(
            run=run, user=user, defaults={"rating": rating, "comment": comment, "created_at": timezone.now()}
        )
        # The run's stored review facts: voted down by anyone, and the review queue's flag.
        down = RunFeedback.objects.filter(run_id=run.run_id, rating=FeedbackRating.DOWN)
        runs = DiagnosisRun.objects.filter(run_id=run.run_id)
        runs.update(downvoted=Exists(down))
        refresh_needs_review(runs=runs)
    return feedback


def remember_configuration(
    *, fingerprint: str, canonical: str, document: dict[str, Any], prompts: dict[str, str]
) -> None:
    """Keep a run configuration under its fingerprint once (`RunConfiguration`: append-only, content-
    addressed): one INSERT that leaves a row already there as it is (same key, same content), so a
    concurrent first write of the same configuration is no error either."""
    RunConfiguration.objects.bulk_create(
        [RunConfiguration(fingerprint=fingerprint, canonical=canonical, document=document, prompts=prompts)],
        ignore_conflicts=True,
    )
