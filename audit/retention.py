"""Retention of trace records and legal holds (`manage.py purge_audit`, the API's and the admin's holds).

**Retention.** A finished run's trace records (timeline events, model steps, tool rows, reasoning rows,
feedback, reviews and the run row) are kept `AUDIT_RETENTION_DAYS` after it finished (default 183: EU AI Act
Art. 19 and 26(6) ask for at least six months), then `purge_expired_runs` deletes them and writes a
`RunTombstone` in the same transaction. Only anchored runs are purged (the purge checkpoints first), and
their leaves stay in the transparency log, so the log, its checkpoints and every other run still verify;
`verify_audit` accepts a missing anchored run only with a tombstone that was written after the run's
anchored finish time plus the retention and while no legal hold covered it, and reports it as purged.
Batches take the log's lock, so a purge never interleaves with a checkpoint (or another purge).

**Legal holds.** An active hold (not lifted) on a session or run exempts its records from this purge and
from the reasoning purge (`reasoning.services.purge_reasoning`) until it is lifted. Placing and lifting
need `audit.place_legal_hold`; who, when and why are recorded, holds are never deleted.

**The chain decides, the tables are an index.** Placing and lifting a hold, and every retention purge,
are chained governance events (`LEGAL_HOLD_PLACED`/`LIFTED` with the hold's id, scope and target;
`AUDIT_RUNS_PURGED` with the run ids). Which runs are held, and since when, is rebuilt from those events
(`chained_holds`): the purges exclude what either the chain or the hold table holds, and `verify_audit`
judges a tombstone by the chained purge that names it and the chained holds at that time, and names
every hold row that disagrees with the chain (`hold_problems`). Editing or deleting a hold row, or
forging a tombstone, therefore proves nothing.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from dataclasses import dataclass, field

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Count, Exists, OuterRef, Q, Subquery
from django.utils import timezone

from audit import appended_rows
from audit.authenticity import written_by_the_service
from audit.authority import permitted
from audit.models import (
    HOLD_PERMISSION,
    AgentStep,
    Checkpoint,
    GovernanceEvent,
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
from audit.recorder.governance import record_governance_event
from audit.transparency import keys, leafdata
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
@dataclass(frozen=True, slots=True)
class ChainedHold:
    """A legal hold as the governance chain records it: placed (and possibly lifted) at the chained
    events' times."""

    hold_id: int
    scope: str
    target_id: str
    placed_at: dt.datetime
    placed_seq: int
    lifted_at: dt.datetime | None = None
    placed_by: str = ""
    reason_sha256: str | None = None  # None: placed before the chain carried it
    lifted_by: str = ""
    lift_reason_sha256: str | None = None
    lifted_seq: int | None = None

    def covers(self, *, run_id: str, session_id: str, at_seq: int) -> bool:
        """Whether the hold covered the run at governance event `at_seq`: placed before it in the chain
        and not lifted before it. Positions in the signed chain decide, never the times written."""
        target = run_id if self.scope == HoldScope.RUN else session_id
        return (
            self.target_id == target
            and self.placed_seq < at_seq
            and (self.lifted_seq is None or self.lifted_seq > at_seq)
        )


def chained_holds() -> list[ChainedHold]:
    """Every legal hold, rebuilt from the chained `LEGAL_HOLD_PLACED` / `LEGAL_HOLD_LIFTED` events (in
    chain order) the service wrote (`audit.authenticity.written_by_the_service`: a forged lift lifts
    nothing); a lift names its hold by id. The chain's own integrity is
    `audit.verification.verify_governance`'s check."""
    holds: dict[int, ChainedHold] = {}
    events = GovernanceEvent.objects.filter(
        event_type__in=(GovernanceEventType.LEGAL_HOLD_PLACED, GovernanceEventType.LEGAL_HOLD_LIFTED)
    ).order_by("sequence_no")
    authentic = written_by_the_service()
    for event in events.only("sequence_no", "event_type", "actor", "details", "created_at", "hash", "tag"):
        if not authentic(event):
            continue  # a forged placement or lift decides nothing (verify_audit names it)
        details = event.details if isinstance(event.details, dict) else {}
        try:
            hold_id = int(details.get("holdId"))
        except (TypeError, ValueError):
            continue
        if event.event_type == GovernanceEventType.LEGAL_HOLD_PLACED:
            holds.setdefault(
                hold_id,
                ChainedHold(
                    hold_id=hold_id,
                    scope=str(details.get("scope") or ""),
                    target_id=str(details.get("targetId") or ""),
                    placed_at=event.created_at,
                    placed_seq=event.sequence_no,
                    placed_by=event.actor,
                    reason_sha256=details.get("reasonSha256"),
                ),
            )
        elif hold_id in holds and holds[hold_id].lifted_at is None:
            holds[hold_id] = dataclasses.replace(
                holds[hold_id],
                lifted_at=event.created_at,
                lifted_by=event.actor,
                lift_reason_sha256=details.get("reasonSha256"),
                lifted_seq=event.sequence_no,
            )
    return list(holds.values())


def chained_purges() -> dict[str, tuple[int, dt.datetime]]:
    """run id → (sequence number, time) of the chained `AUDIT_RUNS_PURGED` event the service wrote that
    names it (a forged or backdated purge excuses nothing)."""
    purges: dict[str, tuple[int, dt.datetime]] = {}
    events = GovernanceEvent.objects.filter(event_type=GovernanceEventType.AUDIT_RUNS_PURGED).order_by(
        "sequence_no"
    )
    authentic = written_by_the_service()
    for event in events.only("sequence_no", "details", "created_at", "hash", "tag"):
        if not authentic(event):
            continue  # a forged (or backdated) purge excuses no missing run
        details = event.details if isinstance(event.details, dict) else {}
        for run_id in details.get("runIds") or ():
            purges.setdefault(str(run_id), (event.sequence_no, event.created_at))
    return purges


def hold_problems(holds: list[ChainedHold] | None = None) -> list[str]:
    """Every hold row that disagrees with the chain and every row the chain never placed: a row must
    repeat its chained placement and lift exactly (scope, target, who, when, and the SHA-256 of each
    reason; holds placed before the chain carried reason digests are compared without them)."""
    holds = chained_holds() if holds is None else holds
    rows = {h.pk: h for h in LegalHold.objects.all()}
    problems = []
    for chained in holds:
        row = rows.pop(chained.hold_id, None)
        where = f"legal hold {chained.hold_id} (governance event {chained.placed_seq})"
        if row is None:
            problems.append(f"{where}: its row is missing from the hold table")
            continue
        stored = {
            "scope": row.scope,
            "target": row.target_id,
            "placed by": row.placed_by_username,
            "placed at": row.placed_at,
            "lifted": row.lifted_at is not None,
            "lifted by": row.lifted_by_username,
            "lifted at": row.lifted_at,
        }
        wanted = {
            "scope": chained.scope,
            "target": chained.target_id,
            "placed by": chained.placed_by,
            "placed at": chained.placed_at,
            "lifted": chained.lifted_at is not None,
            "lifted by": chained.lifted_by,
            "lifted at": chained.lifted_at,
        }
        if chained.reason_sha256 is not None:
            stored["reason"], wanted["reason"] = sha256_hex(row.reason), chained.reason_sha256
        if chained.lift_reason_sha256 is not None:
            stored["lift reason"] = sha256_hex(row.lift_reason)
            wanted["lift reason"] = chained.lift_reason_sha256
        elif chained.lifted_at is None:
            stored["lift reason"], wanted["lift reason"] = row.lift_reason, ""
        differ = [k for k in wanted if stored[k] != wanted[k]]
        if differ:
            problems.append(f"{where}: its row differs from the chain in: {', '.join(differ)}")
    for pk in sorted(rows):
        problems.append(f"legal hold {pk}: no chained LEGAL_HOLD_PLACED event placed it")
    return problems


def _chained_active_targets() -> tuple[set[str], set[str]]:
    run_ids, session_ids = set(), set()
    for hold in chained_holds():
        if hold.lifted_at is None:
            (run_ids if hold.scope == HoldScope.RUN else session_ids).add(hold.target_id)
    return run_ids, session_ids


def held(*, run_field: str = "run_id", session_field: str = "session_id") -> Q:
    """A filter true for rows whose run or session is under an active legal hold, by the hold table or
    by the chain (a deleted or edited hold row does not release what the chain holds)."""
    on_run = LegalHold.objects.filter(
        scope=HoldScope.RUN, target_id=OuterRef(run_field), lifted_at__isnull=True
    )
    on_session = LegalHold.objects.filter(
        scope=HoldScope.SESSION, target_id=OuterRef(session_field), lifted_at__isnull=True
    )
    run_ids, session_ids = _chained_active_targets()
    chained = Q(**{f"{run_field}__in": sorted(run_ids)}) | Q(**{f"{session_field}__in": sorted(session_ids)})
    return Q(Exists(on_run)) | Q(Exists(on_session)) | chained


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


def holds_of_session(*, session_id: str):
    """Every hold (active or lifted) on the session or one of its runs, newest first."""
    run_ids = DiagnosisRun.objects.filter(session_id=session_id).values("run_id")
    return LegalHold.objects.filter(
        Q(scope=HoldScope.SESSION, target_id=session_id) | Q(scope=HoldScope.RUN, target_id__in=run_ids)
    ).order_by("-placed_at", "-id")


def holds_at(*, run_id: str, session_id: str, at: dt.datetime) -> list[LegalHold]:
    """Holds that covered the run at time `at` (placed before it and not lifted before it)."""
    return list(
        LegalHold.objects.filter(
            Q(scope=HoldScope.RUN, target_id=run_id) | Q(scope=HoldScope.SESSION, target_id=session_id),
            placed_at__lte=at,
        ).filter(Q(lifted_at__isnull=True) | Q(lifted_at__gt=at))
    )


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
            # configurations no run names any more (display copies of nothing: `audit.configurations`
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
    run_targets, session_targets = _active_hold_targets()
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


def _active_hold_targets() -> tuple[set[str], set[str]]:
    """(run ids, session ids) under an active hold, by the hold table or by the chain."""
    run_ids, session_ids = _chained_active_targets()
    for scope, target in LegalHold.objects.filter(lifted_at__isnull=True).values_list("scope", "target_id"):
        (run_ids if scope == HoldScope.RUN else session_ids).add(target)
    return run_ids, session_ids


def tombstone_problems(
    tombstone: RunTombstone,
    *,
    leaf_index: int,
    finished_at: str | None,
    signed_at,
    purge: tuple[int, dt.datetime] | None = None,
    holds: list[ChainedHold] | None = None,
    session_id: str | None = None,
) -> list[str]:
    """Why a tombstone does not excuse its run's absence (empty: it does). `finished_at` is the leaf's
    anchored finish time (None: use `signed_at`, the first checkpoint covering the leaf); `purge` the
    chained retention purge naming the run (`chained_purges`), whose time is the purge's time (the
    tombstone's own columns are not trusted for it); `holds` the chained holds (`chained_holds`);
    `session_id` the session the leaf anchored (the tombstone's must equal it)."""
    problems = []
    where = f"tombstone of run {tombstone.run_id}"
    if tombstone.leaf_index != leaf_index:
        problems.append(f"{where}: names leaf {tombstone.leaf_index}, the run is at leaf {leaf_index}")
    if session_id is not None and tombstone.session_id != session_id:
        problems.append(f"{where}: names another session than its leaf anchored")
    session_id = tombstone.session_id if session_id is None else session_id
    if purge is None:
        problems.append(f"{where}: no chained retention purge (AUDIT_RUNS_PURGED) names the run")
        purged_at = tombstone.purged_at
    else:
        purged_at = purge[1]
        if tombstone.purged_at != purged_at:
            problems.append(
                f"{where}: its purge time differs from the chained purge (governance event {purge[0]})"
            )
    finished = dt.datetime.fromisoformat(finished_at) if finished_at else signed_at
    if finished is not None:
        days = settings.AUDIT_RETENTION_DAYS
        if purged_at < finished + dt.timedelta(days=days):
            problems.append(
                f"{where}: purged before the retention of {days} day(s) after its anchored finish"
            )
    if purged_at > timezone.now() + dt.timedelta(minutes=5):
        problems.append(f"{where}: purge time lies in the future")
    holds = chained_holds() if holds is None else holds
    # By positions in the chain: the purge's against each hold's placement and lift; a purge the chain
    # does not record happened at the latest now, after every event (a hold still in force covers it).
    at_seq = (
        purge[0] if purge is not None else max((h.lifted_seq or h.placed_seq for h in holds), default=0) + 1
    )
    covering = {
        h.hold_id for h in holds if h.covers(run_id=tombstone.run_id, session_id=session_id, at_seq=at_seq)
    }
    covering |= {h.pk for h in holds_at(run_id=tombstone.run_id, session_id=session_id, at=purged_at)}
    for hold_id in sorted(covering):
        problems.append(f"{where}: purged while legal hold {hold_id} covered it")
    return problems


def held_at_problems(
    *, run_id: str, session_id: str, at_seq: int, holds: list[ChainedHold], what: str
) -> list[str]:
    """`what` (a change the governance chain records at `at_seq`, e.g. a reasoning purge) made while a
    chained hold covered the run: one problem per hold, decided by positions in the chain."""
    return [
        f"{what} while legal hold {h.hold_id} covered the run (governance events {h.placed_seq}–{at_seq})"
        for h in holds
        if h.covers(run_id=run_id, session_id=session_id, at_seq=at_seq)
    ]
