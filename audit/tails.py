"""The tails of finished runs: what was appended to a run's chain after the transparency log anchored it.

A finished run's record can grow (a review, a reasoning purge or re-encryption), never silently change.
Whoever appends to a finished run's chain calls `note_appended` in the transaction of the append; the
next checkpoint (`audit.transparency.log.checkpoint`) then appends a run-tail leaf anchoring the run's
new head, and `verify_audit` holds the run to every head anchored for it
(`audit.transparency.verify.check_anchor`). Until that checkpoint the new events are in the documented
window before anchoring (a note, not a failure).
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from audit.models import TailPending


def note_appended(*, run_id: str, sequence_no: int) -> None:
    """Record that the chain of the finished run `run_id` now reaches `sequence_no` (inside the append's
    transaction, while its writer holds the run row's lock, so appenders to one run never race here)."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("a run's tail is noted inside the transaction that appended it")
    updated = TailPending.objects.filter(run_id=run_id, last_sequence_no__lt=sequence_no).update(
        last_sequence_no=sequence_no, noted_at=timezone.now()
    )
    if not updated and not TailPending.objects.filter(run_id=run_id).exists():
        TailPending.objects.create(run_id=run_id, last_sequence_no=sequence_no, noted_at=timezone.now())
