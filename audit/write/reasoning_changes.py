"""Changes to stored reasoning, on the record: retention purges and key rotation, each chained into
every changed run (`append_to_finished_run`) and the governance chain.

Keyword-only arguments. Log lines name ids and counts, never content or keys.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import models, transaction
from django.db.models import Q
from django.db.models.functions import Cast
from django.utils import timezone

from audit.models import EventType, GovernanceEventType, TraceEvent
from audit.read.list_facts import refresh_run_facts
from audit.verify import row_digests
from audit.verify.chain_digests import collect
from audit.verify.holds import held
from audit.verify.row_digests import stored_reasoning_rows
from audit.write.governance import record_governance_event, record_reasoning_change
from reasoning import crypto
from reasoning.fields import Ciphertext
from reasoning.models import AgentReasoningAudit
from reasoning.signals import reasoning_purging

logger = logging.getLogger(__name__)

PURGE_BATCH = 1000
ROTATE_BATCH = 500


# --------------------------------------------------------------------------------------------------
# Retention and key rotation
#
# Both change reasoning rows and append their event to each changed run's chain through
# `audit.write.append_to_finished_run` (under the run row's lock, with its current lease epoch, so on
# any run the runtime executed, and also on one still executing: its recorder reloads the head it lost).
# Lock order of every batch, the same in both (no two batches deadlock on MariaDB): the reasoning rows
# in primary-key order, then their runs' rows in run-id order, each with its chain head, then the
# governance chain's head.
# --------------------------------------------------------------------------------------------------
def purge_reasoning(
    *,
    older_than_days: int | None = None,
    run_id: str | None = None,
    now: dt.datetime | None = None,
    batch_size: int = PURGE_BATCH,
    actor: str = "purge_reasoning",
    stats: dict[str, int] | None = None,
) -> int:
    """Erase reasoning and assistant text and mark the rows purged; returns how many rows were purged.

    Selects rows not yet purged that were created more than `older_than_days` days before `now`, and/or
    belong to `run_id` (both given: both must hold; at least one is required). The row stays: its
    `reasoning_available`, `content_source` and `content_bytes` are kept as they were, both texts become
    NULL and `purged_at` is set. Works in batches of `batch_size` rows (one UPDATE each), so a large purge
    never holds long locks; running it again purges nothing more. Each batch writes, in its own
    transaction, a `REASONING_PURGED` event into the chain of every run it touched, with the new digests
    of the purged rows (`audit.write.record_reasoning_change`), so that they verify as purged. Rows
    of a run or session under an active legal hold (`audit.write.retention`) are never purged, not even when
    `run_id` names the run. Each batch also writes one `REASONING_ROWS_PURGED` governance event (`actor`).

    Before any row is purged, the saved resume state of every run with rows in scope is erased from
    the canonical store (`reasoning.signals.reasoning_purging`, received by the runtime: it holds the same
    reasoning); a held run's state is kept. If the store cannot be reached, nothing is purged.

    A row that does not match the digest its chain binds (`untampered`: changed in the database, e.g.
    backdated into the purge's scope) is left as it is, never re-bound: re-binding it would launder the
    change. It is counted (`stats["tampered"]` when `stats` is given, the batch's governance event, a
    warning) and `verify_audit` keeps naming it.
    """
    if older_than_days is None and not run_id:
        raise ValueError("purge_reasoning needs older_than_days, run_id or both")
    if older_than_days is not None and older_than_days < 0:
        raise ValueError("older_than_days must not be negative")
    now = now or timezone.now()
    scope = AgentReasoningAudit.objects.filter(purged_at__isnull=True)
    if older_than_days is not None:
        scope = scope.filter(created_at__lt=now - dt.timedelta(days=older_than_days))
    if run_id:
        scope = scope.filter(run_id=run_id)
    # A legal hold on the run or its session exempts its rows until the hold is lifted.
    scope = scope.exclude(held())
    # Copies of the same reasoning above this layer (an interrupted run's saved resume state) go first.
    reasoning_purging.send(
        sender=AgentReasoningAudit, run_ids=scope.order_by().values_list("run_id", flat=True).distinct()
    )
    purged = tampered = last = 0
    while True:
        ids = list(scope.filter(pk__gt=last).order_by("pk").values_list("pk", flat=True)[:batch_size])
        if not ids:
            break
        last = ids[-1]
        with transaction.atomic():
            locked = list(
                AgentReasoningAudit.objects.select_for_update()
                .filter(pk__in=ids, purged_at__isnull=True)
                .order_by("pk")
                .values_list("pk", flat=True)
            )
            locked, changed = untampered(locked)
            tampered += changed
            AgentReasoningAudit.objects.filter(pk__in=locked).update(
                reasoning_content=None, assistant_text=None, purged_at=now
            )
            rows = stored_reasoning_rows(pk__in=locked)
            if locked:
                # The governance record first: each run's REASONING_PURGED names it.
                record = record_governance_event(
                    event_type=GovernanceEventType.REASONING_ROWS_PURGED,
                    actor=actor,
                    details={
                        "rows": len(locked),
                        "runIds": sorted({row["run_id"] for row in rows}),
                        "olderThanDays": older_than_days,
                        **({"tamperedRowsLeft": changed} if changed else {}),
                    },
                )
                record_reasoning_change(
                    event_type=EventType.REASONING_PURGED,
                    rows=rows,
                    governance_sequence_no=record.sequence_no,
                )
            # The purge appends to the runs' chains: their stored list facts are decided again.
            refresh_run_facts(run_ids={row["run_id"] for row in rows})
        purged += len(locked)
    if tampered:
        logger.warning("reasoning purge left rows=%d that do not match their chained digests", tampered)
    if stats is not None:
        stats.update(purged=purged, tampered=tampered)
    logger.info(
        "reasoning purged rows=%d older_than_days=%s run=%s",
        purged,
        older_than_days,
        run_id or "-",
    )
    return purged


def untampered(pks: list[int]) -> tuple[list[int], int]:
    """(the rows among `pks` that match the digest their run's chain binds, how many do not), by the rule
    `verify_audit` applies (`audit.verify.rows.verify_rows`): a row bound without a digest, or unbound in a
    run recorded before row digests, counts as matching; a row whose stored form differs from its
    binding, or that no event binds in a run with digests, does not. Reads the rows and their runs'
    events once."""
    if not pks:
        return [], 0
    rows = stored_reasoning_rows(pk__in=pks)
    run_ids = sorted({row["run_id"] for row in rows})
    events: dict[str, list[Any]] = {run_id: [] for run_id in run_ids}
    for event in (
        TraceEvent.objects.filter(run_id__in=run_ids)
        .order_by("run_id", "sequence_no")
        .only("run_id", "sequence_no", "event_type", "status", "details")
    ):
        events[event.run_id].append(event)
    bindings = {run_id: collect(run_events) for run_id, run_events in events.items()}
    good = []
    for row in rows:
        run = bindings[row["run_id"]]
        bound = run.reasoning.get((row["step_index"], row["agent_name"]))
        if bound is None:
            matches = not run.digests_seen
        else:
            matches = bound.digest is None or bound.digest == row_digests.REASONING.digest(row)
        if matches:
            good.append(row["id"])
    return sorted(good), len(rows) - len(good)


def purge_expired_reasoning(*, now: dt.datetime | None = None) -> int:
    """Purge by the configured retention (`REASONING_RETENTION_DAYS`)."""
    return purge_reasoning(older_than_days=settings.REASONING_RETENTION_DAYS, now=now)


@dataclass(slots=True)
class RotationReport:
    """What a rotation did. `unreadable` rows are under a key that is no longer configured (or were
    altered); they are left untouched and reported."""

    key_id: str
    scanned: int = 0
    rotated: int = 0
    encrypted: int = 0
    unreadable: int = 0
    skipped: int = 0
    tampered: int = 0  # rows that do not match their chained digests: left as they are, never re-bound


def rotate_reasoning_keys(
    *, batch_size: int = ROTATE_BATCH, actor: str = "rotate_reasoning_keys"
) -> RotationReport:
    """Re-encrypt under the newest configured key every row that is not: rows under an older key are
    rotated, legacy plaintext rows are encrypted. Idempotent (a second run finds nothing to do), in
    batches of `batch_size` rows, one transaction per batch. A row purged meanwhile is skipped, never
    given its content back. Each batch writes a `REASONING_REKEYED` event into the chain of every run it
    changed, with the rows' new digests (`audit.write.record_reasoning_change`), and one
    `REASONING_KEYS_ROTATED` governance event (`actor`)."""
    keyring = crypto.keyring()
    prefix = keyring.current_prefix
    report = RotationReport(key_id=keyring.current_kid)
    raw = (
        AgentReasoningAudit.objects.annotate(
            raw_reasoning=Cast("reasoning_content", output_field=models.TextField()),
            raw_assistant=Cast("assistant_text", output_field=models.TextField()),
        )
        .filter(
            (Q(raw_reasoning__isnull=False) & ~Q(raw_reasoning__startswith=prefix))
            | (Q(raw_assistant__isnull=False) & ~Q(raw_assistant__startswith=prefix))
        )
        .order_by("pk")
    )
    last = 0
    while True:
        batch = list(raw.filter(pk__gt=last).values_list("pk", "raw_reasoning", "raw_assistant")[:batch_size])
        if not batch:
            break
        with transaction.atomic():
            changed = []
            matching, tampered = untampered([pk for pk, _, _ in batch])
            report.tampered += tampered
            matching = set(matching)
            for pk, reasoning, assistant in batch:
                last = pk
                report.scanned += 1
                if pk not in matching:
                    continue
                try:
                    new_reasoning, how_r = _reencrypt(keyring, reasoning)
                    new_assistant, how_a = _reencrypt(keyring, assistant)
                except crypto.Undecryptable:
                    report.unreadable += 1
                    continue
                updated = AgentReasoningAudit.objects.filter(pk=pk, purged_at__isnull=True).update(
                    reasoning_content=_stored(new_reasoning), assistant_text=_stored(new_assistant)
                )
                if not updated:
                    report.skipped += 1
                    continue
                changed.append(pk)
                if "plaintext" in (how_r, how_a):
                    report.encrypted += 1
                else:
                    report.rotated += 1
            if changed:
                rows = stored_reasoning_rows(pk__in=changed)
                record = record_governance_event(
                    event_type=GovernanceEventType.REASONING_KEYS_ROTATED,
                    actor=actor,
                    details={
                        "rows": len(changed),
                        "keyId": report.key_id,
                        "runIds": sorted({row["run_id"] for row in rows}),
                    },
                )
                record_reasoning_change(
                    event_type=EventType.REASONING_REKEYED,
                    rows=rows,
                    governance_sequence_no=record.sequence_no,
                )
    logger.info(
        "reasoning keys rotated key=%s scanned=%d rotated=%d encrypted=%d unreadable=%d skipped=%d "
        "tampered=%d",
        report.key_id,
        report.scanned,
        report.rotated,
        report.encrypted,
        report.unreadable,
        report.skipped,
        report.tampered,
    )
    return report


def _reencrypt(keyring: crypto.Keyring, stored: str | None) -> tuple[str | None, str]:
    if stored is None:
        return None, "null"
    if keyring.is_current(stored):
        return stored, "current"
    if not crypto.is_encrypted(stored):
        return keyring.encrypt(stored), "plaintext"
    return keyring.encrypt(keyring.decrypt(stored)), "rotated"


def _stored(value: str | None) -> Ciphertext | None:
    return None if value is None else Ciphertext(value)
