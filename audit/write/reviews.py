"""Human reviews of finished runs: the write (`record_review`) and the queue's claims (`claim_run`,
`next_in_queue`); the trace reads them (`audit.read.get_trace`, `Trace.reviews`).

A review is recorded twice in one transaction, fail-closed: a `REVIEW_RECORDED` event appended to the run's
chain (verdict, reviewer, the note's length and sha256, never the note; `reviewDigest`) and an
append-only `audit.RunReview` row, so an edited, deleted or inserted review is named by `verify_audit`.
It is fenced through `audit.write.tail.append_to_finished_run`; only terminal runs are reviewed
(`RunNotFinished`). Details: docs/admin.md, *Reviews*.
"""

from __future__ import annotations

import datetime as dt
import logging

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from audit.models import (
    REVIEW_NOTE_CHARS,
    REVIEW_PERMISSION,
    EventType,
    Phase,
    ReviewVerdict,
    RunReview,
)
from audit.payloads import sha256_hex
from audit.verify.authority import governance_position, permitted
from audit.write import ChainEvent, Tail, append_to_finished_run, row_insert
from audit.write import RunNotFinished as RunNotFinished  # raised by record_review
from diagnosis.models import DiagnosisRun
from diagnosis.review_queue import refresh_needs_review
from diagnosis.services import new_id

logger = logging.getLogger("audit.write.reviews")
APPEND_ATTEMPTS = 5


def may_review(user: AbstractBaseUser) -> bool:
    """`audit.review_run` by the database and by the governance chain (`audit.verify.authority.permitted`)."""
    return permitted(user, REVIEW_PERMISSION)


def record_review(*, run: DiagnosisRun, user: AbstractBaseUser, verdict: str, note: str = "") -> RunReview:
    """Record `user`'s verdict on the finished `run` (see the module docstring) and return the review.

    PermissionDenied without `audit.review_run`; ValidationError for an unknown verdict or a note
    longer than 2000 characters; RunNotFinished for a run that is not terminal (PENDING, RUNNING,
    INTERRUPTED)."""
    if not may_review(user):
        raise PermissionDenied(f"Reviews need the permission {REVIEW_PERMISSION}.")
    if verdict not in ReviewVerdict.values:
        raise ValidationError({"verdict": [f"One of {', '.join(ReviewVerdict.values)}."]})
    note = note or ""
    if len(note) > REVIEW_NOTE_CHARS:
        raise ValidationError({"note": [f"At most {REVIEW_NOTE_CHARS} characters."]})
    reviewer = user.get_username()
    review = None

    def compose(tail: Tail):
        nonlocal review
        review = RunReview(
            review_id=new_id("rev"),
            run_id=tail.run_id,
            session_id=tail.session_id,
            verdict=verdict,
            note=note,
            reviewer=user,
            reviewer_username=reviewer,
            sequence_no=tail.next_sequence,
            created_at=timezone.now(),
        )
        row = row_insert(review)
        event = ChainEvent(
            Phase.RUN,
            EventType.REVIEW_RECORDED,
            verdict.upper(),
            f"reviewed by {reviewer}: {verdict}",
            {
                "reviewId": review.review_id,
                "verdict": verdict,
                "reviewer": reviewer,
                "noteChars": len(note),
                "noteSha256": sha256_hex(note),
                # Where the reviewer's right is judged (`audit.verify.authority`): the governance head now.
                "governanceAt": governance_position(),
            },
            bind={"reviewDigest": row},
        )
        return [event], [row]

    with transaction.atomic():
        append_to_finished_run(run_id=run.run_id, compose=compose)
        DiagnosisRun.objects.filter(run_id=run.run_id).update(
            review_verdict=verdict,
            reviewed_at=review.created_at,
            review_claimed_by="",
            review_claim_expires_at=None,
        )
        refresh_needs_review(run_ids=[run.run_id])
    logger.info(
        "review recorded run=%s review=%s verdict=%s user=%s", run.run_id, review.review_id, verdict, user.pk
    )
    return RunReview.objects.get(review_id=review.review_id)


# --------------------------------------------------------------------------------------------------
# The queue's claims (operational state on the run row, not audit facts: a claim only keeps two
# reviewers from working the same run at once; the review itself is what is recorded and chained)
# --------------------------------------------------------------------------------------------------
def claim_minutes() -> float:
    return float(settings.REVIEW_CLAIM_MINUTES)


def claim_run(*, run_id: str, user: AbstractBaseUser) -> bool:
    """Claim a queued run for `user` until now + `REVIEW_CLAIM_MINUTES`: true when the claim is
    `user`'s now (it was free, expired or already theirs), false when someone else holds it. One
    conditional UPDATE, so two reviewers never both win."""
    if not may_review(user):
        raise PermissionDenied(f"Reviews need the permission {REVIEW_PERMISSION}.")
    now = timezone.now()
    username = user.get_username()
    free = Q(review_claimed_by="") | Q(review_claim_expires_at__lt=now) | Q(review_claimed_by=username)
    return bool(
        DiagnosisRun.objects.filter(free, run_id=run_id).update(
            review_claimed_by=username, review_claim_expires_at=now + dt.timedelta(minutes=claim_minutes())
        )
    )


def release_claim(*, run_id: str, user: AbstractBaseUser) -> bool:
    """Give up `user`'s own claim on a run."""
    return bool(
        DiagnosisRun.objects.filter(run_id=run_id, review_claimed_by=user.get_username()).update(
            review_claimed_by="", review_claim_expires_at=None
        )
    )


def next_in_queue(*, user: AbstractBaseUser, reason_q=None) -> DiagnosisRun | None:
    """Claim and return the oldest queued run nobody else holds (optionally of one reason), or None.
    Each attempt is one indexed read and one conditional UPDATE; a run taken by another reviewer in
    between is skipped."""
    username = user.get_username()
    for _ in range(APPEND_ATTEMPTS):
        now = timezone.now()
        free = Q(review_claimed_by="") | Q(review_claim_expires_at__lt=now) | Q(review_claimed_by=username)
        queued = DiagnosisRun.objects.filter(free, needs_review=True)
        if reason_q is not None:
            queued = queued.filter(reason_q)
        run = queued.order_by("created_at", "id").only("pk", "run_id").first()
        if run is None:
            return None
        if claim_run(run_id=run.run_id, user=user):
            return DiagnosisRun.objects.get(pk=run.pk)
    return None
