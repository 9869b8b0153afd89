"""Authority from the chain: who held which sensitive permission at each point of the governance chain.

The permission tables say who may do what *now*, and a database writer can change them without a trace;
replaying the tagged governance chain says who held a permission at any point of it, whatever the tables
say. `Authority.held(user, permission, at)` answers for any point (`verify_audit`, for appended decisions
and holds); `permitted` asks the database *and* the chain at the head before a service acts. Someone the
chain never names holds nothing. One replay per governance head and process (cached).
Details: docs/audit-integrity.md, *Write authentication* (authority from the chain).
"""

from __future__ import annotations

import bisect
import functools
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from audit.models import HOLD_PERMISSION, REVIEW_PERMISSION, GovernanceEvent
from audit.models import GovernanceEventType as T
from audit.verify.hash_chain import GENESIS_HASH
from core import writeauth
from diagnosis.models import APPROVE_PERMISSION

logger = logging.getLogger(__name__)

RIGHTS_EVENTS = (
    T.GROUP_MEMBER_ADDED,
    T.GROUP_MEMBER_REMOVED,
    T.PERMISSION_GRANTED,
    T.PERMISSION_REVOKED,
    T.SUPERUSER_GRANTED,
    T.SUPERUSER_REVOKED,
    T.USER_DEACTIVATED,
    T.USER_REACTIVATED,
    T.GROUP_DELETED,
    T.USER_DELETED,
    T.RIGHTS_BASELINE,
)
SUPERUSER = "*"  # in an effective set: every permission
# Governance events a run's appended event must name (`governanceSequenceNo`), by the run event's type.
RECORD_OF = {
    "REASONING_PURGED": T.REASONING_ROWS_PURGED,
    "REASONING_REKEYED": T.REASONING_KEYS_ROTATED,
}
RECORD_EVENTS = frozenset(RECORD_OF.values())
# The appended decisions of a run and the right each needs: (details key naming the actor, permission).
DECISION_RIGHTS = {
    "REVIEW_RECORDED": ("reviewer", REVIEW_PERMISSION),
    "APPROVAL_DECIDED": ("decidedBy", APPROVE_PERMISSION),
}
# Governance events whose actor needs a right at that point of the chain.
GOVERNANCE_RIGHTS = {T.LEGAL_HOLD_PLACED: HOLD_PERMISSION, T.LEGAL_HOLD_LIFTED: HOLD_PERMISSION}


@dataclass(slots=True)
class _User:
    superuser: bool = False
    active: bool = True
    permissions: set[str] = field(default_factory=set)
    groups: set[str] = field(default_factory=set)


@dataclass(slots=True)
class Authority:
    """The replayed rights: per user, the effective permission sets in chain order. `head` is the
    sequence number of the newest governance event replayed; `problems` why the stored chain cannot be
    trusted (then nobody holds anything: fail-closed)."""

    head: int = 0
    problems: list[str] = field(default_factory=list)
    # The governance records that appended run events name (`governanceSequenceNo`): their sequence
    # number → (event type, the run ids they name).
    records: dict[int, tuple[str, frozenset[str]]] = field(default_factory=dict)
    _at: dict[str, list[int]] = field(default_factory=dict)
    _sets: dict[str, list[frozenset[str]]] = field(default_factory=dict)

    def held(self, username: str, permission: str, at: int | None = None) -> bool:
        """Whether `username` held `permission` once the governance chain reached event `at` (None: its
        head)."""
        if self.problems:
            return False
        effective = self.rights(username, at)
        return SUPERUSER in effective or permission in effective

    def rights(self, username: str, at: int | None = None) -> frozenset[str]:
        at = self.head if at is None else at
        points = self._at.get(username)
        if not points:
            return frozenset()
        i = bisect.bisect_right(points, at) - 1
        return self._sets[username][i] if i >= 0 else frozenset()

    def _record(self, username: str, seq: int, effective: frozenset[str]) -> None:
        points = self._at.setdefault(username, [])
        sets = self._sets.setdefault(username, [])
        if sets and sets[-1] == effective:
            return
        if points and points[-1] == seq:
            sets[-1] = effective
            return
        points.append(seq)
        sets.append(effective)


def replay(events: Iterable[Any]) -> Authority:
    """The rights the governance `events` (in sequence order, any types) grant over time."""
    authority = Authority()
    users: dict[str, _User] = {}
    groups: dict[str, set[str]] = {}

    def effective(name: str) -> frozenset[str]:
        user = users.get(name)
        if user is None or not user.active:
            return frozenset()
        if user.superuser:
            return frozenset({SUPERUSER})
        held = set(user.permissions)
        for group in user.groups:
            held |= groups.get(group, set())
        return frozenset(held)

    for event in events:
        authority.head = max(authority.head, event.sequence_no)
        if event.event_type in RECORD_EVENTS:
            d = event.details if isinstance(event.details, dict) else {}
            runs = frozenset(str(r) for r in d.get("runIds") or ())
            authority.records[event.sequence_no] = (event.event_type, runs)
        if event.event_type not in RIGHTS_EVENTS:
            continue
        touched = _apply(event, users, groups)
        for name in touched:
            authority._record(name, event.sequence_no, effective(name))
    return authority


def _apply(event: Any, users: dict[str, _User], groups: dict[str, set[str]]) -> set[str]:
    """Apply one event; returns the usernames whose effective rights may have changed."""
    d = event.details if isinstance(event.details, dict) else {}
    kind, who, group, permission = event.event_type, event.subject_user, event.group, event.permission
    if kind == T.RIGHTS_BASELINE:
        before = set(users)
        users.clear()
        groups.clear()
        for name, perms in (d.get("groups") or {}).items():
            groups[str(name)] = {str(p) for p in perms or ()}
        for name, rights in (d.get("users") or {}).items():
            rights = rights if isinstance(rights, dict) else {}
            users[str(name)] = _User(
                superuser=bool(rights.get("superuser")),
                active=bool(rights.get("active", True)),
                permissions={str(p) for p in rights.get("permissions") or ()},
                groups={str(g) for g in rights.get("groups") or ()},
            )
        return before | set(users)
    if kind in (T.GROUP_MEMBER_ADDED, T.GROUP_MEMBER_REMOVED) and who and group:
        groups.setdefault(group, set())
        user = users.setdefault(who, _User())
        (user.groups.add if kind == T.GROUP_MEMBER_ADDED else user.groups.discard)(group)
        return {who}
    if kind in (T.PERMISSION_GRANTED, T.PERMISSION_REVOKED) and permission:
        granted = kind == T.PERMISSION_GRANTED
        if d.get("via") == "group" or (group and not who):
            perms = groups.setdefault(group, set())
            (perms.add if granted else perms.discard)(permission)
            members = {str(m) for m in d.get("members") or ()}
            for member in members:  # the group's members then (a group followed from this grant on)
                users.setdefault(member, _User()).groups.add(group)
            return members | {n for n, u in users.items() if group in u.groups}
        if who:
            perms = users.setdefault(who, _User()).permissions
            (perms.add if granted else perms.discard)(permission)
            return {who}
        return set()
    if kind in (T.SUPERUSER_GRANTED, T.SUPERUSER_REVOKED) and who:
        users.setdefault(who, _User()).superuser = kind == T.SUPERUSER_GRANTED
        return {who}
    if kind in (T.USER_DEACTIVATED, T.USER_REACTIVATED) and who:
        users.setdefault(who, _User()).active = kind == T.USER_REACTIVATED
        return {who}
    if kind == T.GROUP_DELETED and group:
        groups.pop(group, None)
        members = {n for n, u in users.items() if group in u.groups}
        for name in members:
            users[name].groups.discard(group)
        return members
    if kind == T.USER_DELETED and who:
        users.pop(who, None)  # a later account of the same name starts with nothing
        return {who}
    return set()


# --------------------------------------------------------------------------------------------------
# The store
# --------------------------------------------------------------------------------------------------
def current() -> Authority:
    """The replay of the stored governance chain up to its head (cached per head)."""
    head = GovernanceEvent.objects.order_by("-sequence_no").values_list("sequence_no", "hash").first()
    return _replayed(head or (0, ""))


@functools.lru_cache(maxsize=4)
def _replayed(head: tuple[int, str]) -> Authority:
    """The replay of the stored chain up to `head`, trusted only when every event links to the one
    before, hashes to its content and carries a valid write tag (untagged only where the upgrade
    adopted the chain): the service never takes a right from an event it did not write."""
    from audit.verify.authenticity import adoption, tag_verdict
    from audit.write.governance import governance_hash

    events = list(GovernanceEvent.objects.filter(sequence_no__lte=head[0]).order_by("sequence_no"))
    authority = replay(events)
    authority.head = head[0]
    prev, expected = GENESIS_HASH, 1
    for event in events:
        if event.sequence_no != expected or event.prev_hash != prev or governance_hash(event) != event.hash:
            authority.problems.append(f"governance event {event.sequence_no}: the chain does not verify")
            break
        prev, expected = event.hash, expected + 1
    verdict = tag_verdict(
        events,
        domain=writeauth.GOVERNANCE,
        adopted_upto=lambda: adoption().governance_upto,
        what="governance event",
    )
    authority.problems.extend(verdict.problems)
    if authority.problems:
        logger.error(
            "governance chain does not authenticate: no right is taken from it (%d problem(s))",
            len(authority.problems),
        )
    return authority


def permitted(user: Any, permission: str) -> bool:
    """Whether `user` may use `permission` now: the database says so (active, `has_perm`) and so does
    the governance chain (`current()`), so that a right a database writer gave outside the application
    confers nothing."""
    if not (user is not None and user.is_active and user.has_perm(permission)):
        return False
    return current().held(user.get_username(), permission)


def governance_position() -> int:
    """The governance chain's head now: what an appended decision records as `governanceAt`."""
    return GovernanceEvent.objects.order_by("-sequence_no").values_list("sequence_no", flat=True).first() or 0


# --------------------------------------------------------------------------------------------------
# Verification: each authenticated decision against the rights of its point in the chain
# --------------------------------------------------------------------------------------------------
def decision_problems(events: Iterable[Any], authority: Authority) -> list[str]:
    """The problems of a run's authenticated (tagged) events that need authority: a review or an
    approval decision whose actor did not hold the right at the governance position it recorded
    (`governanceAt`), and a reasoning purge or re-encryption that names no governance record of its
    kind naming the run (`governanceSequenceNo`). Links of before write authentication are vouched
    for by the log and judged by nothing newer. Names sequence numbers, actors and permissions only."""
    problems = []
    for event in events:
        if not event.tag:
            continue
        d = event.details if isinstance(event.details, dict) else {}
        kind, seq = event.event_type, event.sequence_no
        if kind in DECISION_RIGHTS:
            key, permission = DECISION_RIGHTS[kind]
            actor = d.get(key)
            if not actor:
                continue  # the system's own decision (an expiry)
            at = d.get("governanceAt")
            if not isinstance(at, int) or isinstance(at, bool) or not 0 <= at <= authority.head:
                problems.append(f"sequence {seq}: {_label(kind)} by {actor} names no governance position")
            elif not authority.held(str(actor), permission, at):
                problems.append(
                    f"sequence {seq}: {_label(kind)} by {actor}, who did not hold {permission} at governance "
                    f"event {at}"
                )
        elif kind in RECORD_OF:
            record = authority.records.get(d.get("governanceSequenceNo"))
            if record is None or record[0] != RECORD_OF[kind] or event.run_id not in record[1]:
                problems.append(
                    f"sequence {seq}: {_label(kind)} without a governance record of it "
                    f"({RECORD_OF[kind]} naming the run)"
                )
    return problems


def governance_problems(events: Iterable[Any], authority: Authority) -> list[str]:
    """The authenticated governance events whose actor needed a right (legal holds placed and lifted)
    and did not hold it just before the event."""
    problems = []
    for event in events:
        permission = GOVERNANCE_RIGHTS.get(event.event_type)
        if permission is None or not event.tag:
            continue
        if not authority.held(event.actor, permission, event.sequence_no - 1):
            problems.append(
                f"governance event {event.sequence_no}: {event.event_type} by {event.actor or 'nobody'}, who "
                f"did not hold {permission} then"
            )
    return problems


def _label(kind: str) -> str:
    from audit.events import label

    return label(kind).lower()
