"""The bench (bench/, `make bench`) cannot rot: its cheapest scenarios run here with tiny sizes on the test
database, and its report renders. The bench itself is not part of the suite (it measures; tests never
assert wall times): these tests assert only that each scenario runs and checks what it recorded."""

import pytest

from bench import b1_recording, b2_trace, report, workload
from bench.stats import Row, harness_uncollected, percentile, spread

pytestmark = pytest.mark.django_db(transaction=True)


def test_stats_and_table():
    s = spread([3.0, 1.0, 2.0])
    assert (s.median, s.low, s.high, s.n) == (2.0, 1.0, 3.0, 3)
    assert percentile(list(range(1, 101)), 99) == 99
    rows = [Row("B1", "x", "1 ms", s, 2.5), Row("B1", "y", "1 ms", s, 3.0, goal="min")]
    assert [r.met for r in rows] == [True, False]
    assert "≤ 2.5×" in report.table(rows) and "| B1 | x |" in report._md_table(rows)


def test_the_harness_measures_with_its_heap_out_of_the_collectors_passes():
    """B3's clients and provider freeze what they hold while they measure (a full pass over it delayed
    every frame in flight, counted as the server's delay), and unfreeze it afterwards."""
    import gc

    held = {"frames": []}
    with harness_uncollected():
        assert gc.get_freeze_count() > 0
        assert not any(o is held for o in gc.get_objects())
    assert gc.get_freeze_count() == 0 and any(o is held for o in gc.get_objects())


def test_b5_composes_the_count_at_a_million_runs_per_table_over_two_connections():
    """B5's composed incremental row spreads each table's count over 2 connections as `verify_audit
    --workers 2` does (largest first to the least loaded), each table at its own per-row time where
    B2's store holds enough of its rows to time it, at B2's mean otherwise."""
    from bench import b5_verify

    assert b5_verify.parallel_wall([5.0, 4.0, 3.0, 3.0, 1.0], 2) == 8.0
    assert b5_verify.parallel_wall([5.0, 1.0], 4) == 5.0
    per_table = {"events": (2.0, 1_000_000), "runs": (0.5, 1_000_000), "reviews": (1.0, 10)}
    store = {"events": 2_000, "runs": 100, "reviews": 100}  # rows in a store of 100 runs
    # At 1,000,000 runs: events 20 M rows × 2 µs = 40 s; runs 1 M × 0.5 µs; reviews 1 M × the mean.
    mean = 3.5 / 2_000_010
    expected = b5_verify.parallel_wall([40.0, 0.5, mean * 1_000_000], 2)
    assert b5_verify._count_at_million(per_table, store, 100) == pytest.approx(expected)
    assert expected == pytest.approx(40.0)


def test_workload_records_a_complete_run_through_both_write_paths(user):
    from diagnosis import services

    session = services.create_session(owner=user)
    inputs = workload.make_inputs()
    direct = b1_recording.new_runs(session, 2, "smoke")
    grouped = b1_recording.new_runs(session, 2, "smoke")
    assert b1_recording.run_recorder(direct, inputs, group_commit=False) > 0
    assert b1_recording.run_recorder(grouped, inputs, group_commit=True) > 0
    b1_recording.check_complete(direct + grouped)


def test_floor_is_the_recorders_own_rows_one_statement_each(user):
    from django.db import connection

    from diagnosis import services

    session = services.create_session(owner=user)
    statements, template_run = b1_recording.capture_floor(session, workload.make_inputs())
    # 23 events + 4 steps + 4 reasoning rows + 3 tool rows, 3 tool updates, 6 run-row updates and the
    # updates of the run's stored list facts (`audit.read.list_facts`) and of its review-queue flag
    # (`diagnosis.review_queue`), both in the terminal row's transaction.
    assert len(statements) == 45
    assert sum(s.sql.startswith("INSERT INTO") for s in statements) == 34
    assert all(template_run in s.params for s in statements)
    if connection.vendor == "mysql":
        from bench import env

        conn = env.raw_connect(connection.settings_dict["NAME"])
        try:
            runs = b1_recording.new_runs(session, 2, "floor")
            plans = b1_recording.floor_plan(statements, template_run, [r.run_id for r in runs])
            assert b1_recording.run_floor(conn, plans) > 0
        finally:
            conn.close()
        from audit.models import TraceEvent

        assert TraceEvent.objects.filter(run_id=runs[0].run_id).count() == workload.EVENTS_PER_RUN


def test_trace_read_scenario_on_a_small_run(user):
    targets = b2_trace.make_targets(user, sizes=(10,))
    client = b2_trace.login_client(user)
    body = b2_trace.endpoint_read(client, targets[0])
    b2_trace.check_body(body, targets[0])
    count, _ = b2_trace.query_count(client, targets[0])
    assert count == b2_trace.query_count(client, b2_trace.make_targets(user, sizes=(30,))[0])[0]


def test_trace_read_stages_on_a_small_run():
    """`--only b2s`: every stage of a trace read runs on a recorded run, and each is a row of the table."""
    from bench import b2_stages

    result = b2_stages.measure(database=None, sizes=(10,), batches=1, log=lambda _line: None)
    ms = result[10]["ms"]
    assert len(ms) == 10 and all(v >= 0 for v in ms.values()) and ms["whole request"] > 0
    assert result[10]["rows"] == (1, 2, 1)
    table = b2_stages.markdown(result)
    assert all(name in table for name in ms) and "rest: the view's mapping" in table


def test_loop_overhead_scenario_with_fast_model_calls():
    from bench import b4_loop

    rows = b4_loop.loop_overhead(runs_per_rep=1, reps=1, call_seconds=0.01, log=lambda *_: None)
    assert rows[0].bench == "B4" and rows[0].ratio.n == 1 and rows[0].result.endswith("PUBLISHED")


def test_witness_latency_row_cosigns_every_checkpoint(settings):
    """B5's witness row on a small log: two loopback witnesses cosign each new checkpoint (the first
    from an empty state, the next over a consistency proof) and the row reports ms per checkpoint."""
    from audit.models import CheckpointCosignature
    from audit.transparency import keys
    from bench import b5_tlog

    settings.AUDIT_SIGNING_KEYS = [keys.generate_key_text()]
    row = b5_tlog.witness_cost(reps=2, runs_per_rep=3, log=lambda *_: None)
    assert row.bench == "B5" and row.result.endswith("ms per checkpoint") and row.ratio.n == 2
    assert CheckpointCosignature.objects.count() == 2 * 3  # two witnesses, three checkpoints


@pytest.mark.mariadb
def test_transparency_log_scenarios_on_a_small_log(user, settings):
    """B5's pieces on a 37-leaf log: the synthetic log is a valid RFC 9162 tree, 20 new runs become
    leaves in one checkpoint, proofs verify and a bundle verifies."""
    from django.db import connection

    from audit.models import Checkpoint, GovernanceEvent, LogLeaf
    from audit.transparency import bundle, keys, log, store
    from audit.transparency.evidence import build_bundle
    from bench import b5_tlog
    from diagnosis.models import DiagnosisRun

    settings.AUDIT_SIGNING_KEYS = [keys.generate_key_text()]
    database = connection.settings_dict["NAME"]
    b5_tlog.build_log(database, 37, log=lambda *_: None)
    assert store.root(37).hex() == Checkpoint.objects.get().root_hash
    ids = b5_tlog.add_finished_runs(20, user, "smoke")
    assert log.checkpoint().appended == 20
    rows = b5_tlog.proofs_and_bundles(database=database, reads=4)
    # The checkpoint also anchors the governance chain's head when there is one (the groups created on
    # migrate write governance events; after a transactional test's flush they are written again).
    anchored = LogLeaf.objects.filter(governance_sequence_no__isnull=False).count()
    assert anchored == (1 if GovernanceEvent.objects.exists() else 0)
    assert rows[0].name == f"inclusion proof at {57 + anchored} leaves"
    run = DiagnosisRun.objects.get(run_id=ids[0])
    assert bundle.verify(build_bundle(run=run), [keys.current_key().public]).ok


def test_checkpointer_beside_recorders_every_variant_anchors_its_waiting_runs(settings):
    """`--only b3k`: each variant runs its recorders to the end, the passes anchor the waiting runs (the
    last variant's after its load), and the table has a row per variant."""
    from audit.models import LogLeaf
    from audit.transparency import keys
    from bench import b3_checkpointer
    from diagnosis.models import DiagnosisRun

    settings.AUDIT_SIGNING_KEYS = [keys.generate_key_text()]
    found = b3_checkpointer.measure(waiting=3, chats=2, reps=1, log=lambda *_: None)
    assert list(found) == list(b3_checkpointer.VARIANTS) and all(len(f) == 1 for f in found.values())
    assert all(f[0]["p99_ms"] > 0 and f[0]["max_ms"] >= f[0]["p99_ms"] for f in found.values())
    waiting = DiagnosisRun.objects.filter(query__startswith="b3k waiting").values_list("run_id", flat=True)
    assert len(waiting) == 4 * 3 and LogLeaf.objects.filter(run_id__in=list(waiting)).count() == 4 * 3
    table = b3_checkpointer.markdown(found)
    assert all(f"| {variant} |" in table for variant in b3_checkpointer.VARIANTS)


def test_aiops_scenario_with_fast_model_calls():
    from bench import b7_aiops

    rows = b7_aiops.run_all(runs_per_rep=1, reps=1, call_seconds=0.01, log=lambda *_: None)
    assert [r.bench for r in rows] == ["B7", "B7", "B7"]
    assert all(r.ratio.n == 1 for r in rows) and rows[-1].result.endswith("PUBLISHED")


def test_b3_profile_categories_of_a_collapsed_profile():
    """py-spy's collapsed stacks are put in the category that owns them (recorder, SDK, …) or, else, in
    the first one found from the innermost frame outwards; the section renders."""
    from collections import Counter

    from bench import b3_profile

    loop = "<module> (daphne:6);BaseEventLoop._run_once (asyncio/base_events.py:1922)"
    job = "Bridged._body (audit/write/group_commit.py:274);_job (agent/runtime/db.py:282)"
    raw = "\n".join(
        [
            f"{loop};RunRecorder._commit (audit/write/chain_writer.py:120);dumps (json/__init__.py:231) 5",
            f"{loop};Stream.__anext__ (openai/_streaming.py:40);BaseModel.construct (pydantic/main.py:1) 3",
            f"{loop};AsyncAPIClient.request (openai/_base_client.py:1500);build (httpx2/_models.py:9) 2",
            f"{loop};InMemoryChannelLayer._clean_expired (channels/layers.py:330) 4",
            f"{loop};search (agent/knowledge/search.py:10);sub (re/__init__.py:1) 1",
            f"{loop} 1",
            # A database job of the runtime's pool runs in a `Bridged` greenlet, which owns nothing:
            # a recorder decision there is the recorder's, a run's claim is other database work.
            f"{job};RunRecorder.finish (audit/write/run.py:581);dumps (json/__init__.py:231) 2",
            f"{job};claim_run (diagnosis/services.py:117);execute (django/db/backends/utils.py:78) 3",
            "Bridged.step (audit/write/group_commit.py:280) 1",
        ]
    )
    per, _, total = b3_profile.categorise(raw)
    assert total == 22
    assert per == Counter(
        {
            "recorder (audit rows, chain, digests, encryption, its SQL)": 7,
            "other database work (token auth, lockout, run setup)": 3,
            "thread-pool hops": 1,
            "model SDK: stream (chunk) parsing": 3,
            "model SDK: request building and HTTP": 2,
            "frames, consumer and channel layer": 4,
            "knowledge search": 1,
            "event loop": 1,
        }
    )
    evidence = {
        ("draft", 50): {
            "cpu_ms_per_run": 10.0,
            "samples": total,
            "categories": per,
            "chats": 50,
            "succeeded": 50,
            "cpu_s": 0.5,
            "wall_s": 1.0,
        }
    }
    assert (
        "| recorder (audit rows, chain, digests, encryption, its SQL) | 3.2 (32%) |"
        in b3_profile.markdown(evidence)
    )


def test_b0_peer_shape_is_b1s_run():
    """The peers record the run B1 records: 23 timeline events (as span events) in 12 spans."""
    from bench import peer_shape

    assert peer_shape.EVENTS_PER_RUN == workload.EVENTS_PER_RUN == 23
    assert peer_shape.SPANS_PER_RUN == 12
    assert [s["parent"] for s in peer_shape.spans(1)][:2] == [None, 0]


def test_full_report_keeps_the_dated_notes_and_the_profile_it_did_not_rerun():
    from bench.env import Machine
    from bench.report import Results, markdown

    machine = Machine(2, 1.0, "cpu", "3.11", "5.2", "10.11", "2.3", "innodb", "linux")
    previous = (
        "# Performance\n\nold table\n\n<!-- NOTES -->\n## Measured by hand, dated\n\nnote 2026-12-01\n"
        "<!-- /NOTES -->\n\n<!-- B3P -->\n## B3 profile\n\nprofile rows\n<!-- /B3P -->\n"
    )
    text = markdown(Results(machine=machine, quick=False), previous)
    assert "note 2026-12-01" in text and "profile rows" in text and "old table" not in text
    assert text.count("<!-- NOTES -->") == 1 and text.count("<!-- B3P -->") == 1
    # A first run (no previous file) leaves empty markers for the next one to fill.
    first = markdown(Results(machine=machine, quick=False))
    assert "<!-- NOTES -->\n<!-- /NOTES -->" in first


def test_b3_sweep_stops_at_the_first_level_over_the_bound_and_reports_the_level_before(monkeypatch):
    """The capacity rule of `bench.b3_live.sweep`: levels in order, stop at the first whose p99 extra
    delay per frame exceeds the bound or that lost a run or a record; capacity is the level before."""
    from bench import b3_live

    p99_at = {5: 10.0, 10: 49.0, 25: 51.0, 50: 1.0}
    measured: list[int] = []
    rest = dict.fromkeys(("p50", "release_p50", "release_p99", "cpu_per_run_ms", "wall"), 1.0)
    rest.update(dict.fromkeys(("draft_frames", "chunks", "missing"), 0))

    def fake_measure(urls, pids, tokens, *, mode, baseline_ms):
        n = len(tokens)
        measured.append(n)
        return {**rest, "chats": n, "succeeded": n, "p99": p99_at.get(n, 0.0), "ok": True}

    monkeypatch.setattr(b3_live, "measure", fake_measure)
    result = b3_live.sweep([], [], ["t"] * 50, mode="draft", levels=(5, 10, 25, 50), log=lambda *_: None)
    assert result["capacity"] == 10 and result["at_capacity"]["chats"] == 10
    assert measured == [1, 1, 1, 5, 10, 25]  # the single-chat baseline three times, then up to the failure

    p99_at[10] = 1.0
    lost = {**rest, "chats": 10, "succeeded": 9, "p99": 1.0, "ok": False}
    monkeypatch.setattr(
        b3_live, "measure", lambda u, p, t, **k: lost if len(t) == 10 else fake_measure(u, p, t, **k)
    )
    result = b3_live.sweep([], [], ["t"] * 50, mode="draft", levels=(5, 10, 25), log=lambda *_: None)
    assert result["capacity"] == 5


def test_the_limits_section_states_each_bound_from_this_runs_figures():
    """B1 concurrent's bound is the floor over the process CPU per run it measured, B2 quotes the
    endpoint's CPU per read, B3 the CPU per run and a run's duration of its in-memory draft sweep."""
    from bench.env import Machine
    from bench.report import Results, limits_section
    from bench.stats import Row, spread

    res = Results(
        machine=Machine(2, 1.0, "cpu", "3.11", "5.2", "10.11", "2.3", "innodb", "linux"), quick=False
    )
    res.rows = [
        Row(
            "B1",
            "200 concurrent runs, one asyncio process, group commit: speed-up per record vs floor",
            "",
            spread([2.5]),
            3.0,
            goal="min",
            extra={
                "cpu_ms_per_run": spread([7.0, 8.0, 9.0]),
                "floor_ms_per_run": spread([20.0]),
                "bound": spread([2.4, 2.5, 2.9]),
            },
        ),
        Row(
            "B2",
            "trace endpoint vs raw SQL, run of 500 events",
            "",
            spread([4.0]),
            2.0,
            extra={"cpu_ms": spread([44.0]), "floor_ms": spread([12.5])},
        ),
    ]
    res.evidence["b3"] = {
        "draft / one process, in-memory layer": {
            "capacity": 10,
            "levels": [
                {"chats": 5, "wall": 0.8, "cpu_per_run_ms": 80.0},
                {"chats": 10, "wall": 0.9, "cpu_per_run_ms": 60.0},
                {"chats": 25, "wall": 2.0, "cpu_per_run_ms": 70.0},
            ],
        }
    }
    text = " ".join(limits_section(res).split())  # wrapped to 105 columns; compared unwrapped
    assert "8.00 ms of CPU per run** (7.00–9.00)" in text and "floor / CPU = 2.50× (2.40–2.90×" in text
    assert "500 events: endpoint CPU 44.00 ms per read, floor 12.50 ms wall" in text
    assert "took 0.8 s at 5 chats and cost 70 ms of CPU" in text
    assert "near 11 concurrent chats" in text and "≤ 4.0 ms of CPU per run, about 18× less" in text
    assert max(len(line) for line in limits_section(res).splitlines()) <= 105
    # Without the figures (a partial run) it says so instead of inventing them.
    empty = " ".join(limits_section(Results(machine=res.machine, quick=False)).split())
    assert "did not measure B1 concurrent" in empty and "B3 did not run" in empty
