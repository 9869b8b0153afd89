"""The recorder's write operations and how they reach the database (record layer; used only by
`audit.write` and `audit.write.group_commit`).

A `WriteOp` is one decision's rows (`Insert`s and `Update`s). `execute(ops)` writes one or several ops in
one transaction on the calling thread's connection and returns only after COMMIT; on MariaDB outside an
atomic block that is one compound statement, one round trip. An op carrying a `Fence` commits only while
the run row holds the writer's lease epoch, checked in the same transaction; a refusal raises
`WriteFenced` and writes nothing. Statements are built from the models' own fields, so a row written
here is the row the ORM would write. Details: docs/architecture.md, *Write operations (`ops.py`)*.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from audit.write.cursor import cursor_for, results_of
from audit.write.table import RawJSON, Table  # noqa: F401  (RawJSON: importers of this module's names)

MAX_ROWS_PER_STATEMENT = 500
# The error number a refused fence raises from the MariaDB compound statement (outside the server's own
# ranges; SQLSTATE 45000 is the user-defined class).
FENCED_ERRNO = 45091


class WriteFenced(DatabaseError):
    """The fenced row no longer holds the writer's epoch (a newer claim took the run): nothing of the op
    was written. A refusal, not a database failure."""


@dataclass(slots=True)
class Insert:
    """One row: `values` in `table.columns` order. `want_id`: the new primary key is needed (`id`)."""

    table: Table
    values: tuple
    want_id: bool = False
    id: int | None = None


@dataclass(slots=True)
class Update:
    """`UPDATE table SET columns = values WHERE where-columns = where-values`; when it matches no row and
    `fallback` is given, that row is inserted instead (in the same transaction)."""

    table: Table
    columns: tuple[str, ...]
    values: tuple
    where: tuple[str, ...]
    where_values: tuple
    fallback: Insert | None = None


@dataclass(frozen=True, slots=True)
class Fence:
    """The op commits only while `table`'s row `key_column = key` has `epoch_column = epoch`."""

    table: Table
    key_column: str
    key: Any
    epoch_column: str
    epoch: int

    def select_sql(self, connection: BaseDatabaseWrapper, *, lock: bool) -> str:
        qn = connection.ops.quote_name
        t = self.table
        sql = (
            f"SELECT {qn(t.column(self.epoch_column))} FROM {qn(t.db_table)} "  # noqa: S608
            f"WHERE {qn(t.column(self.key_column))} = %s"
        )
        return sql + " FOR UPDATE" if lock else sql

    def exists_sql(self, connection: BaseDatabaseWrapper) -> str:
        """`EXISTS (…)` true while the row holds the epoch; params: key, epoch."""
        qn = connection.ops.quote_name
        t = self.table
        lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
        return (
            f"EXISTS (SELECT 1 FROM {qn(t.db_table)} WHERE {qn(t.column(self.key_column))} = %s "  # noqa: S608
            f"AND {qn(t.column(self.epoch_column))} = %s{lock})"
        )

    def guards(self, table: Table, where: tuple[str, ...], where_values: tuple) -> bool:
        """Whether an UPDATE of `table` by `where` targets exactly the fenced row."""
        return table is self.table and where == (self.key_column,) and where_values == (self.key,)


@dataclass(slots=True, eq=False)
class WriteOp:
    """One decision's rows, written together or not at all. `error` is set when they were not.
    `fence`: the lease epoch the rows are conditional on (see the module docstring)."""

    inserts: list[Insert] = field(default_factory=list)
    updates: list[Update] = field(default_factory=list)
    error: BaseException | None = None
    fence: Fence | None = None
    # Statements (SQL with `%s` parameters) run after the rows, in the same transaction: an update
    # derived from what the op wrote (the run's stored list facts, `audit.read.list_facts.fact_update_sql`).
    after: list[tuple[str, tuple]] = field(default_factory=list)


def _grouped(ops: Sequence[WriteOp]) -> tuple[dict[Table, list[Insert]], list[Update]]:
    """INSERT rows per table (tables in order of first appearance) and the UPDATEs in a stable order of
    (table, key), so that two batches never lock the same rows in opposite orders."""
    by_table: dict[Table, list[Insert]] = {}
    for op in ops:
        for row in op.inserts:
            by_table.setdefault(row.table, []).append(row)
    updates = [u for op in ops for u in op.updates]
    if len(updates) > 1:
        updates.sort(key=lambda u: (u.table.db_table, tuple(str(v) for v in u.where_values)))
    return by_table, updates


def _chunks(rows: list[Insert]) -> Iterable[list[Insert]]:
    for start in range(0, len(rows), MAX_ROWS_PER_STATEMENT):
        yield rows[start : start + MAX_ROWS_PER_STATEMENT]


def execute(ops: Sequence[WriteOp], connection: BaseDatabaseWrapper) -> None:
    """Write `ops` in one transaction on `connection` (see the module docstring); raises the database
    error, after rolling back, when anything failed. Sets the ids asked for only once committed.

    `connection` may be `django.db.connection`: it is resolved once to this thread's wrapper, so that
    the dozens of attribute reads below do not each go through the proxy's context-local lookup."""
    if not isinstance(connection, BaseDatabaseWrapper):
        connection = connections[connection.alias]
    by_table, updates = _grouped(ops)
    fences = _fences(ops)
    after = [statement for op in ops for statement in op.after]
    single = len(by_table) + len(updates) == 1 and not after and not any(u.fallback for u in updates)
    # A fenced single statement carries its guard: an INSERT, or an UPDATE of the fenced row itself.
    guarded = not fences or (len(fences) == 1 and (bool(by_table) or _guards_any(fences[0], updates)))
    if (
        single
        and guarded
        and not any(len(rows) > 1 and any(r.want_id for r in rows) for rows in by_table.values())
    ):
        # One statement is atomic by itself (in autocommit mode it is its own transaction).
        _apply(by_table, updates, connection, fences)
        return
    if connection.in_atomic_block or connection.execute_wrappers or connection.vendor != "mysql":
        # A savepoint in the caller's transaction; or, while execute wrappers are installed
        # (instrumentation, fault injection), Django's own transaction so that the wrappers see each
        # statement and nothing else, exactly as with `atomic()`; or SQLite.
        with transaction.atomic(using=connection.alias):
            _apply(by_table, updates, connection, fences, after)
    elif connection.mysql_is_mariadb:
        _apply_compound(by_table, updates, connection, fences, after)
    else:
        _apply_begin_commit(by_table, updates, connection, fences, after)


def _guards_any(fence: Fence, updates: Sequence[Update]) -> bool:
    return any(fence.guards(u.table, u.where, u.where_values) for u in updates)


def _fences(ops: Sequence[WriteOp]) -> list[Fence]:
    """The ops' distinct fences in key order (two batches lock the fenced rows in the same order)."""
    found = {op.fence for op in ops if op.fence is not None}
    return sorted(found, key=lambda f: (f.table.db_table, str(f.key), f.epoch))


def _check_fences(fences: Sequence[Fence], connection) -> None:
    """Inside the transaction: lock each fenced row (MySQL) and compare its epoch; raise WriteFenced."""
    if not fences:
        return
    lock = connection.features.has_select_for_update
    with connection.cursor() as cursor:
        for fence in fences:
            cursor.execute(fence.select_sql(connection, lock=lock), [fence.key])
            row = cursor.fetchone()
            if row is None or row[0] != fence.epoch:
                raise WriteFenced(FENCED_ERRNO, "fenced")


def _apply(
    by_table: dict[Table, list[Insert]],
    updates: list[Update],
    connection,
    fences: Sequence[Fence] = (),
    after: Sequence[tuple[str, tuple]] = (),
) -> None:
    """One statement per table and per UPDATE, in the caller's transaction (or autocommit). With one
    fence (one recorder's op), the first INSERT is guarded by it and every UPDATE of the fenced row too;
    a guarded statement that writes fewer rows than given raises WriteFenced (the caller's transaction
    then rolls back). Several fences (a batch of several runs' ops), or an op none of whose statements
    can carry its guard, are checked by `_check_fences`: first on MySQL (the fenced rows locked in key
    order, as every writer locks them), last on SQLite (once the transaction holds the write lock)."""
    ids: list[tuple[Insert, int]] = []
    guard = _Guard(fences, connection) if len(fences) == 1 else None
    check = len(fences) > 1 or (bool(fences) and not by_table and not _guards_any(fences[0], updates))
    check_first = check and connection.vendor != "sqlite"
    if check_first:
        _check_fences(fences, connection)
    with cursor_for(connection) as cursor:
        for table, rows in by_table.items():
            _insert_rows(cursor, connection, table, rows, ids, guard)
            guard = None if guard is None else guard.spent()
        for upd in updates:
            fence = guard.fence_of(upd) if guard is not None else None
            params = upd.table.prep_columns(connection, upd.columns, upd.values)
            params += upd.table.prep_columns(connection, upd.where, upd.where_values)
            sql = upd.table.update_sql(connection, upd.columns, upd.where)
            if fence is not None:
                qn = connection.ops.quote_name
                sql += f" AND {qn(fence.table.column(fence.epoch_column))} = %s"
                params.append(fence.epoch)
            cursor.execute(sql, params)
            if fence is not None and not cursor.rowcount:
                raise WriteFenced(FENCED_ERRNO, "fenced")
            if not cursor.rowcount and upd.fallback is not None:
                _insert_rows(cursor, connection, upd.fallback.table, [upd.fallback], ids)
        for sql, params in after:
            cursor.execute(sql, params)
    if check and not check_first:
        _check_fences(fences, connection)
    for row, pk in ids:
        row.id = pk


class _Guard:
    """The fence of one `_apply`: the condition for its first INSERT, then only the UPDATE guard of the
    fenced row (the first guarded statement has taken the fenced row's lock for the transaction)."""

    def __init__(self, fences: Sequence[Fence], connection, *, insert: bool = True) -> None:
        self.fences = list(fences)
        self.connection = connection
        self.insert = insert

    def condition(self) -> tuple[str, list[Any]] | None:
        if not self.insert:
            return None
        sql = " AND ".join(f.exists_sql(self.connection) for f in self.fences)
        params: list[Any] = []
        for f in self.fences:
            params.extend((f.key, f.epoch))
        return sql, params

    def spent(self) -> _Guard:
        return _Guard(self.fences, self.connection, insert=False)

    def fence_of(self, upd: Update) -> Fence | None:
        return next((f for f in self.fences if f.guards(upd.table, upd.where, upd.where_values)), None)


def _apply_begin_commit(by_table, updates, connection, fences=(), after=()) -> None:
    """MySQL: START TRANSACTION … COMMIT on a connection left in autocommit mode."""
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("START TRANSACTION")
        try:
            _apply(by_table, updates, connection, fences, after)
            cursor.execute("COMMIT")
        except BaseException:
            try:
                cursor.execute("ROLLBACK")
            except Exception:  # the connection is gone; the server rolled back
                connection.close_if_unusable_or_obsolete()
            raise


# MariaDB runs a compound statement outside stored programs: the whole transaction, its rollback on any
# error (re-raised with its own error code) and its COMMIT travel in one round trip.
_COMPOUND_HEAD = (
    "BEGIN NOT ATOMIC DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END; "
    "START TRANSACTION; "
)
_COMPOUND_TAIL = "COMMIT; END"
_COMPOUND_FENCE = (
    "IF NOT (({select}) <=> %s) THEN "
    f"SIGNAL SQLSTATE '45000' SET MYSQL_ERRNO = {FENCED_ERRNO}, MESSAGE_TEXT = 'fenced'; END IF; "
)


def _compound_fence_checks(fences: Sequence[Fence], connection) -> list[tuple[str, list[Any], Any]]:
    """The compound statement's fence checks: `(scalar SELECT, its params, the value it must equal)`.

    One fence: its row's epoch, locked. Several fences on the same table and key column (a batch of
    many runs' ops): **one** locking count over all their rows, `key IN (…)` through the key's unique
    index (so the rows are locked in index order, as every writer locks them) and `(key, epoch) IN
    (…)`, which must equal the number of fences; a batch with a stale op is refused whole and retried
    op by op by its caller, as with one check per fence."""
    if len(fences) > 1 and len({(f.table, f.key_column, f.epoch_column) for f in fences}) == 1:
        qn = connection.ops.quote_name
        t, first = fences[0].table, fences[0]
        key, epoch = qn(t.column(first.key_column)), qn(t.column(first.epoch_column))
        keys = ", ".join(["%s"] * len(fences))
        pairs = ", ".join(["(%s, %s)"] * len(fences))
        select = (
            f"SELECT COUNT(*) FROM {qn(t.db_table)} WHERE {key} IN ({keys}) "  # noqa: S608
            f"AND ({key}, {epoch}) IN ({pairs}) FOR UPDATE"
        )
        params: list[Any] = [f.key for f in fences]
        for f in fences:
            params.extend((f.key, f.epoch))
        return [(select, params, len(fences))]
    return [(f.select_sql(connection, lock=True), [f.key], f.epoch) for f in fences]


def _apply_compound(by_table, updates, connection, fences=(), after=()) -> None:
    """MariaDB outside any atomic block: every statement of the transaction in one compound statement.
    Rows whose ids are wanted come back from `INSERT … RETURNING` result sets, read in order."""
    parts: list[str] = [_COMPOUND_HEAD]
    params: list[Any] = []
    for select, select_params, expected in _compound_fence_checks(fences, connection):
        parts.append(_COMPOUND_FENCE.format(select=select))
        params.extend((*select_params, expected))
    returning: list[list[Insert]] = []
    for table, rows in by_table.items():
        want = any(r.want_id for r in rows)
        for chunk in _chunks(rows):
            parts.append(table.insert_sql(connection, len(chunk), want))
            parts.append("; ")
            for row in chunk:
                params.extend(table.prep(connection, row.values))
            if want:
                returning.append(chunk)
    for upd in updates:
        parts.append(upd.table.update_sql(connection, upd.columns, upd.where))
        parts.append("; ")
        params.extend(upd.table.prep_columns(connection, upd.columns, upd.values))
        params.extend(upd.table.prep_columns(connection, upd.where, upd.where_values))
        if upd.fallback is not None:
            fb = upd.fallback
            parts.append("IF ROW_COUNT() = 0 THEN ")
            parts.append(fb.table.insert_sql(connection, 1, False))
            parts.append("; END IF; ")
            params.extend(fb.table.prep(connection, fb.values))
    for sql, statement_params in after:
        parts.append(sql)
        parts.append("; ")
        params.extend(statement_params)
    parts.append(_COMPOUND_TAIL)
    try:
        sets = results_of(connection, "".join(parts), params)
    except DatabaseError as exc:
        if fences and exc.args and exc.args[0] == FENCED_ERRNO:
            raise WriteFenced(FENCED_ERRNO, "fenced") from exc
        raise
    results = [s for s in sets if s]
    if len(results) != len(returning):
        raise RuntimeError("unexpected result sets from the compound write")
    for chunk, rows in zip(returning, results, strict=True):
        for row, (pk,) in zip(chunk, rows, strict=True):
            row.id = pk


def _insert_rows(cursor, connection, table: Table, rows: list[Insert], ids: list, guard=None) -> None:
    need_ids = any(r.want_id for r in rows)
    returning = need_ids and len(rows) > 1 and connection.features.can_return_rows_from_bulk_insert
    if need_ids and len(rows) > 1 and not returning:
        for row in rows:
            _insert_rows(cursor, connection, table, [row], ids, guard)
            guard = None if guard is None else guard.spent()
        return
    for chunk in _chunks(rows):
        params: list[Any] = []
        condition = guard.condition() if guard is not None else None
        guard = None
        if condition is None:
            for row in chunk:
                params.extend(table.prep(connection, row.values))
            cursor.execute(table.insert_sql(connection, len(chunk), returning), params)
        else:
            guard_sql, guard_params = condition
            for row in chunk:
                params.extend(table.prep(connection, row.values))
                params.extend(guard_params)
            cursor.execute(table.guarded_insert_sql(connection, len(chunk), returning, guard_sql), params)
        if returning:
            got = cursor.fetchall()
            if condition is not None and len(got) != len(chunk):
                raise WriteFenced(FENCED_ERRNO, "fenced")
            for row, (pk,) in zip(chunk, got, strict=True):
                ids.append((row, pk))
        else:
            if condition is not None and cursor.rowcount != len(chunk):
                raise WriteFenced(FENCED_ERRNO, "fenced")
            if need_ids:
                ids.append((chunk[0], cursor.lastrowid))
