"""A store as the version before write authentication left it, and its upgrade.

The previous version wrote the same bytes as this one except the tag columns (the link hash, the row
digests and the leaf data of before write authentication are unchanged), so a store it wrote is this
one's with every tag blanked; `audit.transparency.adoption.adopt` is what `migrate` then does to it.
Used before any checkpoint of the test (a leaf this version appended would name a write key)."""

from __future__ import annotations

from audit.models import GovernanceEvent, TraceEvent
from audit.transparency import adoption
from diagnosis.models import DiagnosisRun


def recorded_before_write_authentication():
    """Blank every tag (what the previous version stored), then upgrade the store as `migrate` does
    (`audit.0019`: adoption; `access.0004`: the rights baseline); returns the adoption report."""
    from access.baseline import record_baseline

    _untag()
    report = adoption.adopt()
    record_baseline()
    return report


def previous_version_wrote(checkpoint: bool = True) -> None:
    """What the previous version left of everything recorded so far: no tags; with `checkpoint`, its
    checkpointer then anchored every finished run (leaves of before write authentication)."""
    _untag()
    if checkpoint:
        adoption.anchor_legacy()


def _untag() -> None:
    TraceEvent.objects.exclude(tag="").update(tag="")
    GovernanceEvent.objects.exclude(tag="").update(tag="")
    DiagnosisRun.objects.exclude(created_tag="").update(created_tag="")
