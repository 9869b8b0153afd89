"""Reads of the identity layer: which sessions and runs a user may see, run lists, a viewer's feedback.

Visibility (API contract, *Authentication*): a user sees the sessions they own; staff (and superusers)
see every session. A run is visible when its session is. Everything here returns `None` or an empty
queryset for what the user may not see, exactly as for what does not exist, so that callers answer both
with the same 404.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import NotSupportedError, connections
from django.db.models import F, Lookup, OuterRef, Q, QuerySet, Subquery

from core.compiled import CompiledQuery
from core.ids import MAX_ID_CHARS, valid_id
from diagnosis.models import AiOpsAlert, ChatSession, DiagnosisRun, RunConfiguration, RunFeedback, RunPurpose

# The one rule that keeps experiment replays out of production reads (the chat's and the API's session
# lists, the dashboard, /metrics, the review queue): a `Q` over the `purpose` column that runs and
# sessions both carry. Experiment runs stay reachable by id (their trace, verification, comparison).
PRODUCTION = Q(purpose=RunPurpose.PRODUCTION)


def production(queryset: QuerySet) -> QuerySet:
    """`queryset` (of runs or sessions) without experiment replays (`PRODUCTION`)."""
    return queryset.filter(PRODUCTION)


class RunResolution:
    """How a trace's run was chosen: named exactly by `runId`, or the session's latest run."""

    EXACT = "EXACT"
    LATEST = "LATEST"


@dataclass(frozen=True, slots=True)
class RunFilters:
    """Filters of the run list; None means "any"."""

    status: str | None = None
    release_decision: str | None = None
    intent: str | None = None
    created_after: dt.datetime | None = None
    created_before: dt.datetime | None = None


@dataclass(frozen=True, slots=True)
class FeedbackView:
    """One user's feedback on a run, as the trace shows it."""

    rating: str
    comment: str
    created_at: dt.datetime


def sees_all_sessions(user: AbstractBaseUser | AnonymousUser) -> bool:
    return bool(user.is_authenticated and user.is_active and (user.is_staff or user.is_superuser))


def visibility(*, user: AbstractBaseUser | AnonymousUser, session_path: str = "") -> Q:
    """The visibility rule as a filter of any model that reaches its session through `session_path`
    ("" for sessions, "session" from a run, "run__session" from a row of a run): nothing for an
    anonymous or inactive user, everything for staff and superusers (`sees_all_sessions`), else the
    user's own sessions. The one home of the rule: the selectors below and every list of things in runs
    (e.g. the approvals waiting, `agent.runtime.approval_queue`) filter with it; `get_visible_run`, a
    compiled query, applies the same `sees_all_sessions` and passes the owner as its parameter."""
    if not user.is_authenticated or not user.is_active:
        return Q(pk__in=[])
    if sees_all_sessions(user):
        return Q()
    return Q(**{f"{session_path}__owner" if session_path else "owner": user})


def visible_sessions(*, user: AbstractBaseUser | AnonymousUser) -> QuerySet[ChatSession]:
    return ChatSession.objects.filter(visibility(user=user))


SESSION_SEARCH_CHARS = 200


def session_list(
    *, user: AbstractBaseUser | AnonymousUser, mine: bool = False, text: str = ""
) -> QuerySet[ChatSession]:
    """Visible sessions, newest first (`(-created_at, -id)`, an index range: `(owner, created_at)` for an
    owner, `(created_at)` for staff), with their stored `run_count` and `last_run_at`; one query per
    page, and one for their owners (by primary key: a join made MariaDB scan and sort the sessions).

    Experiment sessions are never listed (`PRODUCTION`). `mine`: only the user's own sessions (the
    chat's list of conversations, also for staff). `text`: only
    sessions whose title or any of whose questions contains it (case-insensitive; the questions are
    searched among the owner's runs when `mine`, so the scan is bounded by one user's runs)."""
    sessions = production(visible_sessions(user=user))
    if mine:
        sessions = sessions.filter(owner=user) if user.is_authenticated else sessions.none()
    text = " ".join(text.split())[:SESSION_SEARCH_CHARS]
    if text:
        runs = DiagnosisRun.objects.filter(query__icontains=text)
        if mine:
            runs = runs.filter(session__owner=user)
        sessions = sessions.filter(Q(title__icontains=text) | Q(session_id__in=runs.values("session_id")))
    return sessions.prefetch_related("owner").order_by("-created_at", "-id")


def get_visible_session(*, user: AbstractBaseUser | AnonymousUser, session_id: str) -> ChatSession | None:
    if not valid_id(session_id):
        return None
    return visible_sessions(user=user).filter(session_id=session_id).first()


def owned_session(*, user: AbstractBaseUser, session_id: str) -> ChatSession | None:
    """The session `session_id` if `user` owns it (new runs go only into one's own sessions, staff
    included); else None, as for one that does not exist."""
    if not valid_id(session_id):
        return None
    return ChatSession.objects.filter(session_id=session_id, owner=user).first()


def run_list(*, session: ChatSession, filters: RunFilters | None = None) -> QuerySet[DiagnosisRun]:
    """The session's runs, newest first, filtered."""
    return _filtered(DiagnosisRun.objects.filter(session_id=session.session_id), filters)


def visible_runs(
    *, user: AbstractBaseUser | AnonymousUser, filters: RunFilters | None = None
) -> QuerySet[DiagnosisRun]:
    """The production runs of every session the user may see (`visibility`), newest first, filtered as
    `run_list` filters one session's (the record's MCP endpoint searches them, `surfaces.mcp`)."""
    return _filtered(
        production(DiagnosisRun.objects.filter(visibility(user=user, session_path="session"))), filters
    )


def _filtered(qs: QuerySet[DiagnosisRun], filters: RunFilters | None) -> QuerySet[DiagnosisRun]:
    filters = filters or RunFilters()
    if filters.status:
        qs = qs.filter(status=filters.status)
    if filters.release_decision:
        qs = qs.filter(release_decision=filters.release_decision)
    if filters.intent:
        qs = qs.filter(intent=filters.intent)
    if filters.created_after:
        qs = qs.filter(created_at__gte=filters.created_after)
    if filters.created_before:
        qs = qs.filter(created_at__lt=filters.created_before)
    return qs.order_by("-created_at", "-id")


# --------------------------------------------------------------------------------------------------
# Run search (the admin's run list)
# --------------------------------------------------------------------------------------------------
ID_SHAPE = re.compile(rf"^[A-Za-z0-9_-]{{3,{MAX_ID_CHARS}}}$")
WORD = re.compile(r"\w+")
FULLTEXT_MIN_WORD = 3  # InnoDB's innodb_ft_min_token_size (default 3): shorter words are not indexed
RECENT_WINDOW = 20_000
FULLTEXT_SORTED_MAX = 1_000  # more matches than this are not all read and sorted (see `search_runs`)
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]")


class _FullTextMatch(Lookup):
    """`query__ft_match="+word* …"`: `MATCH (query) AGAINST (%s IN BOOLEAN MODE)` on MariaDB/MySQL, as a
    bare condition (a boolean expression compared with `= 1` would not use the FULLTEXT index
    `ft_run_query`). Only `search_runs` uses it, and only on MariaDB/MySQL."""

    lookup_name = "ft_match"

    def as_mysql(self, compiler, connection):
        lhs, lhs_params = self.process_lhs(compiler, connection)
        rhs, rhs_params = self.process_rhs(compiler, connection)
        return f"MATCH ({lhs}) AGAINST ({rhs} IN BOOLEAN MODE)", (*lhs_params, *rhs_params)

    def as_sql(self, compiler, connection):
        raise NotSupportedError("full-text search needs MariaDB/MySQL")


DiagnosisRun._meta.get_field("query").register_lookup(_FullTextMatch)


def search_runs(*, queryset: QuerySet[DiagnosisRun], term: str) -> QuerySet[DiagnosisRun]:
    """`queryset` narrowed to what `term` names, each way on an index:

    1. a run id, or its beginning (`run_id LIKE 'term%'`, a range of the unique index), when one exists;
    2. else a session id or its beginning (the runs' `session_id` index), when one exists;
    3. else the words of the question: on MariaDB/MySQL every word (of at least 3 characters) in the
       FULLTEXT index (`MATCH … AGAINST ('+word …' IN BOOLEAN MODE)`), when they match at most
       `FULLTEXT_SORTED_MAX` runs, among the newest `RECENT_WINDOW` runs and overall (each probed with a
       LIMIT: InnoDB reads every matching row before it can sort them newest first, so a common word
       would read most of the table). Words matching more runs or none in the index (a stopword),
       Chinese, Japanese or Korean text (which
       InnoDB's parser does not cut into words) and words shorter than 3 characters are matched as
       substrings over the newest `RECENT_WINDOW` runs only (a bounded range of the `created_at`
       index, newest first). On SQLite: a substring match (`LIKE`) of every word over every run.

    At most four index probes (exact, then prefix, for runs then sessions) decide between 1, 2 and 3
    when `term` has the shape of an id."""
    term = (term or "").strip()
    if not term:
        return queryset
    if ID_SHAPE.match(term):
        # `istartswith` is `LIKE 'term%'` under the column's case-insensitive collation, a range of the
        # index (Django's `startswith` is `LIKE BINARY`, which MariaDB cannot serve from it); ids are
        # lowercase, so the two find the same rows.
        for lookup in ("run_id", "session__session_id"):
            if DiagnosisRun.objects.filter(**{lookup: term}).exists():
                return queryset.filter(**{lookup: term})
            if DiagnosisRun.objects.filter(**{f"{lookup}__istartswith": term}).exists():
                return queryset.filter(**{f"{lookup}__istartswith": term})
    words = WORD.findall(term)
    if not words:
        return queryset.none()
    substring = Q()
    for word in words:
        substring &= Q(query__icontains=word)
    if connections[queryset.db].vendor != "mysql":
        return queryset.filter(substring)
    boundary = list(
        DiagnosisRun.objects.order_by("-created_at", "-id").values_list("created_at", flat=True)[
            RECENT_WINDOW - 1 : RECENT_WINDOW
        ]
    )
    recent = (
        queryset.filter(substring, created_at__gte=boundary[0]) if boundary else queryset.filter(substring)
    )
    indexed = [w for w in words if len(w) >= FULLTEXT_MIN_WORD and not _CJK.search(w)]
    if indexed and len(indexed) == len(words) and not _more_than(recent, FULLTEXT_SORTED_MAX):
        # Not common among the newest runs: the full-text index, unless the words are common overall
        # (InnoDB gathers every match of a word before the LIMIT, so each probe costs as much).
        matches = queryset.filter(query__ft_match=" ".join(f"+{w}" for w in indexed))
        # Nothing in the index (a stopword, or rows of a transaction not committed yet, which InnoDB's
        # full-text index does not see): the substring matches among the newest runs.
        if _more_than(matches, 0) and not _more_than(matches, FULLTEXT_SORTED_MAX):
            return matches
    return recent


def _more_than(queryset: QuerySet, n: int) -> bool:
    """Whether `queryset` has more than `n` rows, reading at most `n + 1` (no ORDER BY)."""
    return queryset.order_by()[: n + 1].count() > n


def get_visible_run(
    *,
    user: AbstractBaseUser | AnonymousUser,
    session_id: str | None = None,
    run_id: str | None = None,
    with_feedback: bool = False,
    with_session: bool = False,
) -> DiagnosisRun | None:
    """The run the user asks for if they may see it; else None, as for a run that does not exist.

    The one visibility rule of every transport (REST, SSE, WebSocket): the run `run_id` of session
    `session_id`; the session's latest run when `run_id` is None; the run `run_id` in any session when
    `session_id` is None (the WebSocket names runs alone). Ids that are not strings of 1..`MAX_ID_CHARS`
    characters find nothing. One query; with `with_feedback` the viewer's own feedback is annotated onto
    the run (read it with `viewer_feedback`), with `with_session` its session's owner and creation time
    (`session_owner_id`, `session_created_at`: the columns the run's chain binds, which the trace
    verifies) from the session row the query joins anyway to see whose it is."""
    if session_id is None and run_id is None:
        return None
    if (session_id is not None and not valid_id(session_id)) or (run_id is not None and not valid_id(run_id)):
        return None
    if not user.is_authenticated or not user.is_active:
        return None
    owned = not sees_all_sessions(user)
    query = _visible_run_query(session_id is not None, owned, with_feedback, run_id is not None, with_session)
    params: dict[str, Any] = {}
    if session_id is not None:
        params["session_id"] = session_id
    if owned:
        params["owner"] = user.pk
    if with_feedback:
        params["viewer"] = user.pk
    if run_id is not None:
        params["run_id"] = run_id
    rows = query.rows(**params)
    if not rows:
        return None
    names = query.names()
    fields = len(_RUN_ATTNAMES)
    run = DiagnosisRun.from_db("default", _RUN_ATTNAMES, rows[0][:fields])
    for name, value in zip(names[fields:], rows[0][fields:], strict=True):
        setattr(run, name, value)
    return run


_RUN_ATTNAMES = tuple(f.attname for f in DiagnosisRun._meta.concrete_fields)


@functools.cache
def _visible_run_query(
    by_session: bool, owned: bool, with_feedback: bool, by_run: bool, with_session: bool = False
) -> CompiledQuery:
    """`get_visible_run`'s query for one shape of request, compiled once (`core.compiled`): it is
    sent on every trace read and chat frame replay, and building it cost more than running it."""

    def build(
        session_id: str | None = None,
        owner: int | None = None,
        viewer: int | None = None,
        run_id: str | None = None,
    ) -> QuerySet:
        qs = (
            DiagnosisRun.objects.all()
            if session_id is None
            else DiagnosisRun.objects.filter(session_id=session_id)
        )
        if owner is not None:
            qs = qs.filter(session__owner_id=owner)
        if viewer is not None:
            mine = RunFeedback.objects.filter(run_id=OuterRef("run_id"), user_id=viewer)
            qs = qs.annotate(
                viewer_feedback_rating=Subquery(mine.values("rating")[:1]),
                viewer_feedback_comment=Subquery(mine.values("comment")[:1]),
                viewer_feedback_created_at=Subquery(mine.values("created_at")[:1]),
            )
        if with_session:
            qs = qs.annotate(
                session_owner_id=F("session__owner_id"), session_created_at=F("session__created_at")
            )
        if run_id is not None:
            qs = qs.filter(run_id=run_id)
            return (qs if qs.ordered else qs.order_by("pk"))[:1]  # as `.first()`
        return qs.order_by("-created_at", "-id")[:1]

    params: dict[str, type] = {}
    if by_session:
        params["session_id"] = str
    if owned:
        params["owner"] = int
    if with_feedback:
        params["viewer"] = int
    if by_run:
        params["run_id"] = str
    return CompiledQuery(build, **params)


def viewer_feedback(run: DiagnosisRun) -> FeedbackView | None:
    """The feedback annotated by `get_visible_run(with_feedback=True)`, or None."""
    rating = getattr(run, "viewer_feedback_rating", None)
    if rating is None:
        return None
    return FeedbackView(
        rating=rating,
        comment=run.viewer_feedback_comment or "",
        created_at=run.viewer_feedback_created_at,
    )


def get_feedback(*, run_id: str, user: AbstractBaseUser) -> FeedbackView | None:
    """One user's feedback on a run (one query), for callers that did not annotate it."""
    row = RunFeedback.objects.filter(run_id=run_id, user_id=user.pk).values_list(
        "rating", "comment", "created_at"
    )
    found = row.first()
    return FeedbackView(rating=found[0], comment=found[1], created_at=found[2]) if found else None


@dataclass(frozen=True, slots=True)
class ReaderFeedback:
    """One reader's feedback on a run, for the run's page (who, their vote, their comment, when)."""

    username: str
    rating: str
    comment: str
    updated_at: dt.datetime


def all_feedback(*, run_id: str, limit: int = 200) -> list[ReaderFeedback]:
    """Every reader's feedback on a run, newest change first (one query on the run's unique pair index;
    at most `limit`)."""
    rows = (
        RunFeedback.objects.filter(run_id=run_id)
        .order_by("-updated_at", "-id")
        .values_list("user__username", "rating", "comment", "updated_at")[:limit]
    )
    return [ReaderFeedback(username=u or "", rating=r, comment=c, updated_at=t) for u, r, c, t in rows]


def feedback_of(*, run_ids: list[str], user: AbstractBaseUser) -> dict[str, FeedbackView]:
    """One user's feedback on each of `run_ids` that has some (one query), for batched trace reads."""
    return {
        run_id: FeedbackView(rating=rating, comment=comment, created_at=created_at)
        for run_id, rating, comment, created_at in RunFeedback.objects.filter(
            run_id__in=run_ids, user_id=user.pk
        ).values_list("run_id", "rating", "comment", "created_at")
    }


def aiops_analyses(
    *,
    alertname: str | None = None,
    severity: str | None = None,
    status: str | None = None,
    release_decision: str | None = None,
) -> QuerySet[AiOpsAlert]:
    """AI Ops analyses as their alert rows with the run, newest first (one query per page; the alert's
    own indexes serve the order and the `alertname`/`severity` filters). Staff only: callers check."""
    rows = AiOpsAlert.objects.select_related("run")
    if alertname:
        rows = rows.filter(alertname=alertname)
    if severity:
        rows = rows.filter(severity=severity)
    if status:
        rows = rows.filter(run__status=status)
    if release_decision:
        rows = rows.filter(run__release_decision=release_decision)
    return rows.order_by("-created_at", "-id")


# --------------------------------------------------------------------------------------------------
# Run configurations (`RunConfiguration`, keyed by fingerprint)
# --------------------------------------------------------------------------------------------------
FINGERPRINT_SHAPE = re.compile(r"^[0-9a-f]{64}$")


def run_configurations(*, fingerprints) -> dict[str, RunConfiguration]:
    """The stored configurations of `fingerprints` by fingerprint (one query; absent ones left out)."""
    wanted = [f for f in dict.fromkeys(fingerprints) if f and FINGERPRINT_SHAPE.match(f)]
    if not wanted:
        return {}
    return {c.fingerprint: c for c in RunConfiguration.objects.filter(fingerprint__in=wanted)}


def recent_configurations(*, limit: int = 20) -> list[RunConfiguration]:
    """The newest configurations first (the run list's configuration filter)."""
    return list(RunConfiguration.objects.order_by("-created_at", "-id")[:limit])


def runs_matching(
    *,
    review_verdict: str = "",
    created_after: dt.datetime | None = None,
    created_before: dt.datetime | None = None,
    status: str = "",
    release_decision: str = "",
    intent: str = "",
    config_fingerprint: str = "",
) -> QuerySet[DiagnosisRun]:
    """Production runs by the run list's filters (the admin's columns of the same names), oldest first:
    e.g. every run whose latest review says `incorrect` in a month (`make_dataset`)."""
    runs = production(DiagnosisRun.objects.all())
    for column, value in (
        ("review_verdict", review_verdict),
        ("status", status),
        ("release_decision", release_decision),
        ("intent", intent),
        ("config_fingerprint", config_fingerprint),
    ):
        if value:
            runs = runs.filter(**{column: value})
    if created_after is not None:
        runs = runs.filter(created_at__gte=created_after)
    if created_before is not None:
        runs = runs.filter(created_at__lt=created_before)
    return runs.order_by("created_at", "id")
