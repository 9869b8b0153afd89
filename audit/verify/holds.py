"""Legal holds and retention purges as the governance chain records them: what holds a run, what purged
it, and whether a tombstone or a hold row says the same (read side; `audit.write.retention` writes them).

**The chain decides, the tables are an index.** Placing and lifting a hold, and every retention purge,
are chained governance events (`LEGAL_HOLD_PLACED`/`LIFTED` with the hold's id, scope and target;
`AUDIT_RUNS_PURGED` with the run ids), taken only when the service wrote them
(`audit.verify.authenticity.written_by_the_service`: a forged lift lifts nothing, a forged purge excuses
nothing). Which runs are held, and since when, is rebuilt from those events (`chained_holds`): the purges
exclude what either the chain or the hold table holds (`held`), and `verify_audit` judges a tombstone by
the chained purge that names it and the holds at that position of the chain (`tombstone_problems`),
names every hold row that disagrees with the chain (`hold_problems`), and every chained change made
while a hold covered the run (`held_at_problems`). Editing or deleting a hold row, or forging a tombstone,
therefore proves nothing.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass

from django.conf import settings
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from audit.models import GovernanceEvent, GovernanceEventType, HoldScope, LegalHold, RunTombstone
from audit.payloads import sha256_hex
from audit.verify.authenticity import written_by_the_service
from diagnosis.models import DiagnosisRun


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
    chain order) the service wrote (`audit.verify.authenticity.written_by_the_service`: a forged lift lifts
    nothing); a lift names its hold by id. The chain's own integrity is
    `audit.verify.governance_chain.verify_governance`'s check."""
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


def active_hold_targets() -> tuple[set[str], set[str]]:
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
