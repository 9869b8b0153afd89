"""Reads of reasoning content, on the record: every row of the access log (`reasoning_access_log`) is
bound by the `REASONING_READ` governance event written with it
(`access.reasoning_reads.record_reasoning_read`: the row's id and the digest of its form `reasoning-read`,
`audit.verify.row_digests.READ`), so the governance chain — tagged, anchored — holds every read.
`read_problems` (run by `verify_audit` with the governance chain) names a row deleted (its chained read has no
row: a grant would otherwise read as unused in the access review), a row edited (its digest differs), and a
row no chained read records (forged). Rows of a store upgraded to write authentication that predate it
(`WRITE_AUTH_STARTED`'s `accessLogUpto`) were logged before reads were chained: counted, not failed. Problems
name row ids and sequence numbers only."""

from __future__ import annotations

from audit.models import GovernanceEvent, GovernanceEventType
from audit.verify.authenticity import Adoption, adoption
from audit.verify.row_digests import READ
from reasoning.models import ReasoningAccessLog


def read_problems(adopted: Adoption | None = None) -> tuple[list[str], int]:
    """(problems, rows logged before reads were chained) of the whole access log; `adopted`: the
    upgrade's adoption as the verification read it (read here when not given)."""
    chained: dict[int, tuple[int, str | None]] = {}
    events = GovernanceEvent.objects.filter(event_type=GovernanceEventType.REASONING_READ).order_by(
        "sequence_no"
    )
    for seq, details in events.values_list("sequence_no", "details"):
        details = details if isinstance(details, dict) else {}
        try:
            chained.setdefault(int(details.get("logId")), (seq, details.get("readDigest")))
        except (TypeError, ValueError):
            continue
    before = (adopted or adoption()).access_log_upto
    problems, legacy = [], 0
    for row in ReasoningAccessLog.objects.order_by("pk").iterator(chunk_size=2000):
        record = chained.pop(row.pk, None)
        if record is None:
            if row.pk <= before:
                legacy += 1
            else:
                problems.append(f"reasoning read {row.pk}: no chained REASONING_READ records it")
        elif READ.digest_of(row) != record[1]:
            problems.append(
                f"reasoning read {row.pk}: its row differs from its chained read "
                f"(governance event {record[0]})"
            )
    for log_id, (seq, _) in sorted(chained.items()):
        problems.append(
            f"reasoning read {log_id} (governance event {seq}): its row is missing from the access log"
        )
    return problems, legacy
