"""Incremental verification (`verify_audit` without `--all`): what changed since a verification whose
state the operator keeps outside the database — the newest checkpoint it verified (the signed note) and
each audited table's watermark (highest id, row count up to it), the whole signed by the log's key.
`state_problems` holds a state file to the keys and the database; `changed_run_ids` names the runs to
verify again. Details: docs/audit-integrity.md, *Incremental verification*.
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from django.db import connections
from django.db.models import Min

from audit.models import Checkpoint, LogHead, LogLeaf, TailPending
from audit.transparency import keys, note
from audit.transparency.checkpoints import WitnessEntry, witness_problems
from audit.transparency.verify import Since
from audit.verify import coverage, parallel
from core.db_router import read_alias
from diagnosis.models import DiagnosisRun

FORMAT = "diagnosis-audit/verify-state/v1"
_SIGNED = b"diagnosis-audit/verify-state/v1\n"  # never the first line of a checkpoint note
# Rewritten or emptied by the service itself: no watermark (a deleted tail note is named by its run).
QUEUES = (LogHead, TailPending)


class StateError(ValueError):
    """A state file that cannot be read as one (named, and the verification is a full one)."""


@dataclass
class State:
    checkpoint_body: str
    checkpoint_signature: str
    watermarks: dict[str, list[int]] = field(default_factory=dict)  # table -> [max id, rows up to it]
    verified_at: str = ""
    checkpoint_link: str = ""  # the checkpoint's signed link (time, predecessor), when it has one
    checkpoint_link_signature: str = ""
    # Every run row below this primary key was anchored when the state was written (`unanchored_from`);
    # 0 in a state written before the field: every run is searched.
    unanchored_from: int = 0

    def payload(self) -> dict[str, Any]:
        return {
            "unanchoredFrom": self.unanchored_from,
            "format": FORMAT,
            "checkpoint": {
                "body": self.checkpoint_body,
                "signature": self.checkpoint_signature,
                "link": self.checkpoint_link,
                "linkSignature": self.checkpoint_link_signature,
            },
            "watermarks": self.watermarks,
            "verifiedAt": self.verified_at,
        }


def _message(payload: dict[str, Any]) -> bytes:
    return _SIGNED + note.canonical(payload).encode("utf-8")


def write_state(path: str, state: State) -> None:
    """Write `state` signed by the log's newest key, atomically (a crash leaves the old file)."""
    payload = state.payload()
    key = keys.current_key()
    signature = base64.b64encode(key.private.sign(_message(payload))).decode("ascii")
    document = {**payload, "keyId": key.key_id, "signature": signature}
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".verify-state-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=1, sort_keys=True)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_state(path: str) -> State:
    """The state file at `path`, its signature verified against the log's keys (`StateError` else)."""
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
        # A state written before `unanchoredFrom` was signed without it; one written since, with it (so
        # the key cannot be removed from one, nor added to an older one, without the signature failing).
        signed = ("format", "checkpoint", "watermarks", "verifiedAt")
        payload = {
            k: document[k] for k in (*signed, *(("unanchoredFrom",) if "unanchoredFrom" in document else ()))
        }
        signature = base64.b64decode(document["signature"], validate=True)
        key_id = str(document["keyId"])
        cp = payload["checkpoint"]
        state = State(
            str(cp["body"]),
            str(cp["signature"]),
            dict(payload["watermarks"]),
            str(payload["verifiedAt"]),
            str(cp.get("link", "")),
            str(cp.get("linkSignature", "")),
            int(payload.get("unanchoredFrom", 0)),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise StateError(f"not a verification state file ({type(exc).__name__})") from exc
    if payload["format"] != FORMAT:
        raise StateError(f"unknown state format {payload['format']!r}")
    public = keys.verification_keys().get(key_id)
    if public is None:
        raise StateError(f"signed by unknown key {key_id[:16]}")
    try:
        public.verify(signature, _message(payload))
    except Exception as exc:  # cryptography's InvalidSignature
        raise StateError("its signature does not verify (the file was edited or forged)") from exc
    return state


def since_of(
    body: str, signature: str, link: str = "", link_signature: str = ""
) -> tuple[Since | None, list[str]]:
    """The verified checkpoint a state (or `--since`) names, held to the log's keys and to the database:
    its note (and signed link) must verify, and the database must still hold that very checkpoint.
    (None, problems) else."""
    entry = WitnessEntry(0, body, signature, link, link_signature)
    problems, bodies = witness_problems([entry], keys.verification_keys())
    if problems or not bodies:
        return None, [p.replace("witness line 0", "the verified checkpoint") for p in problems]
    parsed = bodies[0][1]
    stored = Checkpoint.objects.filter(tree_size=parsed.tree_size).first()
    if stored is None:
        return None, [f"the verified checkpoint tree_size={parsed.tree_size} is missing from the database"]
    if (stored.body, stored.link) != (body, link):
        return None, [f"the verified checkpoint tree_size={parsed.tree_size} differs in the database"]
    return Since(parsed.tree_size, parsed.root_hash, stored.checkpoint_hash), []


def stored_since(tree_size: int) -> tuple[Since | None, list[str], State | None]:
    """`--since N`: the stored checkpoint of size N, its signature verified (no watermarks)."""
    cp = Checkpoint.objects.filter(tree_size=tree_size).first()
    if cp is None:
        return None, [f"no checkpoint of tree size {tree_size}"], None
    since, problems = since_of(cp.body, cp.signature, cp.link, cp.link_signature)
    return since, problems, State(cp.body, cp.signature, {}, "", cp.link, cp.link_signature)


def _watermarked() -> list[tuple[str, Any]]:
    return [(m._meta.db_table, m) for m in coverage.AUDITED if m not in QUEUES]


def _table_selects(model, table: str, marks: dict[str, list[int]] | None) -> tuple[list[str], list[int]]:
    """One table's tally as scalar subqueries: its highest id, its rows, and (with a watermark in
    `marks`) its rows above that id."""
    q = connections[read_alias()].ops.quote_name
    pk = q(model._meta.pk.column)
    # Identifiers come from the models and are quoted; the watermarks are parameters.
    selects = [f"(SELECT MAX({pk}) FROM {q(table)})", f"(SELECT COUNT(*) FROM {q(table)})"]  # noqa: S608
    if marks is not None and table in marks:
        selects.append(f"(SELECT COUNT(*) FROM {q(table)} WHERE {pk} > %s)")  # noqa: S608
        return selects, [int(marks[table][0])]
    return selects, []


def _select(alias: str, selects: list[str], params: list[int], *, close: bool = False) -> list:
    connection = connections[alias]
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT " + ", ".join(selects), params)
            return list(cursor.fetchone())
    finally:
        if close:  # a thread's own connection
            connection.close()


def _tallies(
    marks: dict[str, list[int]] | None, *, connections_n: int = 1
) -> dict[str, tuple[int, int, int | None]]:
    """Per watermarked table: (highest id, rows, rows above the id of its watermark in `marks`; None
    without one). A count of every row reads the table's smallest index; the rows up to an id, its
    primary key's range (in InnoDB, the rows themselves: ten times the pages for the events), so the
    rows up to a watermark are counted as every row less those above it (a range of new rows).
    One statement for every table (one snapshot of them all), or with `connections_n` above 1 one per
    table over that many connections, largest tables first: the count is the database's work, one core
    per statement. Each table's check and next watermark stay one statement, one snapshot of that
    table, which is what `watermark_problems` compares."""
    alias = read_alias()
    tables = _watermarked()
    parts = {table: _table_selects(model, table, marks) for table, model in tables}
    values: dict[str, list] = {}
    if connections_n <= 1 or len(tables) <= 1 or not parallel.others_can_read():
        flat = _select(
            alias, [x for s, _ in parts.values() for x in s], [x for _, p in parts.values() for x in p]
        )
        for table, (selects, _params) in parts.items():
            values[table], flat = flat[: len(selects)], flat[len(selects) :]
    else:
        # Largest first (the last verification's counts), so no connection is left with the biggest.
        order = sorted(parts, key=lambda t: -(marks or {}).get(t, [0, 0])[1])
        with ThreadPoolExecutor(min(connections_n, len(order)), thread_name_prefix="verify-tally") as pool:
            futures = {t: pool.submit(_select, alias, *parts[t], close=True) for t in order}
            values = {t: f.result() for t, f in futures.items()}
    out = {}
    for table, _model in tables:
        got = values[table]
        top, rows = int(got[0] or 0), int(got[1])
        above = int(got[2]) if len(got) > 2 else None
        out[table] = (top, rows, above)
    return out


def watermarks(
    tallies: dict[str, tuple[int, int, int | None]] | None = None, *, connections_n: int = 1
) -> dict[str, list[int]]:
    """Each audited table's highest id and row count (taken before a verification reads anything), from
    `tallies` when the caller took them (`_tallies`, over `connections_n` connections)."""
    tallies = tallies if tallies is not None else _tallies(None, connections_n=connections_n)
    return {table: [top, rows] for table, (top, rows, _above) in tallies.items()}


def watermark_problems(
    marks: dict[str, list[int]], tallies: dict[str, tuple[int, int, int | None]] | None = None
) -> list[str]:
    """Why the rows up to the watermarks are no longer those verified: rows deleted or inserted under
    an old id (any, legitimate or not, makes the verification a full one). A table unknown to the
    state (added since) is named too. `tallies`: `_tallies(marks)`, when the caller took them."""
    tallies = tallies if tallies is not None else _tallies(marks)
    changed = []
    for table, _model in _watermarked():
        if table not in marks:
            changed.append(f"{table}: no watermark in the state file")
            continue
        top, rows = marks[table]
        _top, stored, above = tallies[table]
        now = stored - above
        if now != rows:
            changed.append(f"{table}: {rows} row(s) up to id {top} were verified, {now} are stored")
    return changed


def unanchored(from_pk: int = 0) -> list[tuple[int, str]]:
    """(primary key, run id) of every run row from primary key `from_pk` on that no leaf anchors."""
    anchored = LogLeaf.objects.filter(run_id__isnull=False).values("run_id")
    runs = DiagnosisRun.objects.filter(pk__gte=from_pk).exclude(run_id__in=anchored)
    return list(runs.values_list("pk", "run_id"))


def unanchored_floor(marks: dict[str, list[int]], *, from_pk: int = 0) -> int:
    """The next state's `unanchored_from` (searched after `marks` were taken, from the last floor on):
    the lowest run that no leaf under the leaves' watermark anchors — a leaf above it can be deleted
    before the next verification without its count changing, so it does not let the next search pass
    its run — and never above the runs' watermark + 1 (a run committed later under a lower id is above
    that watermark, chosen by it, or under it, and fails the watermark check). One aggregate."""
    leaves = marks[LogLeaf._meta.db_table][0]
    anchored = LogLeaf.objects.filter(run_id__isnull=False, pk__lte=leaves).values("run_id")
    runs = DiagnosisRun.objects.filter(pk__gte=from_pk).exclude(run_id__in=anchored)
    lowest = runs.aggregate(lowest=Min("pk"))["lowest"]
    cap = marks[DiagnosisRun._meta.db_table][0] + 1
    return cap if lowest is None else min(lowest, cap)


def changed_run_ids(
    since: Since, marks: dict[str, list[int]] | None, *, unanchored_from: int = 0
) -> set[str]:
    """The runs to verify again: those with a row stored after the watermarks (a new run, event, step,
    tool row, reasoning row, review, score, leaf, tombstone, tail note…), those anchored or grown in a
    leaf after the verified checkpoint, those not anchored at all, and those with a tail note. Runs
    below `unanchored_from` were all anchored at the last verification and are not searched again (a leaf
    deleted since fails the watermark check)."""
    ids: set[str] = set()
    for table, model in _watermarked():
        if marks is None or not any(f.attname == "run_id" for f in model._meta.concrete_fields):
            continue
        top = marks.get(table, [0, 0])[0]
        ids.update(
            r
            for r in model.objects.filter(pk__gt=top).order_by().values_list("run_id", flat=True).distinct()
            if r
        )
    for run_id, tail_of in LogLeaf.objects.filter(leaf_index__gte=since.tree_size).values_list(
        "run_id", "tail_of"
    ):
        ids.update(r for r in (run_id, tail_of) if r)
    ids.update(run_id for _pk, run_id in unanchored(unanchored_from if marks is not None else 0))
    ids.update(TailPending.objects.values_list("run_id", flat=True))
    return ids


@dataclass
class Plan:
    """What `verify_audit` verifies: everything (`since` None) or what changed after `since`."""

    state_path: str
    since: Since | None = None
    watermarks: dict[str, list[int]] | None = None
    # The next state's watermarks, when taken in the statement that checked the state's (`_tallies`).
    marks: dict[str, list[int]] | None = None
    unanchored_from: int = 0  # the state's (`State.unanchored_from`)
    problems: list[str] = field(default_factory=list)  # a state that fails: named, and all verified
    notes: list[str] = field(default_factory=list)
    usage_error: str = ""


def plan(*, state_path: str, since: str | None, everything: bool, connections_n: int = 1) -> Plan:
    """The plan for `--all` (`everything`), `--since SIZE|FILE`, or the state file at `state_path`; the
    state's watermarks counted over `connections_n` connections (`_tallies`)."""
    result = Plan(state_path)
    if everything:
        return result
    if since and since.isdigit():
        checkpoint, problems, _ = stored_since(int(since))
        if problems:
            result.usage_error = problems[0]
            return result
        result.since = checkpoint
        result.notes.append(
            "--since a tree size: no watermarks, so rows inserted into, or deleted from, runs anchored "
            "before it are not looked for (continue from a state file, or verify --all)"
        )
        return result
    path = since or state_path
    if not path:
        return result
    if not os.path.exists(path):
        if since:
            result.usage_error = f"no state file {since}"
        else:
            result.notes.append("no state file yet: verifying everything")
        return result
    try:
        state = read_state(path)
    except StateError as exc:
        result.problems.append(f"the state file: {exc}; verifying everything")
        return result
    checkpoint, problems = since_of(
        state.checkpoint_body,
        state.checkpoint_signature,
        state.checkpoint_link,
        state.checkpoint_link_signature,
    )
    if problems:
        result.problems.extend(f"the state file: {p}; verifying everything" for p in problems)
        return result
    # The state's watermarks checked, and the next state's taken, in one statement per table at most.
    tallies = _tallies(state.watermarks, connections_n=connections_n)
    result.marks = watermarks(tallies)
    changed = watermark_problems(state.watermarks, tallies)
    if changed:
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        result.notes.append(
            "rows deleted or inserted under the last verification's watermarks ("
            + "; ".join(changed[:3])
            + more
            + "): verifying everything"
        )
        return result
    result.since, result.watermarks = checkpoint, state.watermarks
    result.unanchored_from = state.unanchored_from
    return result
