"""Who and when, for a run's authenticated chain: its decisions against the rights the governance chain
gave, and its times against the signed checkpoints (issue 43, items 3 and 4; `verify_audit`).

A valid write tag proves the service wrote a link; it does not prove the service was right to. So
`verify_audit` also holds every authenticated link to:

* **authority** (`audit.verify.authority`): a review or approval decision by someone who held the right at the
  governance position it recorded; a reasoning purge or re-encryption naming the governance record of
  it; a reasoning purge made while no chained legal hold covered the run (`audit.verify.holds`, by
  positions in the governance chain, never by times written);
* **time** (`CheckpointTimes`): an event a leaf anchors was written before the checkpoint that signed
  the leaf (its time at most the first covering checkpoint's signed time, within
  `AUDIT_CLOCK_TOLERANCE_SECONDS` for the clocks of different processes), and a run's times never go
  back by more than that tolerance along its chain.

`GovernanceView.load()` reads the governance chain once per verification (rights, holds, purges,
adoption); `CheckpointTimes.load()` the checkpoints' sizes and signed times once.
"""

from __future__ import annotations

import bisect
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from audit.models import Checkpoint, EventType
from audit.transparency import leafdata
from audit.verify import authority as rights
from audit.verify.authenticity import Adoption, adoption
from audit.verify.hash_chain import timestamp
from audit.verify.holds import ChainedHold, chained_holds, chained_purges, held_at_problems


@dataclass(slots=True)
class GovernanceView:
    """What one verification reads of the governance chain, read once and shared by every check of
    that verification (runs, log, governance chain): the replayed rights, the chained holds, the
    chained retention purges (run id → (sequence number, time)) and the upgrade's adoption."""

    authority: rights.Authority
    holds: list[ChainedHold] = field(default_factory=list)
    purges: dict[str, tuple[int, dt.datetime]] = field(default_factory=dict)
    adopted: Adoption = field(default_factory=Adoption)

    @classmethod
    def load(cls) -> GovernanceView:
        return cls(rights.current(), chained_holds(), chained_purges(), adoption())


@dataclass(slots=True)
class CheckpointTimes:
    """Each checkpoint's tree size and signed time, in size order."""

    sizes: list[int] = field(default_factory=list)
    signed: list[dt.datetime] = field(default_factory=list)

    @classmethod
    def load(cls) -> CheckpointTimes:
        rows = Checkpoint.objects.order_by("tree_size").values_list("tree_size", "signed_at")
        times = cls()
        for size, signed_at in rows:
            times.sizes.append(size)
            times.signed.append(signed_at)
        return times

    def covering(self, leaf_index: int) -> dt.datetime | None:
        """The signed time of the first checkpoint that covers the leaf (None: none does yet)."""
        i = bisect.bisect_right(self.sizes, leaf_index)
        return self.signed[i] if i < len(self.sizes) else None


def run_problems(
    *,
    run_id: str,
    session_id: str,
    events: Sequence[Any],
    anchors: Sequence[Any],
    view: GovernanceView | None,
    times: CheckpointTimes | None,
) -> list[str]:
    """The authority and time problems of a run's chain (see the module docstring); `anchors`: the run's
    stored leaves (its run leaf and tails)."""
    problems: list[str] = []
    if view is not None and not view.authority.problems:  # an untrusted chain: verify_governance names it
        problems.extend(rights.decision_problems(events, view.authority))
        for event in events:
            d = event.details if isinstance(event.details, dict) else {}
            at = d.get("governanceSequenceNo")
            if event.tag and event.event_type == EventType.REASONING_PURGED and isinstance(at, int):
                problems.extend(
                    held_at_problems(
                        run_id=run_id,
                        session_id=session_id,
                        at_seq=at,
                        holds=view.holds,
                        what=f"sequence {event.sequence_no}: reasoning purged",
                    )
                )
    if times is not None:
        problems.extend(_time_problems(events, anchors, times))
    return problems


def _time_problems(events: Sequence[Any], anchors: Sequence[Any], times: CheckpointTimes) -> list[str]:
    tolerance = dt.timedelta(seconds=float(settings.AUDIT_CLOCK_TOLERANCE_SECONDS))
    problems = []
    bounds: list[tuple[int, int, dt.datetime]] = []  # (anchored sequence, leaf index, signed time)
    for leaf in anchors:
        try:
            fields = leafdata.decode_any(leaf.data)
        except ValueError:
            continue
        signed = times.covering(leaf.leaf_index)
        if signed is not None:
            bounds.append((fields["lastSequenceNo"], leaf.leaf_index, signed))
    bounds.sort()
    previous = None
    for event in events:
        if not event.tag:
            previous = None
            continue
        if previous is not None and event.created_at < previous - tolerance:
            problems.append(f"sequence {event.sequence_no}: written before the link it follows")
        previous = event.created_at
        i = bisect.bisect_left(bounds, (event.sequence_no,))
        if i < len(bounds) and event.created_at > bounds[i][2] + tolerance:
            problems.append(
                f"sequence {event.sequence_no}: written {timestamp(event.created_at)}, after the checkpoint "
                f"that anchored it in log leaf {bounds[i][1]} was signed ({timestamp(bounds[i][2])})"
            )
    return problems
