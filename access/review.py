"""The access review: for each sensitive permission, who could use it during a period, who did, and
which grants went unused (`manage.py access_review`, the admin's *Access review* page, CSV export).

Held during the period is everyone holding it now plus everyone whose hold ended in it by a governance
event, which is complete from the day the governance log exists; used is read from the reasoning access
log and the legal holds; unused is held and never used.
Details: docs/security.md, *5. Access review*.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from dataclasses import dataclass, field

from django.db.models import Count, Max, Min
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from access.selectors import holders_now, sensitive_permissions
from audit.models import HOLD_PERMISSION, GovernanceEvent, LegalHold
from audit.models import GovernanceEventType as T
from reasoning.models import REASONING_PERMISSION, ReasoningAccessLog

DEFAULT_DAYS = 90
_LOSSES = (
    T.GROUP_MEMBER_REMOVED,
    T.PERMISSION_REVOKED,
    T.SUPERUSER_REVOKED,
    T.USER_DEACTIVATED,
    T.GROUP_DELETED,
    T.USER_DELETED,
)


@dataclass(slots=True)
class Use:
    count: int = 0
    first: dt.datetime | None = None
    last: dt.datetime | None = None


@dataclass(slots=True)
class PermissionReview:
    permission: str
    held_now: set[str] = field(default_factory=set)
    held_during: set[str] = field(default_factory=set)
    uses: dict[str, Use] = field(default_factory=dict)

    @property
    def used_by(self) -> set[str]:
        return set(self.uses)

    @property
    def unused(self) -> set[str]:
        return self.held_during - self.used_by

    @property
    def unused_sorted(self) -> list[str]:
        return sorted(self.unused)

    @property
    def table(self) -> list[tuple]:
        """(username, holds it now, uses, first use, last use) of everyone who held or used it."""
        out = []
        for username in sorted(self.held_during | self.used_by):
            use = self.uses.get(username, Use())
            out.append((username, username in self.held_now, use.count, use.first, use.last))
        return out


@dataclass(slots=True)
class AccessReview:
    since: dt.datetime
    until: dt.datetime
    permissions: list[PermissionReview]


def parse_since(value: str | None, *, now: dt.datetime | None = None) -> dt.datetime:
    """An ISO date or datetime (UTC when naive); default: DEFAULT_DAYS days ago. ValueError if invalid."""
    now = now or timezone.now()
    if not value:
        return now - dt.timedelta(days=DEFAULT_DAYS)
    parsed = parse_datetime(value)
    if parsed is None:
        day = parse_date(value)
        if day is None:
            raise ValueError(f"not an ISO date or datetime: {value!r}")
        parsed = dt.datetime.combine(day, dt.time.min)
    if timezone.is_naive(parsed):
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed


def _lost_in_period(permission: str, since: dt.datetime) -> set[str]:
    lost: set[str] = set()
    events = GovernanceEvent.objects.filter(created_at__gte=since, event_type__in=_LOSSES)
    for event in events.iterator():
        if event.event_type == T.GROUP_MEMBER_REMOVED:
            if permission in event.details.get("sensitivePermissions", ()):
                lost.add(event.subject_user)
        elif event.event_type == T.GROUP_DELETED:
            if permission in event.details.get("sensitivePermissions", ()):
                lost.update(event.details.get("members", ()))
        elif event.event_type == T.USER_DELETED:
            held = event.details.get("sensitivePermissions", ())
            if event.details.get("superuser") or permission in held:
                lost.add(event.subject_user)
        elif event.event_type == T.PERMISSION_REVOKED:
            if event.permission != permission:
                continue
            if event.subject_user:
                lost.add(event.subject_user)
            lost.update(event.details.get("members", ()))
        elif event.subject_user:  # superuser revoked, deactivated: every permission
            lost.add(event.subject_user)
    lost.discard("")
    return lost


def _uses(permission: str, since: dt.datetime, until: dt.datetime) -> dict[str, Use]:
    if permission == REASONING_PERMISSION:
        rows = (
            ReasoningAccessLog.objects.filter(accessed_at__gte=since, accessed_at__lte=until)
            .values("username")
            .annotate(n=Count("id"), first=Min("accessed_at"), last=Max("accessed_at"))
        )
        return {r["username"]: Use(r["n"], r["first"], r["last"]) for r in rows}
    if permission == HOLD_PERMISSION:
        uses: dict[str, Use] = {}
        placed = LegalHold.objects.filter(placed_at__gte=since, placed_at__lte=until)
        lifted = LegalHold.objects.filter(lifted_at__gte=since, lifted_at__lte=until)
        events = [
            *placed.values_list("placed_by_username", "placed_at"),
            *lifted.values_list("lifted_by_username", "lifted_at"),
        ]
        for name, at in events:
            use = uses.setdefault(name, Use())
            use.count += 1
            use.first = at if use.first is None else min(use.first, at)
            use.last = at if use.last is None else max(use.last, at)
        return uses
    return {}


def access_review(*, since: dt.datetime, until: dt.datetime | None = None) -> AccessReview:
    until = until or timezone.now()
    reviews = []
    for permission in sensitive_permissions():
        now_holders = holders_now(permission=permission)
        review = PermissionReview(
            permission=permission,
            held_now=now_holders,
            held_during=now_holders | _lost_in_period(permission, since),
            uses=_uses(permission, since, until),
        )
        reviews.append(review)
    return AccessReview(since=since, until=until, permissions=reviews)


CSV_COLUMNS = ("permission", "username", "held_now", "held_during_period", "uses", "first_use", "last_use")


def rows(review: AccessReview) -> list[tuple]:
    out = []
    for p in review.permissions:
        for username in sorted(p.held_during | p.used_by):
            use = p.uses.get(username, Use())
            out.append(
                (
                    p.permission,
                    username,
                    username in p.held_now,
                    username in p.held_during,
                    use.count,
                    use.first.isoformat() if use.first else "",
                    use.last.isoformat() if use.last else "",
                )
            )
    return out


def to_csv(review: AccessReview) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(CSV_COLUMNS)
    writer.writerows(rows(review))
    return buffer.getvalue()
