"""Appending finished runs to the transparency log and signing checkpoints (`manage.py audit_checkpoint`,
and every `AUDIT_CHECKPOINT_INTERVAL_SECONDS` in each server process).

`checkpoint()` appends, in batches of one transaction each under the log head's lock (one writer at a
time, one gapless leaf order), the leaves of finished runs, grown run tails and the governance head, and
signs a checkpoint of the new size in the same transaction, so every stored leaf is covered by a signed
checkpoint. After commit it writes the witness file and submits to the witnesses; failures there are
logged, never raised. A run's own path never waits on any of this.
Details: docs/audit-integrity.md, *How runs get into the log*.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Exists, Min, OuterRef, Q
from django.utils import timezone

from audit.models import (
    Checkpoint,
    LogHead,
    LogLeaf,
    LogNode,
    TailPending,
)
from audit.transparency import gate, keys, leafdata, merkle, note, store, witnesses
from audit.verify.hash_chain import timestamp
from audit.write.tail import locked_head
from core import writeauth
from diagnosis.models import TERMINAL_RUN_STATUSES, DiagnosisRun

logger = logging.getLogger(__name__)

APPEND_BATCH = 2000
TAIL_BATCH = 500
SCAN_GRACE = dt.timedelta(minutes=10)


@dataclass(frozen=True, slots=True)
class CheckpointResult:
    """What one `checkpoint()` call did: run leaves appended, checkpoints signed (oldest first), the size,
    and the sequence number of the governance event it anchored (None: the governance chain had not
    grown since its last anchor)."""

    appended: int
    checkpoints: list[Checkpoint]
    tree_size: int
    governance_anchored: int | None = None
    tails: int = 0  # run-tail leaves appended
    refused: list[str] = field(default_factory=list)  # runs whose record did not authenticate (gate)

    @property
    def newest(self) -> Checkpoint | None:
        return self.checkpoints[-1] if self.checkpoints else None


def ensure_head() -> None:
    """Create the head row if it does not exist (a fresh or flushed database); safe under races."""
    if LogHead.objects.filter(pk=1).exists():
        return
    try:
        with transaction.atomic():
            LogHead.objects.create(pk=1)
    except IntegrityError:
        pass  # another process created it


def checkpoint(
    *,
    now: dt.datetime | None = None,
    full_scan: bool = False,
    batch_size: int = APPEND_BATCH,
    pace: Callable[[], None] | None = None,
    known_refused: frozenset[str] = frozenset(),
) -> CheckpointResult:
    """Append every finished run not yet in the log whose record authenticates (`gate`), and sign a
    checkpoint per batch (see the module docstring). Signs nothing when no run is waiting and the
    governance chain has not grown. Raises `keys.SigningKeysMissing` without signing keys and
    `writeauth.WriteKeysMissing` without write keys (nothing could be checked). `pace`: called after
    each waiting run the gate checks (`periodic_checkpoint`; the transaction then holds the log head's
    lock, no run's row: grown tails, whose run rows it locks, are checked unpaced). `known_refused`: runs
    refused before and not examined again this time (`periodic_checkpoint` between its full scans)."""
    keys.current_key()  # fail before taking the lock when nothing could be signed or authenticated
    writeauth.verifier()
    ensure_head()
    appended, signed, governance, tails = 0, [], None, 0
    refused: dict[str, list[str]] = {}
    governance_problems: list[str] = []
    done, after = False, None
    oldest_refused: dt.datetime | None = None  # the creation time of the oldest run this call refused
    while not done:
        with transaction.atomic():
            head = LogHead.objects.select_for_update().get(pk=1)
            stamp = now or timezone.now()
            scan_from = None if full_scan else head.scan_from
            waiting, after, done = _waiting_runs(
                scan_from, batch_size, head.tree_size, after=after, skip=known_refused
            )
            runs = gate.admit_runs(list(waiting), pace=pace)
            refused.update(runs.refused)
            oldest_refused = _oldest(oldest_refused, (waiting[r] for r in runs.refused))
            # Tails and the governance head are anchored once per call, with the last batch of runs.
            grown = _grown_tails(exclude=set(waiting)) if done else gate.Verdict()
            refused.update(grown.refused)
            if grown.refused:  # at most TAIL_BATCH runs
                created = DiagnosisRun.objects.filter(run_id__in=sorted(grown.refused))
                oldest_refused = _oldest(oldest_refused, created.values_list("created_at", flat=True))
            gov_head, governance_problems = gate.admit_governance() if done else (None, [])
            if runs.admitted or gov_head or grown.admitted:
                appended += append_leaves(head, runs.admitted, stamp, gov_head, grown.admitted)
                tails += len(grown.admitted)
                # Signed now, after every head it anchors was read: no anchored event is newer.
                signed.append(sign_head(head, now or timezone.now()))
                if gov_head:
                    governance = gov_head.sequence_no
            if done:
                _advance_scan(head, scan_from, stamp, oldest_refused=oldest_refused)
    gate.report_refusals(refused, governance_problems)
    for cp in signed:
        _witness(cp)
    _cosign()
    tree_size = LogHead.objects.values_list("tree_size", flat=True).get(pk=1)
    return CheckpointResult(
        appended=appended,
        checkpoints=signed,
        tree_size=tree_size,
        governance_anchored=governance,
        tails=tails,
        refused=sorted(refused),
    )


_periodic = {"calls": 0}
_refused: set[str] = set()  # runs this process's checkpointer refused since its last full scan


# What the server's checkpointer sleeps after each run it checks, so that the serving threads (the event
# loop, the database pool) take the interpreter then instead of waiting out its switch interval behind
# the checks (docs/performance.md, *The checkpointer beside the chats*).
PACE_SECONDS = 0.001


def periodic_checkpoint() -> CheckpointResult:
    """The server's periodic checkpointer: a full scan at its first call in this process and every
    `AUDIT_CHECKPOINT_FULL_SCAN_EVERY` calls, incremental (from `LogHead.scan_from`) otherwise. The
    cursor is only an optimisation: whatever a database writer sets it to, the next full scan finds
    every finished run it hid (and until then `verify_audit` reports each as late). It sleeps
    `PACE_SECONDS` after each waiting run it checks. A run it refused is examined again at its next
    full scan (and by `manage.py audit_checkpoint`), not by every call: each call re-verified every
    refused run, so a database writer made every server spend CPU in proportion to the runs it forged,
    every interval, for good (12,780 refused runs: 8 s of CPU a call)."""
    every = max(1, int(settings.AUDIT_CHECKPOINT_FULL_SCAN_EVERY))
    full = _periodic["calls"] % every == 0
    _periodic["calls"] += 1
    known = frozenset() if full else frozenset(_refused)
    result = checkpoint(full_scan=full, pace=functools.partial(time.sleep, PACE_SECONDS), known_refused=known)
    if full:
        _refused.clear()
    _refused.update(result.refused)
    return result


def anchored_heads(run_ids: list[str]) -> dict[str, int]:
    """The newest sequence number anchored for each of `run_ids` that has a leaf, read from the leaves'
    data (their run and tail leaves), never from the index columns alone."""
    heads: dict[str, int] = {}
    wanted = set(run_ids)
    rows = (
        data for leaves in store.leaves_and_tails(run_ids) for data in leaves.values_list("data", flat=True)
    )
    for data in rows:
        try:
            fields = leafdata.decode_any(data)
        except ValueError:
            continue
        run_id = fields.get("runId")
        if run_id in wanted:
            heads[run_id] = max(heads.get(run_id, 0), fields["lastSequenceNo"])
    return heads


def _grown_tails(*, exclude: set[str], limit: int = TAIL_BATCH) -> gate.Verdict:
    """The anchored runs noted as grown (`audit.write.tail`) whose chain now reaches past their newest
    anchored head, verified by the gate (admitted: their tail heads; refused: kept noted, retried by the
    next checkpoint); deletes the notes that the anchored heads cover (and those of runs that no longer
    exist). Runs in `exclude` are being anchored by this very checkpoint and keep their notes."""
    pending = [
        (run_id, seq)
        for run_id, seq in TailPending.objects.order_by("id").values_list("run_id", "last_sequence_no")[
            :limit
        ]
        if run_id not in exclude
    ]
    if not pending:
        return gate.Verdict()
    ids = [run_id for run_id, _ in pending]
    anchored = anchored_heads(ids)
    # The run rows' locks order this read after any append in flight (appenders hold them).
    present = set(
        DiagnosisRun.objects.select_for_update()
        .filter(run_id__in=ids)
        .order_by("run_id")
        .values_list("run_id", flat=True)
    )
    grown, covered = [], []
    for run_id, _seq in pending:
        if run_id not in present:
            covered.append((run_id, None))  # purged or deleted: nothing left to anchor
            continue
        if run_id not in anchored:
            continue  # not anchored yet: its first leaf will cover its head
        last = locked_head(run_id)
        if last is None:
            continue
        if last[0] > anchored[run_id]:
            grown.append(run_id)
        else:
            covered.append((run_id, anchored[run_id]))
    verdict = gate.admit_runs(grown)  # unpaced: the grown runs' rows are locked meanwhile
    covered.extend((h.run_id, h.sequence_no) for h in verdict.admitted)
    for run_id, upto in covered:
        notes = TailPending.objects.filter(run_id=run_id)
        if upto is not None:
            notes = notes.filter(last_sequence_no__lte=upto)
        notes.delete()
    return verdict


def _waiting_runs(
    scan_from: dt.datetime | None,
    limit: int,
    tree_size: int,
    *,
    after: tuple[dt.datetime | None, int] | None,
    skip: frozenset[str],
) -> tuple[dict[str, dt.datetime], tuple[dt.datetime | None, int] | None, bool]:
    """Ids of finished runs without a leaf under the signed size, oldest finish first (a leaf row beyond
    the log's size, which no checkpoint signs, anchors nothing), read `limit` at a time after the key
    `after` (finish time, id) of the last run the call's previous batch read: no run is read twice in a
    call, and this query never lists the runs refused before it (an `IN` list of them grew with every
    batch, to every forged run a database writer stored). `skip`: runs refused by earlier calls, dropped
    here. Returns (the ids, in that order, with their creation times; the key of the last run read;
    whether this was the last batch)."""
    anchored = LogLeaf.objects.filter(run_id=OuterRef("run_id"), leaf_index__lt=tree_size)
    runs = DiagnosisRun.objects.filter(status__in=TERMINAL_RUN_STATUSES)
    if scan_from is not None:
        runs = runs.filter(created_at__gte=scan_from)
    if after is not None:
        # NULL finish times sort first (MariaDB, MySQL and SQLite alike), then by id.
        finished, pk = after
        if finished is None:
            runs = runs.filter(Q(finished_at__isnull=True, id__gt=pk) | Q(finished_at__isnull=False))
        else:
            runs = runs.filter(Q(finished_at__gt=finished) | Q(finished_at=finished, id__gt=pk))
    rows = list(
        runs.filter(~Exists(anchored))
        .order_by("finished_at", "id")
        .values_list("run_id", "created_at", "finished_at", "id")[:limit]
    )
    key = (rows[-1][2], rows[-1][3]) if rows else after
    waiting = {run_id: created for run_id, created, _f, _pk in rows if run_id not in skip}
    return waiting, key, len(rows) < limit


def append_leaves(
    head: LogHead,
    runs: list[gate.Head],
    now: dt.datetime,
    governance: gate.GovernanceHead | None = None,
    tails: list[gate.Head] = (),
) -> int:
    """Append the runs' leaves, then the grown tails', then the governance head's (if any), each naming
    the write key whose tag on the anchored head the gate verified; returns how many runs."""
    edge = store.frontier(head.tree_size)
    leaves, nodes = [], []

    def add(fields: dict, **columns) -> None:
        # The index columns repeat what the data says (`audit.transparency.verify.leaf_problems`).
        data = leafdata.encode(fields)
        leaf = merkle.leaf_hash(data)
        index = edge.size
        nodes.extend(edge.append(leaf))
        leaves.append(
            LogLeaf(
                leaf_index=index, leaf_hash=leaf.hex(), data=data.decode("utf-8"), appended_at=now, **columns
            )
        )

    for run in runs:
        fields = leafdata.leaf_fields(
            run_id=run.run_id,
            session_id=run.session_id,
            head_hash=run.hash,
            head_sequence_no=run.sequence_no,
            finished_details=_details(run.finished_details),
            finished_at=run.finished_at,
            write_key_id=run.write_key_id,
        )
        add(fields, run_id=run.run_id, session_id=run.session_id)
    for tail in tails:
        fields = leafdata.tail_fields(
            run_id=tail.run_id,
            session_id=tail.session_id,
            head_hash=tail.hash,
            head_sequence_no=tail.sequence_no,
            write_key_id=tail.write_key_id,
        )
        add(fields, tail_of=tail.run_id, session_id=tail.session_id)
    if governance is not None:
        fields = leafdata.governance_fields(
            head_hash=governance.hash,
            head_sequence_no=governance.sequence_no,
            created_at=governance.created_at,
            write_key_id=governance.write_key_id,
        )
        add(fields, governance_sequence_no=governance.sequence_no, session_id="")
    LogLeaf.objects.bulk_create(leaves, batch_size=500)
    LogNode.objects.bulk_create(
        [LogNode(level=level, node_index=index, hash=h.hex()) for level, index, h in nodes], batch_size=500
    )
    head.tree_size = edge.size
    head.root_hash = edge.root().hex()
    head.updated_at = now
    head.save(update_fields=["tree_size", "root_hash", "updated_at"])
    return len(runs)


def _details(value):
    """A JSON subquery's value: decoded by the field on most backends, a string on some."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def sign_head(head: LogHead, now: dt.datetime) -> Checkpoint:
    """A C2SP checkpoint of the head, signed as a signed note by the newest key under the origin's name:
    a plain body and its signed link note (time and predecessor), or, with
    `AUDIT_CHECKPOINT_EXTENSION_LINES`, a body with both as extension lines
    (`audit.transparency.note.NoteBody`). It names the previous checkpoint's hash, whatever its format."""
    key = keys.current_key()
    previous = Checkpoint.objects.order_by("-tree_size").values_list("checkpoint_hash", flat=True).first()
    body = note.NoteBody(
        origin=settings.AUDIT_LOG_ORIGIN,
        tree_size=head.tree_size,
        root_hash=head.root_hash,
        signed_at=timestamp(now),
        previous=previous or "",
        extended=bool(settings.AUDIT_CHECKPOINT_EXTENSION_LINES),
    )
    text = body.text()
    link = body.link()
    link_text = link.text() if link else ""
    return Checkpoint.objects.create(
        tree_size=body.tree_size,
        root_hash=body.root_hash,
        signed_at=now,
        previous_hash=body.previous,
        key_id=note.note_key_id(body.origin, key.public),
        body=text,
        signature=note.sign_note(body, key.private),
        link=link_text,
        link_signature=note.sign_note(body, key.private, link_text) if link else "",
        checkpoint_hash=note.statement_hash(text, link_text),
    )


def _oldest(at: dt.datetime | None, times: Iterable[dt.datetime | None]) -> dt.datetime | None:
    return min((t for t in (at, *times) if t is not None), default=None)


def _advance_scan(
    head: LogHead,
    scanned_from: dt.datetime | None,
    now: dt.datetime,
    *,
    oldest_refused: dt.datetime | None = None,
) -> None:
    """Every run created before the new cursor is terminal and anchored, or refused (this call's are
    kept in view: `oldest_refused` is the creation time of the oldest; the server's checkpointer leaves
    those it refused earlier to its full scans). Only an optimisation: a full scan searches every run
    whatever it says (`periodic_checkpoint`)."""
    open_runs = DiagnosisRun.objects.exclude(status__in=TERMINAL_RUN_STATUSES)
    if scanned_from is not None:
        open_runs = open_runs.filter(created_at__gte=scanned_from)
    oldest_open = _oldest(open_runs.aggregate(at=Min("created_at"))["at"], [oldest_refused])
    bound = now - SCAN_GRACE
    new = min(oldest_open, bound) if oldest_open is not None else bound
    if scanned_from is not None and new < scanned_from:
        new = scanned_from
    if head.scan_from != new:
        head.scan_from = new
        head.save(update_fields=["scan_from"])


def witness_line(cp: Checkpoint) -> str:
    """The witness file's line for a checkpoint: its body and signature, and its link and the link's
    signature when it has one, exactly as signed."""
    line = {"body": cp.body, "signature": cp.signature}
    if cp.link:
        line.update(link=cp.link, linkSignature=cp.link_signature)
    return json.dumps(line, sort_keys=True, separators=(",", ":"))


def _witness(cp: Checkpoint) -> None:
    path = settings.AUDIT_WITNESS_PATH
    if not path:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, (witness_line(cp) + "\n").encode("utf-8"))  # one write: lines never interleave
        finally:
            os.close(fd)
    except OSError as exc:
        logger.warning("witness write failed tree_size=%s error=%s", cp.tree_size, type(exc).__name__)


def _cosign() -> None:
    """Bring the configured witnesses up to the newest checkpoint (`audit.transparency.witnesses`): after
    the commit, on every run, so that a witness that was down or refused is asked again. Its outcomes are
    recorded there; nothing here raises into the checkpointer."""
    try:
        witnesses.submit_all()
    except Exception:
        logger.exception("witness cosigning failed")


def newest_checkpoint() -> Checkpoint | None:
    return Checkpoint.objects.order_by("-tree_size").first()
