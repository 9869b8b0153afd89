"""A store as the version before write authentication left it, and its upgrade.

The previous version wrote the same bytes as this one except the tag columns (the link hash, the row
digests and the leaf data of before write authentication are unchanged), so a store it wrote is this
one's with every tag blanked; `audit.transparency.adoption.adopt` is what `migrate` then does to it.
Used before any checkpoint of the test (a leaf this version appended would name a write key)."""

from __future__ import annotations

from audit.models import GovernanceEvent, TraceEvent
from audit.transparency import adoption


def recorded_before_write_authentication():
    """Blank every tag (what the previous version stored), then adopt the store as `migrate` does;
    returns the adoption report."""
    TraceEvent.objects.exclude(tag="").update(tag="")
    GovernanceEvent.objects.exclude(tag="").update(tag="")
    return adoption.adopt()
