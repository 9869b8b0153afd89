"""`python -m bench` (or `make bench`): the benchmarks of docs/performance.md, on MariaDB.

    python -m bench                 # everything (≈ 20 min on a 2-core machine, B3 ≈ 12 of them; the
                                    # first run also builds the 1 000 000-run data set of B2, which is
                                    # kept for later runs)
    python -m bench --quick         # short repetitions, B2 growth to 100 000 runs, B3's ramp to 50 chats
    python -m bench --only b3       # B3 on the chat profile (≈ 25 s runs): the bare-SDK floor, CPU per
                                    # chunk and fixed CPU per run, capacity ramps (≈ 12 min)
    python -m bench --only b3 --smoke   # B3 shrunk (20-chunk calls at 100/s, ramp 2/4): ≈ 2 min
    python -m bench --only b3 --b3-short  # … and the short-profile sweep (0.8 s runs) as secondary rows
    python -m bench --only b1,b4    # some benchmarks (b5: the transparency log; builds a 1 000 000-leaf
                                    # log once, kept for later runs; b6: the staff lists and list APIs at
                                    # 10 000 and 1 000 000 runs, on B2's data sets; b7: AI Ops analyses
                                    # through the queue worker)
    python -m bench --only b6 --write  # B6 alone, its section of docs/performance.md rewritten
    python -m bench --no-write      # print the table only (a full run writes docs/performance.md)
    python -m bench --only b8       # trace export into a real Phoenix (needs .venv-phoenix; not in the
                                    # default set)
    python -m bench --only b3l      # B3's levers side by side: daphne/uvicorn, asyncio/uvloop, draft
                                    # coalescing (uvicorn and uvloop optional; not default)
    python -m bench --only b3p      # py-spy profile of one daphne under 50 and 200 chats (not default;
                                    # --b3p-chat: on the chat profile)
    python -m bench --only b9       # reads on a replica: admin list and trace throughput, 2 processes,
                                    # primary only vs primary + replica, on scripts/mariadb-replica.sh's
                                    # pair (127.0.0.1:3307/3308; started if needed; not default)
    python -m bench --only b2s      # B2's stages: where a trace read's CPU goes, per stage, for runs of
                                    # 10, 100 and 500 events (not in the default set)
    python -m bench --only b3k      # a checkpointer pass beside 50 recorders in one process: on the
                                    # database pool, on the duties' pool, paced, and no pass (not default)
    python -m bench --only b13      # the Galera cluster of scripts/mariadb-galera.sh through HAProxy:
                                    # recording vs the single server, and a node kill to the first commit
                                    # (starts the cluster itself; writes its section of docs/performance.md)
    python -m bench --only b5v      # B5's verify_audit rows alone: floor, --all with 1 and 2 workers,
                                    # incremental, peak RSS (its store is built once and kept)
    python -m bench --only b10      # an MCP call through the toolset vs the bare mcp client, and a run's CPU
                                    # with an MCP tool vs a native tool (stdio; needs
                                    # scripts/setup.sh dev's tools/mcp; not in the default set)
    python -m bench --only b11      # retrieval quality: recall@1/@3 and MRR of the expected runbook for
                                    # the paraphrase set and the incident scenarios' questions (seconds;
                                    # --only b11 writes its section of docs/performance.md)
    python -m bench --only b0       # peers: MLflow tracing on the same MariaDB, Phoenix over OTLP (needs
                                    # `make bench-peers`; skipped when absent; not in the default set)

Every figure is a ratio measured side by side in one run, as the median of several repetitions with its
min and max; see docs/performance.md for the method of each.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bench import env

ALL = ("b1", "b2", "b3", "b4", "b5", "b6", "b7", "b11", "b13")
OPTIONAL = ("b8", "b3p", "b3l", "b0", "b9", "b10", "b5v", "b2s", "b3k")


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="short repetitions and smaller sizes")
    p.add_argument("--only", default=",".join(ALL), help="comma-separated subset of b1,…,b11, b3p")
    p.add_argument("--database", default=env.DEFAULT_DB, help="bench database (created and migrated)")
    p.add_argument("--no-write", action="store_true", help="do not write docs/performance.md")
    p.add_argument("--write", action="store_true", help="write docs/performance.md even with --quick")
    p.add_argument("--big", type=int, default=None, help="B2: runs stored for the large case")
    p.add_argument(
        "--smoke", action="store_true", help="B3 at smoke size (implies --quick for the others; never writes)"
    )
    p.add_argument("--b3p-chat", action="store_true", help="b3p: profile runs of the chat profile (≈ 25 s)")
    p.add_argument(
        "--b3-short",
        action="store_true",
        help="B3: also the short-profile sweep (0.8 s runs) as secondary rows",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    only = [b.strip().lower() for b in args.only.split(",") if b.strip()]
    unknown = set(only) - set(ALL) - set(OPTIONAL)
    if unknown:
        print(f"bench: unknown benchmark(s) {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    env.setup(args.database)

    import logging

    for name in ("httpx", "httpx2", "httpcore", "httpcore2", "openai", "daphne"):
        logging.getLogger(name).setLevel(logging.WARNING)

    from bench import report

    machine = env.machine()
    banner = (
        f"bench: running on MariaDB {machine.mariadb} at {env.HOST}:{env.PORT}, database "
        f"`{args.database}` ({machine.innodb}); {machine.cores} cores, Python {machine.python}, "
        f"Django {machine.django}, mysqlclient {machine.mysqlclient}"
    )
    print("=" * len(banner[:110]))
    print(banner)
    print("=" * len(banner[:110]))
    q = args.quick or args.smoke
    results = report.Results(machine=machine, quick=q)
    log = print

    if "b0" in only:
        from bench import b0_peers

        print("B0: peers (MLflow, Phoenix) against B1's floor")
        results.rows += b0_peers.run_all(
            runs_per_rep=10 if q else 20, reps=3 if q else 5, database=args.database, log=log
        )
    if "b1" in only:
        from bench import b1_recording

        print("B1: recording cost")
        results.rows += b1_recording.sequential(
            runs_per_rep=20 if q else 60, reps=3 if q else 7, database=args.database, log=log
        )
        results.rows += b1_recording.concurrent(runs=200, reps=2 if q else 5, database=args.database, log=log)
        results.profiles["recorder"] = report.profile_recorder(runs=20)
    if "b2" in only:
        from bench import b2_trace

        print("B2: trace reads")
        rows, evidence = b2_trace.endpoint_vs_raw(
            reads=15 if q else 40, reps=3 if q else 5, database=args.database, log=log
        )
        results.rows += rows
        results.evidence["b2"] = evidence
        big = args.big or (100_000 if q else 1_000_000)
        results.rows += b2_trace.growth(
            small=10_000, big=big, reads=15 if q else 30, reps=3 if q else 5, database=args.database, log=log
        )
        results.evidence["b2_sizes"] = {
            "small": b2_trace.table_sizes(args.database),
            "big": b2_trace.table_sizes(f"{args.database}_big"),
        }
        results.profiles["trace"] = report.profile_trace(database=args.database)
    if "b2s" in only:
        from bench import b2_stages

        print("B2 stages: where a trace read's CPU goes")
        stages = b2_stages.measure(database=args.database, log=log)
        results.evidence["b2_stages"] = stages
        print(b2_stages.markdown(stages))
    if "b3k" in only:
        from bench import b3_checkpointer

        print("B3k: a checkpointer pass beside live recorders in one process")
        found = b3_checkpointer.measure(reps=2 if q else 3, log=log)
        results.evidence["b3k"] = found
        print(b3_checkpointer.markdown(found))
    if "b4" in only:
        from bench import b4_loop

        print("B4: loop overhead")
        results.rows += b4_loop.loop_overhead(runs_per_rep=3 if q else 5, reps=3 if q else 5, log=log)
    if "b3" in only:
        from bench import b3_chat, b3_live

        print("B3: live chats on the chat profile beside the bare SDK (capacity: p99 ≤ 50 ms)")
        if args.smoke:
            size = b3_chat.SMOKE
            rows, evidence = b3_chat.run_all(
                levels=size["ramp"],
                cost_chats=size["cost_chats"],
                tokens=size["tokens"],
                interval=size["interval"],
                log=log,
            )
        else:
            rows, evidence = b3_chat.run_all(
                levels=(10, 25, 50) if q else b3_chat.RAMP, cost_chats=5 if q else b3_chat.COST_CHATS, log=log
            )
        results.rows += rows
        results.evidence["b3_chat"] = evidence
        # B3 alone never writes docs/performance.md: its rows, levels and limits are kept for a reader.
        kept = Path(env.ROOT) / "test-artifacts" / "b3-chat.md"
        kept.write_text(
            "\n\n".join((report._md_table(rows), b3_chat.markdown(evidence), b3_chat.limits(evidence)))
            + "\n",
            encoding="utf-8",
        )
        print(f"  B3 rows, levels and limits kept in {kept.relative_to(env.ROOT)}")
        if args.b3_short:
            print("B3 (short profile, secondary): largest level with p99 extra delay per frame ≤ 50 ms")
            levels = (5, 10, 25, 50) if q else b3_live.SWEEP
            rows, evidence = b3_live.capacity(levels=levels, log=log)
            for row in rows:
                row.name = "short profile (0.8 s runs): " + row.name
                row.target = None  # the targets are the chat profile's
            results.rows += rows
            results.evidence["b3"] = evidence
    if "b3l" in only:
        from bench import b3_live

        print("B3 levers: servers, event loops and draft coalescing side by side")
        evidence = b3_live.levers(levels=(25, 50) if q else (50, 100), reps=2, log=log)
        results.evidence["b3_levers"] = evidence
        print(b3_live.lever_markdown(evidence))

    if "b3p" in only:
        from bench import b3_profile

        print("B3 profile: CPU per run in one daphne")
        evidence = b3_profile.run_all(levels=(50,) if q else (50, 200), chat=args.b3p_chat, log=log)
        results.evidence["b3_profile"] = evidence
        print(b3_profile.markdown(evidence))

    if "b5" in only:
        from bench import b5_tlog

        print("B5: transparency log")
        results.rows += b5_tlog.run_all(database=args.database, quick=q, log=log)
    elif "b5v" in only:
        from bench import b5_tlog

        print("B5: verify_audit beside its floor (full, incremental, peak RSS)")
        results.rows += b5_tlog.verify_rows(database=args.database, quick=q, log=log)

    if "b6" in only:
        from bench import b6_lists

        print("B6: staff lists and list APIs")
        rows, evidence = b6_lists.run_all(
            database=args.database, quick=q, big=args.big or (100_000 if q else 1_000_000), log=log
        )
        results.rows += rows
        results.evidence["b6"] = evidence

    if "b7" in only:
        from bench import b7_aiops

        print("B7: AI Ops analyses")
        results.rows += b7_aiops.run_all(runs_per_rep=3 if q else 6, reps=2 if q else 4, log=log)

    if "b8" in only:
        from bench import b8_otel

        print("B8: trace export")
        results.rows += b8_otel.run_all(runs=50 if q else 200, reps=3 if q else 5, log=log)

    if "b9" in only:
        from bench import b9_replica

        print("B9: reads on a replica (2 processes, primary only vs primary + replica)")
        rows, evidence = b9_replica.run(
            runs=20 if q else 100, seconds=5 if q else 15, reps=2 if q else 3, log=log
        )
        results.rows += rows
        results.evidence["b9"] = evidence

    if "b13" in only:
        from bench import b13_galera

        print("B13: the Galera cluster behind HAProxy (recording vs the single server; a node killed)")
        results.rows += b13_galera.run_all(quick=q, log=log)

    if "b10" in only:
        from bench import b10_mcp

        print("B10: an MCP call through the toolset vs the bare mcp client; a run's CPU, MCP vs native tool")
        results.rows += b10_mcp.measure(n=100 if q else 300, reps=3 if q else 5, log=log)
        results.rows += b10_mcp.run_cpu(runs=5 if q else 15, reps=3 if q else 5, log=log)

    if "b11" in only:
        from bench import b11_retrieval

        print("B11: retrieval quality (recall@1, recall@3, MRR of the expected runbook)")
        rows, evidence = b11_retrieval.run_all(log=log)
        results.rows += rows
        results.evidence["b11"] = evidence

    results.seconds = time.perf_counter() - started
    print()
    print(report.table(results.rows))
    print(f"\nbench: {results.seconds:.0f} s in all")
    if args.smoke:
        print("bench: docs/performance.md not written (smoke size)")
    elif not args.no_write and (not q or args.write) and set(only) == set(ALL):
        path = Path(env.ROOT) / "docs" / "performance.md"
        previous = path.read_text(encoding="utf-8") if path.exists() else ""
        path.write_text(report.markdown(results, previous), encoding="utf-8")
        print(f"bench: wrote {path.relative_to(env.ROOT)}")
    elif {"b6", "b7", "b3p", "b11", "b13"} & set(only) and not args.no_write and (not q or args.write):
        path = Path(env.ROOT) / "docs" / "performance.md"
        for name, write in (
            ("b6", report.write_b6),
            ("b7", report.write_b7),
            ("b3p", report.write_b3p),
            ("b11", report.write_b11),
            ("b13", report.write_b13),
        ):
            if name in only:
                write(path, results)
                print(f"bench: wrote the {name.upper()} section of {path.relative_to(env.ROOT)}")
    elif not args.no_write:
        print("bench: docs/performance.md not written (needs a full run of every benchmark)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
