"""A chunk of runs and their rows read for verification as the trace read reads one run's: attribute bags
of every column (the digests cover every column), no model instances, each query compiled once.

`RowsOfRuns(model, order)` reads the rows of a list of run ids through `core.compiled.CompiledQuery`:
the query is compiled once per number of ids, rounded up to a power of two (the list padded with its
last id, which changes nothing in `run_id IN (…)`), so that a chunk pays neither the ORM's compilation
nor its converters. `runs_of_chunk` reads a chunk's run rows with their recomputed list facts
(`audit.read.list_facts.annotate_recomputed`) as `RunRow`s.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from types import SimpleNamespace
from typing import Any

from django.db.models import QuerySet

from audit.read.list_facts import annotate_recomputed
from core.compiled import CompiledQuery
from diagnosis.models import ChatSession, DiagnosisRun

# The most ids one query names (a longer list is read in several queries: SQLite's variable limit).
MAX_IDS = 512


class RunRow(SimpleNamespace):
    """A run row as stored: every column under its attribute name, `pk`, and the annotations read with
    it (the recomputed list facts); `is_terminal` is the model's own rule."""

    is_terminal = DiagnosisRun.is_terminal


def _arity(n: int) -> int:
    arity = 1
    while arity < n:
        arity *= 2
    return arity


class CompiledIds:
    """`build(ids)`'s query compiled once per arity (`ids`: that many parameters of type `kind`)."""

    def __init__(self, build: Callable[[list[Any]], QuerySet], kind: type = str) -> None:
        self._build = build
        self._kind = kind
        self._queries: dict[int, CompiledQuery] = {}

    def query(self, arity: int) -> CompiledQuery:
        query = self._queries.get(arity)
        if query is None:
            names = [f"id{i}" for i in range(arity)]

            def build(**params: Any) -> QuerySet:
                return self._build([params[n] for n in names])

            query = self._queries[arity] = CompiledQuery(build, **dict.fromkeys(names, self._kind))
        return query

    def rows(self, ids: Iterable[Any]) -> Iterator[tuple[tuple[str, ...], Sequence[Any]]]:
        """The rows for `ids`, converted as `values_list()` converts them, each with its column names."""
        ids = list(ids)
        for at in range(0, len(ids), MAX_IDS):
            part = ids[at : at + MAX_IDS]
            arity = _arity(len(part))
            part.extend(part[-1:] * (arity - len(part)))
            query = self.query(arity)
            names = query.names()
            for row in query.rows(**{f"id{i}": v for i, v in enumerate(part)}):
                yield names, row

    def bags(self, ids: Iterable[Any], bag: type = SimpleNamespace) -> list[Any]:
        """The rows for `ids` as `bag`s, every column under its name."""
        out: list[Any] = []
        for names, row in self.rows(ids):
            item = bag()
            item.__dict__.update(zip(names, row, strict=True))
            out.append(item)
        return out


class RowsOfRuns:
    """The rows of `model` whose `key` column (default `run_id`) is one of a list of ids, in `order`
    (which starts with `key`), as attribute bags of every concrete column and `pk`, grouped by that id."""

    def __init__(self, model: Any, order: Sequence[str], *, key: str = "run_id") -> None:
        self._pk, self._key = model._meta.pk.attname, key
        self._compiled = CompiledIds(lambda ids: model.objects.filter(**{f"{key}__in": ids}).order_by(*order))

    def __call__(self, ids: Sequence[str]) -> dict[str, list[SimpleNamespace]]:
        out: dict[str, list[SimpleNamespace]] = defaultdict(list)
        if not ids:
            return out
        pk, key = self._pk, self._key
        for row in self._compiled.bags(ids):
            attributes = row.__dict__
            attributes["pk"] = attributes[pk]
            out[attributes[key]].append(row)
        return out


class RowsOfSessions:
    """The session rows of a list of session ids, by session id, as attribute bags (`RowsOfRuns`)."""

    def __init__(self) -> None:
        self._rows = RowsOfRuns(ChatSession, ("session_id",), key="session_id")

    def __call__(self, session_ids: Sequence[str]) -> dict[str, SimpleNamespace]:
        return {session_id: rows[0] for session_id, rows in self._rows(session_ids).items()}


def _runs(runs: QuerySet) -> QuerySet:
    return annotate_recomputed(runs).order_by("pk")


_RUNS_BY_PK = CompiledIds(lambda pks: _runs(DiagnosisRun.objects.filter(pk__in=pks)), int)
_RUNS_IN_RANGE = CompiledQuery(
    lambda first, last: _runs(DiagnosisRun.objects.filter(pk__gte=first, pk__lte=last)), first=int, last=int
)


_RUN_PK = DiagnosisRun._meta.pk.attname


def _run_rows(rows: list[RunRow]) -> list[RunRow]:
    for row in rows:
        row.pk = getattr(row, _RUN_PK)
    return rows


def runs_in_range(first: int, last: int) -> list[RunRow]:
    """The runs whose primary key lies in [first, last], in primary-key order, with their recomputed
    list facts (one query)."""
    names = _RUNS_IN_RANGE.names()
    out = []
    for values in _RUNS_IN_RANGE.rows(first=first, last=last):
        row = RunRow()
        row.__dict__.update(zip(names, values, strict=True))
        out.append(row)
    return _run_rows(out)


def runs_with_pks(pks: Sequence[int]) -> list[RunRow]:
    """The runs of the primary keys `pks`, in primary-key order, with their recomputed list facts."""
    if not pks:
        return []
    return _run_rows(_RUNS_BY_PK.bags(sorted(pks), RunRow))  # queries of ascending keys, each in order
