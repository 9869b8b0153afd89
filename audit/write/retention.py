"""Retention of trace records and the placing and lifting of legal holds (`manage.py purge_audit`, the
API's and the admin's holds); what holds a run, read from the chain, is `audit.verify.holds`.

`purge_expired_runs` deletes a finished, anchored run's records `AUDIT_RETENTION_DAYS` after it finished
and leaves a `RunTombstone` in the same transaction; its leaf stays, so the log still verifies. Batches
take the log's lock, never interleaving with a checkpoint. An active legal hold (by the chain *or* the
hold table) exempts a session or run from this and the reasoning purge; holds need
`audit.place_legal_hold`, are recorded and never deleted.
Details: docs/audit-integrity.md, *Retention and legal holds*.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Count, Exists, OuterRef, Q, Subquery
from django.utils import timezone

from audit.models import (
    HOLD_PERMISSION,
    AgentStep,
    Checkpoint,
    GovernanceEventType,
    HoldScope,
    LegalHold,
    LogHead,
    LogLeaf,
    RunReview,
    RunTombstone,
    ToolInvocation,
    TraceEvent,
)
from audit.payloads import sha256_hex
from audit.transparency import keys, leafdata
from audit.verify import appended_rows
from audit.verify.authority import permitted
from audit.verify.holds import active_hold_targets, held
from audit.write.governance import record_governance_event
from diagnosis.models import TERMINAL_RUN_STATUSES, DiagnosisRun, RunConfiguration, RunFeedback
from diagnosis.services import refresh_session_facts
from reasoning.models import AgentReasoningAudit

logger = logging.getLogger(__name__)

_TABLES = (
    ("events", TraceEvent),
    ("steps", AgentStep),
    ("tools", ToolInvocation),
    ("reasoning", AgentReasoningAudit),
    ("feedback", RunFeedback),
    ("reviews", RunReview),
)
PURGE_BATCH = 200
REASON_CHARS = 1000


# --------------------------------------------------------------------------------------------------
# Legal holds
# --------------------------------------------------------------------------------------------------


def _check(user: AbstractBaseUser, reason: str) -> str:
    if not permitted(user, HOLD_PERMISSION):  # the database's answer and the governance chain's
        raise PermissionDenied
    reason = (reason or "").strip()
    if not reason:
        raise ValidationError({"reason": ["A reason is required."]})
    if len(reason) > REASON_CHARS:
        raise ValidationError({"reason": [f"At most {REASON_CHARS} characters."]})
    return reason


def place_hold(*, user: AbstractBaseUser, scope: str, target_id: str, reason: str) -> LegalHold:
    """Place a hold on a session or run (its id as the API speaks it). PermissionDenied without
    `audit.place_legal_hold`; ValidationError for an empty reason or an unknown scope."""
    reason = _check(user, reason)
    if scope not in HoldScope.values:
        raise ValidationError({"scope": [f"One of {', '.join(HoldScope.values)}."]})
    with transaction.atomic():
        hold = LegalHold.objects.create(
            scope=scope,
            target_id=target_id,
            reason=reason,
            placed_by=user,
            placed_by_username=user.get_username(),
            placed_at=timezone.now(),
        )
        event = record_governance_event(
            event_type=GovernanceEventType.LEGAL_HOLD_PLACED,
            actor=user.get_username(),
            permission=HOLD_PERMISSION,
            details={
                "holdId": hold.pk,
                "scope": scope,
                "targetId": target_id,
                "reasonSha256": sha256_hex(reason),
            },
        )
        # The row repeats the chained time exactly (`hold_problems` compares them).
        LegalHold.objects.filter(pk=hold.pk).update(placed_at=event.created_at)
        hold.placed_at = event.created_at
    logger.info("legal hold placed hold=%s scope=%s target=%s user=%s", hold.pk, scope, target_id, user.pk)
    return hold


def lift_hold(*, user: AbstractBaseUser, hold: LegalHold, reason: str) -> LegalHold:
    """Lift an active hold, recording who, when and why; lifting a lifted hold is refused."""
    reason = _check(user, reason)
    if hold.lifted_at is not None:
        raise ValidationError({"hold": ["This hold was already lifted."]})
    now = timezone.now()
    with transaction.atomic():
        updated = LegalHold.objects.filter(pk=hold.pk, lifted_at__isnull=True).update(
            lifted_at=now, lifted_by=user, lifted_by_username=user.get_username(), lift_reason=reason
        )
        if not updated:
            raise ValidationError({"hold": ["This hold was already lifted."]})
        event = record_governance_event(
            event_type=GovernanceEventType.LEGAL_HOLD_LIFTED,
            actor=user.get_username(),
            permission=HOLD_PERMISSION,
            details={
                "holdId": hold.pk,
                "scope": hold.scope,
                "targetId": hold.target_id,
                "reasonSha256": sha256_hex(reason),
            },
        )
        LegalHold.objects.filter(pk=hold.pk).update(lifted_at=event.created_at)
    hold.refresh_from_db()
    logger.info("legal hold lifted hold=%s user=%s", hold.pk, user.pk)
    return hold


# --------------------------------------------------------------------------------------------------
# Retention
# --------------------------------------------------------------------------------------------------
@dataclass(slots=True)
class PurgeReport:
    cutoff: dt.datetime
    purged: list[str] = field(default_factory=list)
    held: int = 0
    unanchored: int = 0
    rows: dict[str, int] = field(default_factory=dict)


def _expired(cutoff: dt.datetime):
    finished_before = Q(finished_at__lt=cutoff) | Q(finished_at__isnull=True, created_at__lt=cutoff)
    return DiagnosisRun.objects.filter(finished_before, status__in=TERMINAL_RUN_STATUSES)


def purge_expired_runs(
    *,
    now: dt.datetime | None = None,
    retention_days: int | None = None,
    purged_by: str = "purge_audit",
    batch_size: int = PURGE_BATCH,
) -> PurgeReport:
    """Purge the trace records of every anchored run that finished more than `retention_days` (default
    `AUDIT_RETENTION_DAYS`) before `now` and is not under a legal hold; see the module docstring."""
    from audit.transparency.log import checkpoint

    now = now or timezone.now()
    days = settings.AUDIT_RETENTION_DAYS if retention_days is None else retention_days
    if days < 0:
        raise ValueError("retention must not be negative")
    cutoff = now - dt.timedelta(days=days)
    report = PurgeReport(cutoff=cutoff)
    keys.current_key()
    checkpoint()  # what finished is anchored before anything is purged
    expired = _expired(cutoff)
    report.held = expired.filter(held()).count()
    anchored = LogLeaf.objects.filter(run_id=OuterRef("run_id"))
    report.unanchored = expired.exclude(Exists(anchored)).count()
    candidates = (
        expired.filter(Exists(anchored))
        .exclude(held())
        .annotate(
            leaf_index=Subquery(anchored.values("leaf_index")[:1]),
            leaf_data=Subquery(anchored.values("data")[:1]),
        )
        .order_by("id")
    )
    last_id = 0
    while True:
        with transaction.atomic():
            LogHead.objects.select_for_update().filter(pk=1).first()
            found = list(candidates.filter(id__gt=last_id).only("id", "run_id", "session_id")[:batch_size])
            if not found:
                break
            last_id = found[-1].id
            batch = _past_retention(found, cutoff=cutoff)
            report.held += sum(1 for r in found if r.held_by_anchor)
            if not batch:
                continue
            ids = [r.run_id for r in batch]
            per_run: dict[str, dict[str, int]] = {rid: {} for rid in ids}
            for name, model in _TABLES + appended_rows.purge_tables():
                rows = model.objects.filter(run_id__in=ids)
                for rid, n in rows.values("run_id").annotate(n=Count("pk")).values_list("run_id", "n"):
                    per_run[rid][name] = n
                    report.rows[name] = report.rows.get(name, 0) + n
                rows.delete()
            # The chained event first: the tombstones repeat its time exactly (`tombstone_problems`).
            event = record_governance_event(
                event_type=GovernanceEventType.AUDIT_RUNS_PURGED,
                actor=purged_by,
                details={"runs": len(ids), "runIds": ids, "retentionDays": days},
            )
            RunTombstone.objects.bulk_create(
                [
                    RunTombstone(
                        run_id=r.run_id,
                        session_id=r.session_id,
                        leaf_index=r.leaf_index,
                        finished_at=r.anchored["finishedAt"] or "",
                        purged_at=event.created_at,
                        retention_days=days,
                        reason=f"retention: finished more than {days} day(s) before the purge",
                        purged_by=purged_by[:150],
                        rows_deleted=per_run[r.run_id],
                    )
                    for r in batch
                ]
            )
            purged = DiagnosisRun.objects.filter(run_id__in=ids)
            fingerprints = set(purged.values_list("config_fingerprint", flat=True)) - {""}
            purged.delete()
            # Their sessions' stored run counts, in the purge's transaction; and the stored
            # configurations no run names any more (display copies of nothing: `audit.verify.configurations`
            # names a stored configuration no run's chain names as forged).
            refresh_session_facts(session_ids={r.session_id for r in batch})
            RunConfiguration.objects.filter(fingerprint__in=sorted(fingerprints)).exclude(
                fingerprint__in=DiagnosisRun.objects.values("config_fingerprint")
            ).delete()
            report.purged.extend(ids)
    logger.info(
        "audit purge runs=%d held=%d unanchored=%d retention_days=%d",
        len(report.purged),
        report.held,
        report.unanchored,
        days,
    )
    return report


def _past_retention(runs: list[DiagnosisRun], *, cutoff: dt.datetime) -> list[DiagnosisRun]:
    """The runs among `runs` (found by their mutable columns) that their signed leaf says finished before
    `cutoff`, in the session their leaf anchored, and that no hold covers by that session: a run's
    `finished_at` or `session_id` column moved by a database writer does not get it purged early or
    out of its session's hold. Each kept run gets `anchored` (its decoded leaf); a run skipped for a
    hold gets `held_by_anchor`."""
    run_targets, session_targets = active_hold_targets()
    kept = []
    for run in runs:
        run.held_by_anchor = False
        try:
            fields = leafdata.decode(run.leaf_data)
        except ValueError:
            logger.warning("audit purge skipped run=%s: its leaf is not a canonical run leaf", run.run_id)
            continue
        if fields["runId"] != run.run_id:
            logger.warning("audit purge skipped run=%s: its leaf anchors another run", run.run_id)
            continue
        finished = fields["finishedAt"]
        if finished is None:
            first = (
                Checkpoint.objects.filter(tree_size__gt=run.leaf_index)
                .order_by("tree_size")
                .values_list("signed_at", flat=True)
                .first()
            )
            at = first
        else:
            at = dt.datetime.fromisoformat(finished)
        if at is None or at >= cutoff:
            continue
        if fields["sessionId"] in session_targets or run.run_id in run_targets:
            run.held_by_anchor = True
            continue
        run.anchored = fields
        kept.append(run)
    return kept
