"""Upgrading a store recorded before write authentication: one step, run once by `migrate` (issue 43,
item 10; migration `audit.0019_adopt_records_before_write_authentication`).

`adopt` anchors with leaves of before write authentication what the previous version's checkpointer
would have anchored next, tags every run still open and its chain head, and chains `WRITE_AUTH_STARTED`;
it rewrites nothing, and is a no-op on a store where any link carries a tag (a new installation never
adopts anything). Details: docs/audit-integrity.md, *Upgrading a store recorded before write
authentication*.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from django.db import transaction
from django.db.models import Exists, JSONField, Max, OuterRef, Subquery
from django.utils import timezone

from audit.models import (
    EventType,
    GovernanceEvent,
    GovernanceEventType,
    LogHead,
    LogLeaf,
    TailPending,
    TraceEvent,
)
from audit.transparency import gate, keys, leafdata, log
from audit.write.governance import record_governance_event
from core import writeauth
from diagnosis import services
from diagnosis.models import TERMINAL_RUN_STATUSES, DiagnosisRun
from reasoning.models import ReasoningAccessLog

ACTOR = "migrate"


@dataclass(slots=True)
class AdoptionReport:
    anchored_runs: int = 0
    anchored_tails: int = 0
    governance_head: int = 0
    open_runs: dict[str, int] = field(default_factory=dict)
    event: int | None = None  # the WRITE_AUTH_STARTED event's sequence number


def needed() -> bool:
    """Whether this store was recorded before write authentication: it holds links and none is tagged."""
    has_links = TraceEvent.objects.exists() or GovernanceEvent.objects.exists() or LogLeaf.objects.exists()
    if not has_links:
        return False
    tagged = TraceEvent.objects.exclude(tag="").exists() or GovernanceEvent.objects.exclude(tag="").exists()
    return not tagged


def adopt(*, now: dt.datetime | None = None) -> AdoptionReport | None:
    """Adopt the store (see the module docstring); None when there is nothing to adopt."""
    if not needed():
        return None
    keys.current_key()
    writeauth.verifier()
    report = AdoptionReport()
    with transaction.atomic():
        report.anchored_runs, report.anchored_tails, governance = anchor_legacy(now=now)
        report.governance_head = governance or _governance_head_seq()
        report.open_runs = _tag_open_heads()
        event = record_governance_event(
            event_type=GovernanceEventType.WRITE_AUTH_STARTED,
            actor=ACTOR,
            details={
                "writeKeyId": writeauth.verifier().current.key_id,
                "anchoredRuns": report.anchored_runs,
                "anchoredTails": report.anchored_tails,
                "governanceAdoptedUpto": report.governance_head,
                "openRuns": report.open_runs,
                # Reads of reasoning logged before reads were chained (audit.verify.access_log).
                "accessLogUpto": ReasoningAccessLog.objects.aggregate(at=Max("pk"))["at"] or 0,
            },
        )
        report.event = event.sequence_no
    return report


def anchor_legacy(*, now: dt.datetime | None = None) -> tuple[int, int, int | None]:
    """Step 1 (what the previous version's checkpointer did next): anchor every finished run without a
    leaf, every grown tail and the governance head with leaves of before write authentication, and sign
    one checkpoint; returns (runs, tails, the governance sequence anchored or None)."""
    log.ensure_head()
    with transaction.atomic():
        head = LogHead.objects.select_for_update().get(pk=1)
        stamp = now or timezone.now()
        runs = _legacy_run_heads(head.tree_size)
        tails = _legacy_tails()
        governance = _legacy_governance_head()
        if runs or tails or governance:
            log.append_leaves(head, runs, stamp, governance, tails)
            log.sign_head(head, timezone.now())
        TailPending.objects.filter(run_id__in=[t.run_id for t in tails]).delete()
    return len(runs), len(tails), governance.sequence_no if governance else None


def _legacy_run_heads(tree_size: int) -> list[gate.Head]:
    """Every finished run without a leaf, with its chain head and last RUN_FINISHED, as the previous
    version's checkpointer read them (no write key: leaves of before write authentication)."""
    last = TraceEvent.objects.filter(run_id=OuterRef("run_id")).order_by("-sequence_no")
    finish = TraceEvent.objects.filter(run_id=OuterRef("run_id"), event_type=EventType.RUN_FINISHED).order_by(
        "-sequence_no"
    )
    anchored = LogLeaf.objects.filter(run_id=OuterRef("run_id"), leaf_index__lt=tree_size)
    rows = (
        DiagnosisRun.objects.filter(status__in=TERMINAL_RUN_STATUSES)
        .filter(~Exists(anchored))
        .annotate(
            head_hash=Subquery(last.values("hash")[:1]),
            head_sequence_no=Subquery(last.values("sequence_no")[:1]),
            finished_details=Subquery(finish.values("details")[:1], output_field=JSONField()),
            finished_event_at=Subquery(finish.values("created_at")[:1]),
        )
        .order_by("finished_at", "id")
    )
    return [
        gate.Head(
            run_id=r.run_id,
            session_id=r.session_id,
            sequence_no=r.head_sequence_no or 0,
            hash=r.head_hash or leafdata.GENESIS_HASH,
            write_key_id=None,
            finished_details=r.finished_details,
            finished_at=r.finished_event_at,
        )
        for r in rows
    ]


def _legacy_tails() -> list[gate.Head]:
    """Every anchored run whose chain grew since its newest anchored head (its tail note names it)."""
    ids = list(TailPending.objects.order_by("id").values_list("run_id", flat=True))
    anchored = log.anchored_heads(ids)
    sessions = dict(DiagnosisRun.objects.filter(run_id__in=ids).values_list("run_id", "session_id"))
    tails = []
    for run_id in ids:
        head = TraceEvent.objects.filter(run_id=run_id).order_by("-sequence_no").first()
        grown = head is not None and run_id in anchored and head.sequence_no > anchored[run_id]
        if grown and run_id in sessions:
            tails.append(gate.Head(run_id, sessions[run_id], head.sequence_no, head.hash, None))
    return tails


def _legacy_governance_head() -> gate.GovernanceHead | None:
    head = GovernanceEvent.objects.order_by("-sequence_no").first()
    anchored = gate.anchored_governance_head()
    if head is None or (anchored is not None and anchored[0] >= head.sequence_no):
        return None
    return gate.GovernanceHead(head.sequence_no, head.hash, head.created_at, None)


def _governance_head_seq() -> int:
    return GovernanceEvent.objects.order_by("-sequence_no").values_list("sequence_no", flat=True).first() or 0


def _tag_open_heads() -> dict[str, int]:
    """Tag every open run as created (its creation tag: `diagnosis.services.identity_digest`) and the
    head event of each that has a chain; returns run id → the head's sequence (0: no chain yet)."""
    adopted = {}
    for run in DiagnosisRun.objects.exclude(status__in=TERMINAL_RUN_STATUSES).order_by("id"):
        created = writeauth.tag(writeauth.RUN_CREATED, services.identity_digest(run))
        DiagnosisRun.objects.filter(pk=run.pk).update(created_tag=created)
        head = TraceEvent.objects.filter(run_id=run.run_id).order_by("-sequence_no").first()
        if head is not None:
            TraceEvent.objects.filter(pk=head.pk).update(tag=writeauth.tag(writeauth.RUN, head.hash))
        adopted[run.run_id] = head.sequence_no if head is not None else 0
    return adopted
