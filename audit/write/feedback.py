"""Reader feedback as part of the run's record: `record_feedback` stores the reader's vote
(`diagnosis.services.submit_feedback`: one row per reader and run, replaced by their next vote) and, in
the same transaction, appends `FEEDBACK_RECORDED` to the run's chain through
`audit.write.append_to_finished_run` (fail-closed: no vote without its event).

The row is the reader's current vote, mutable by design (`audit.verify.coverage` excludes it); the chain keeps
every vote ever given — who, the rating, the comment's length and sha256, never the comment — so a
deleted or flipped down-vote (which puts a run in the review queue) is still on the record, and a
verifier holding the comment can tell it was the one given. Only finished runs are voted on (a reader
sees no answer before its release): `RunNotFinished` otherwise.
"""

from __future__ import annotations

import logging

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from audit.models import EventType, Phase
from audit.payloads import sha256_hex
from audit.write import ChainEvent, append_to_finished_run
from audit.write import RunNotFinished as RunNotFinished  # raised by record_feedback
from diagnosis.models import DiagnosisRun, RunFeedback
from diagnosis.services import submit_feedback

logger = logging.getLogger("audit.write.feedback")


def record_feedback(
    *, run: DiagnosisRun, user: AbstractBaseUser, rating: str, comment: str = ""
) -> RunFeedback:
    """Record `user`'s vote on the finished `run` (see the module docstring) and return the stored
    feedback. ValidationError for an unknown rating or an over-long comment (nothing written);
    RunNotFinished for a run that is not terminal."""
    with transaction.atomic():
        feedback = submit_feedback(run=run, user=user, rating=rating, comment=comment)
        username = user.get_username()
        append_to_finished_run(
            run_id=run.run_id,
            events=[
                ChainEvent(
                    Phase.RUN,
                    EventType.FEEDBACK_RECORDED,
                    rating.upper(),
                    f"feedback by {username}: {rating}",
                    {
                        "reader": username,
                        "rating": rating,
                        "commentChars": len(comment),
                        "commentSha256": sha256_hex(comment),
                    },
                )
            ],
        )
    logger.info("feedback recorded run=%s rating=%s user=%s", run.run_id, rating, user.pk)
    return feedback
