"""B5 — the transparency log: checkpointing, proofs and evidence bundles at scale, and verify_audit.

*Log at scale*: a log of `size` leaves (10 000 and 1 000 000) is built directly — synthetic leaf data,
RFC 9162 leaf hashes and every complete subtree computed in Python and bulk-inserted with a raw
connection (not runs through the runtime: the machine is small and shared), then signed by one
checkpoint. On top of it, each repetition stores 1 000 finished runs (run row, RUN_STARTED and
RUN_FINISHED with a valid chain, bulk-inserted) and times `audit.transparency.log.checkpoint()` appending
them and signing: **seconds per 1 000 leaves**, and the queries it sent. The 1 000 000-leaf log lives in
its own database (`<db>_tlog_big`) and is kept between bench runs; the 10 000-leaf one (`<db>_tlog`) is
rebuilt when its size differs.

*Proofs and bundles at 1 000 000 leaves*: the inclusion proof of random leaves and the consistency proof
between random sizes from the stored tree (median latency and rows read, which stay O(log n)), and the
evidence bundle of an anchored run (`audit.transparency.evidence.build_bundle`: latency and queries).

*Witnesses*: on top of the 10 000-leaf log, each repetition checkpoints 100 new runs, then times the
checkpointer's submission of that checkpoint with its consistency proof to two tlog-witness servers on
loopback (`audit.transparency.witnesses.submit_all`; the witness is the spec-written one of the tests,
`tests/witness_server.py`, each with its own state file) until both cosignatures are stored: **ms per
checkpoint** that witnessing adds.

*verify_audit*: beside its floor, full with 1 and 2 workers, incremental, peak RSS (`bench.b5_verify`).
"""

from __future__ import annotations

import json
import random
import time

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from bench.env import raw_connect
from bench.stats import Row, spread

RUN_PREFIX = "tl"
INSERT_CHUNK = 5000


def _leaf_data(i: int) -> bytes:
    from audit.transparency import leafdata

    return leafdata.encode(
        {
            "kind": "run",
            "runId": f"{RUN_PREFIX}{i:010d}",
            "sessionId": f"{RUN_PREFIX}ses{i // 10:09d}",
            "chainHead": f"{i:064x}",
            "lastSequenceNo": 23,
            "runDigest": f"{i * 7:064x}",
            "finishedAt": "2026-11-01T10:00:00.000000+00:00",
        }
    )


def log_size(database: str) -> int:
    conn = raw_connect(database)
    try:
        cur = conn.cursor()
        cur.execute("SELECT COUNT(*) FROM audit_log_leaf")
        return int(cur.fetchone()[0])
    finally:
        conn.close()


def build_log(database: str, size: int, log=print) -> float:
    """Empty the log tables of `database` and fill them with `size` synthetic leaves and their nodes;
    seconds. The head row and one signed checkpoint of that size are written through Django."""
    from audit.transparency import merkle

    start = time.perf_counter()
    conn = raw_connect(database, autocommit=False)
    cur = conn.cursor()
    # The witnesses' rows reference the checkpoints (a foreign key): they go first, with the checks off.
    cur.execute("SET FOREIGN_KEY_CHECKS = 0")
    for table in (
        "audit_checkpoint_cosignature",
        "audit_witness_attempt",
        "audit_checkpoint",
        "audit_log_node",
        "audit_log_leaf",
        "audit_log_head",
    ):
        cur.execute(f"TRUNCATE TABLE {table}")
    cur.execute("SET FOREIGN_KEY_CHECKS = 1")
    frontier = merkle.Frontier()
    leaves, nodes = [], []
    now = timezone.now().strftime("%Y-%m-%d %H:%M:%S.%f")

    def flush():
        if leaves:
            cur.executemany(
                "INSERT INTO audit_log_leaf (leaf_index, run_id, session_id, leaf_hash, data, appended_at) "
                "VALUES (%s, %s, %s, %s, %s, %s)",
                leaves,
            )
        if nodes:
            cur.executemany("INSERT INTO audit_log_node (level, node_index, hash) VALUES (%s, %s, %s)", nodes)
        conn.commit()
        leaves.clear()
        nodes.clear()

    for i in range(size):
        data = _leaf_data(i)
        h = merkle.leaf_hash(data)
        leaves.append(
            (i, f"{RUN_PREFIX}{i:010d}", f"{RUN_PREFIX}ses{i // 10:09d}", h.hex(), data.decode(), now)
        )
        nodes.extend((lv, ix, nh.hex()) for lv, ix, nh in frontier.append(h))
        if len(leaves) >= INSERT_CHUNK:
            flush()
        if (i + 1) % 200_000 == 0:
            log(f"  B5 log: {i + 1:,} leaves in {database} ({time.perf_counter() - start:.0f} s)")
    flush()
    cur.execute("ANALYZE TABLE audit_log_leaf, audit_log_node")
    cur.fetchall()
    conn.close()
    _sign_head(size, frontier.root().hex())
    return time.perf_counter() - start


def _sign_head(size: int, root_hex: str) -> None:
    from django.db import transaction

    from audit.models import LogHead
    from audit.transparency import log

    log.ensure_head()
    with transaction.atomic():
        head = LogHead.objects.select_for_update().get(pk=1)
        head.tree_size, head.root_hash, head.scan_from = size, root_hex, timezone.now()
        head.save()
        log.sign_head(head, timezone.now())


def add_finished_runs(n: int, owner, tag: str) -> list[str]:
    """`n` finished runs with a valid two-event chain (RUN_STARTED, RUN_FINISHED), tagged with the write key
    as the recorder tags it, bulk-inserted (what the checkpointer verifies before it anchors them)."""
    from audit.models import TraceEvent
    from audit.verify import row_digests
    from audit.verify.hash_chain import GENESIS_HASH, chain_hash, event_payload
    from core import writeauth
    from diagnosis import services
    from diagnosis.models import DiagnosisRun

    tagger = writeauth.verifier()
    session = services.create_session(owner=owner, title=f"bench B5 {tag}")
    now = timezone.now()
    runs, events = [], []
    for k in range(n):
        run = DiagnosisRun(
            run_id=f"b5{tag}{k:06d}{random.randrange(16**6):06x}"[:64],
            session=session,
            query="q",
            status="SUCCESS",
            content="answer",
            finished_at=now,
            expected_events=2,
        )
        runs.append(run)
        prev = GENESIS_HASH
        for seq, (etype, details) in enumerate(
            (
                ("RUN_STARTED", {}),
                (
                    "RUN_FINISHED",
                    {"runDigest": row_digests.RUN.digest_of(run), "runForm": row_digests.RUN.name},
                ),
            ),
            start=1,
        ):
            payload = event_payload(
                run_id=run.run_id,
                session_id=session.session_id,
                sequence_no=seq,
                phase="RUN",
                event_type=etype,
                status="SUCCESS",
                summary=etype.lower(),
                details=details,
                created_at=now,
            )
            h = chain_hash(prev, payload)
            events.append(
                TraceEvent(
                    run_id=run.run_id,
                    session_id=session.session_id,
                    sequence_no=seq,
                    phase="RUN",
                    event_type=etype,
                    status="SUCCESS",
                    summary=etype.lower(),
                    details=details,
                    prev_hash=prev,
                    hash=h,
                    created_at=now,
                    tag=tagger.tag(writeauth.RUN, h),  # as the recorder tags every link
                )
            )
            prev = h
    DiagnosisRun.objects.bulk_create(runs, batch_size=500)
    TraceEvent.objects.bulk_create(events, batch_size=1000)
    # Each row tagged as created by the service (`create_run` does it one run at a time), over the
    # creation time the database stored.
    stored = {r.run_id: r for r in DiagnosisRun.objects.filter(run_id__in=[r.run_id for r in runs])}
    for run in stored.values():
        run.created_tag = tagger.tag(writeauth.RUN_CREATED, services.identity_digest(run))
    DiagnosisRun.objects.bulk_update(list(stored.values()), ["created_tag"], batch_size=500)
    return [r.run_id for r in runs]


def _owner():
    from django.contrib.auth import get_user_model

    user, _ = get_user_model().objects.get_or_create(username="bench-tlog")
    return user


def checkpoint_cost(*, database: str, size: int, reps: int, log=print) -> tuple[Row, dict]:
    """Seconds per 1 000 leaves appended and signed on top of a log of `size` leaves."""
    from audit.transparency.log import checkpoint
    from bench.b2_trace import migrate_database

    migrate_database(database)
    have = log_size(database)
    if not (size <= have < size + 100_000):
        log(f"  B5: building a log of {size:,} leaves in {database}")
        build_log(database, size, log=log)
    owner = _owner()
    size = log_size(database)
    times, queries = [], []
    for rep in range(reps):
        add_finished_runs(1000, owner, f"r{rep}")
        with CaptureQueriesContext(connection) as ctx:
            started = time.perf_counter()
            result = checkpoint()
            times.append(time.perf_counter() - started)
        assert result.appended == 1000, result
        queries.append(len(ctx.captured_queries))
    s = spread(times)
    row = Row(
        "B5",
        f"checkpoint 1,000 new runs onto a log of {size:,} leaves",
        f"{s.median * 1000:.0f} ms per 1,000 leaves; {int(spread(queries).median)} queries",
        spread([t * 1000 for t in times]),
        None,
        ratio_unit=" ms",
    )
    return row, {"size": size, "seconds": times, "queries": queries}


def proofs_and_bundles(*, database: str, reads: int, log=print) -> list[Row]:
    """Inclusion and consistency proof latency and rows read, and bundle latency, on `database`'s log."""
    from audit.models import Checkpoint, LogLeaf
    from audit.transparency import merkle, store
    from audit.transparency.evidence import build_bundle
    from bench.b2_trace import use_database
    from diagnosis.models import DiagnosisRun

    use_database(database)
    newest = Checkpoint.objects.order_by("-tree_size").first()
    size = newest.tree_size
    root = bytes.fromhex(newest.root_hash)
    rng = random.Random(5)
    inc_t, inc_rows, con_t, con_rows = [], [], [], []
    for _ in range(reads):
        index = rng.randrange(size)
        started = time.perf_counter()
        proof = store.inclusion_proof(index, size)
        inc_t.append(time.perf_counter() - started)
        inc_rows.append(proof.rows_read)
        leaf = bytes.fromhex(LogLeaf.objects.values_list("leaf_hash", flat=True).get(leaf_index=index))
        merkle.verify_inclusion(leaf, index, size, proof.hashes, root)
        old = rng.randrange(1, size)
        started = time.perf_counter()
        proof = store.consistency_proof(old, size)
        con_t.append(time.perf_counter() - started)
        con_rows.append(proof.rows_read)
    run = DiagnosisRun.objects.filter(run_id__startswith="b5").order_by("-id").first()
    bundle_t, bundle_q = [], []
    for _ in range(max(5, reads // 4)):
        with CaptureQueriesContext(connection) as ctx:
            started = time.perf_counter()
            body = build_bundle(run=run)
            bundle_t.append(time.perf_counter() - started)
        bundle_q.append(len(ctx.captured_queries))
    assert body["anchor"] is not None
    bundle_bytes = len(json.dumps(body))
    inc, con, bun = (
        spread([t * 1000 for t in inc_t]),
        spread([t * 1000 for t in con_t]),
        spread([t * 1000 for t in bundle_t]),
    )
    return [
        Row(
            "B5",
            f"inclusion proof at {size:,} leaves",
            f"{inc.median:.2f} ms; {int(spread(inc_rows).median)} rows read (max {max(inc_rows)})",
            inc,
            None,
            ratio_unit=" ms",
        ),
        Row(
            "B5",
            f"consistency proof at {size:,} leaves",
            f"{con.median:.2f} ms; {int(spread(con_rows).median)} rows read (max {max(con_rows)})",
            con,
            None,
            ratio_unit=" ms",
        ),
        Row(
            "B5",
            f"evidence bundle of a run at {size:,} leaves",
            f"{bun.median:.1f} ms; {int(spread(bundle_q).median)} queries; {bundle_bytes:,} bytes",
            bun,
            None,
            ratio_unit=" ms",
        ),
    ]


def witness_cost(*, reps: int, runs_per_rep: int = 100, witnesses: int = 2, log=print) -> Row:
    """Milliseconds per checkpoint for its cosignatures: `witnesses` witnesses on loopback each check the
    new checkpoint's consistency with the last one they cosigned and answer a cosignature, stored beside
    it (on the current database's log, which must already hold a checkpoint)."""
    import tempfile
    from pathlib import Path

    from django.conf import settings
    from django.test import override_settings

    from audit.models import CheckpointCosignature
    from audit.transparency import keys
    from audit.transparency.log import checkpoint
    from audit.transparency.witnesses import submit_all
    from tests.witness_server import Witness, WitnessServer

    owner = _owner()
    with tempfile.TemporaryDirectory() as state:
        trusted = {settings.AUDIT_LOG_ORIGIN: [keys.current_key().public]}
        ws = [Witness(f"bench.witness/w{i}", Path(state) / f"w{i}.json", trusted) for i in range(witnesses)]
        servers = [WitnessServer(w) for w in ws]
        try:
            entries = [f"{server.url} {w.vkey}" for server, w in zip(servers, ws, strict=True)]
            times = []
            for rep in range(reps + 1):  # the first submission also brings the witnesses up to date
                add_finished_runs(runs_per_rep, owner, f"w{rep}")
                with override_settings(AUDIT_WITNESSES=[]):
                    newest = checkpoint().newest
                with override_settings(AUDIT_WITNESSES=entries):
                    started = time.perf_counter()
                    outcomes = submit_all()
                    elapsed = time.perf_counter() - started
                assert [o.outcome for o in outcomes] == ["cosigned"] * witnesses, outcomes
                assert CheckpointCosignature.objects.filter(checkpoint=newest).count() == witnesses
                if rep:
                    times.append(elapsed)
        finally:
            for server in servers:
                server.stop()
    s = spread([t * 1000 for t in times])
    log(f"  B5: {witnesses} witnesses cosign a checkpoint in {s.median:.1f} ms (median of {len(times)})")
    return Row(
        "B5",
        f"witness cosignatures per checkpoint ({witnesses} witnesses on loopback)",
        f"{s.median:.1f} ms per checkpoint",
        s,
        None,
        ratio_unit=" ms",
    )


def run_all(*, database: str, quick: bool, log=print) -> list[Row]:
    rows = []
    small, _ = checkpoint_cost(database=f"{database}_tlog", size=10_000, reps=3 if quick else 5, log=log)
    rows.append(small)
    rows.append(witness_cost(reps=3 if quick else 5, log=log))
    big_size = 100_000 if quick else 1_000_000
    big, _ = checkpoint_cost(database=f"{database}_tlog_big", size=big_size, reps=3 if quick else 5, log=log)
    rows.append(big)
    rows += proofs_and_bundles(database=f"{database}_tlog_big", reads=50 if quick else 200, log=log)
    rows += verify_rows(database=database, quick=quick, log=log)
    return rows


def verify_rows(*, database: str, quick: bool, log=print) -> list[Row]:
    """`verify_audit` beside its floor (`bench.b5_verify`): full with 1 and 2 workers, incremental."""
    from bench import b5_verify

    runs, new = (1_000, 100) if quick else (10_000, 1_000)
    return b5_verify.verify_costs(
        database=f"{database}_verify_{runs}",
        runs=runs,
        new=new,
        reps=2 if quick else 3,
        big=f"{database}_big",  # B2's 1,000,000-run store, for the statement that grows with the store
        log=log,
    )
