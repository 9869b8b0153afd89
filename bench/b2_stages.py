"""B2's stages: where a trace read's CPU goes (`python -m bench --only b2s`; not in the default set).

For B2's runs of 10, 100 and 500 events (recorded through the recorder, as B2 records them), each stage
of `GET /api/diagnosis/{sessionId}/trace` is run on its own in this process — the Django and DRF stack
around it (a 404 of the same URL: middleware, session, user, the run lookup), reading the run's rows,
the anchor lookup, pricing, the chain's hashes, the write tags, the row digests, the rest of the
verification, the body — and timed by its CPU (process time, the best of several batches), beside the
whole request's CPU. What the stages leave over is the view's own mapping (the summary, the trace's
filters) and the stages' overlap. Shares, not a ratio: no target.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from bench import b2_trace

SIZES = b2_trace.SIZES


def _cpu_ms(fn: Callable[[], object], calls: int, batches: int = 9) -> float:
    """The best CPU time per call of `batches` batches of `calls` calls (after two warm-up calls)."""
    fn()
    fn()
    best = float("inf")
    for _ in range(batches):
        start = time.process_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.process_time() - start) / calls)
    return best * 1e3


def measure(
    *, database: str | None, sizes: tuple[int, ...] = SIZES, batches: int = 9, log=print
) -> dict[int, dict]:
    """Per run size: the stages' CPU per read (ms) and the run's row counts and body size (`database`
    None: the connection's database as it is)."""
    import logging

    logging.getLogger("django.request").setLevel(logging.ERROR)  # the 404s of the stack's stage
    if database is not None:
        b2_trace.use_database(database)
    user = b2_trace._bench_owner()
    client = b2_trace.login_client(user)
    out: dict[int, dict] = {}
    for target in b2_trace.make_targets(user, sizes=sizes):
        stages, facts = _stages(target, user, client)
        calls = max(4, 600 // target.events) if batches > 1 else 1
        ms = {name: _cpu_ms(fn, calls, batches) for name, fn in stages.items()}
        out[target.events] = {"ms": ms, **facts}
        log(f"  B2 stages: {target.events} events, whole request {ms['whole request']:.2f} ms CPU")
    return out


def _stages(target: b2_trace.Target, user, client) -> tuple[dict[str, Callable[[], object]], dict]:
    from audit.read import trace as read
    from audit.transparency.verify import check_anchor
    from audit.verify import appended_rows, provenance, row_digests
    from audit.verify.authenticity import legacy_vouched_upto, tag_verdict
    from audit.verify.chain_digests import collect
    from audit.verify.hash_chain import verify_chain
    from audit.verify.row_digests import stored_reasoning_rows
    from audit.verify.run_check import anchor_times, reconcile_loaded
    from core import writeauth
    from diagnosis.selectors import get_visible_run
    from surfaces.api.trace_render import trace_json

    rid = target.run_id
    run = get_visible_run(
        user=user, session_id=target.session_id, run_id=rid, with_feedback=True, with_session=True
    )
    events = read.timeline_of(run_id=rid)
    steps, tools = read._STEPS_OF_RUN(rid), read._TOOLS_OF_RUN(rid)
    reasoning, reviews = stored_reasoning_rows(run_id=rid), read._REVIEWS_OF_RUN(rid)
    leaf, tails = read.anchored_leaves(run_id=rid)
    anchors = [lf for lf in (leaf, *tails) if lf is not None]
    book, session = read.load_price_book(), read.session_of(run)
    trace = read.get_trace(run=run)

    def rows():
        read.timeline_of(run_id=rid)
        read._STEPS_OF_RUN(rid)
        read._TOOLS_OF_RUN(rid)
        stored_reasoning_rows(run_id=rid)
        read._REVIEWS_OF_RUN(rid)
        appended_rows.rows_of([rid])

    def digests():
        for s in steps:
            row_digests.STEP.digest_of(s)
        for t in tools:
            row_digests.TOOL.digest_of(t)
        for r in reasoning:
            row_digests.REASONING.digest(r, stored=True)
        for r in reviews:
            row_digests.REVIEW.digest_of(r)
        row_digests.RUN.digest_of(run)
        row_digests.RUN_START.digest_of(run)
        row_digests.SESSION.digest_of(session)

    def verification():
        collect(events)
        reconcile_loaded(run=run, events=events, steps=steps)
        provenance.run_problems(
            run_id=rid,
            session_id=run.session_id,
            events=events,
            anchors=anchors,
            view=None,
            times=anchor_times(anchors),
        )

    def chain():
        for event in events:  # each read formats every event's time once (`StoredEvent.created_text`)
            event._created = None
        verify_chain(events)

    absent = f"/api/diagnosis/{target.session_id}/trace?runId=absent"
    stages = {
        "whole request": lambda: b2_trace.endpoint_read(client, target),
        "Django and DRF around the trace: middleware, session, user, run lookup (a 404)": (
            lambda: client.get(absent)
        ),
        "reading the run's rows: events (details decoded), steps, tools, reasoning, reviews, scores": rows,
        "anchor lookup: the run's leaves with their covering checkpoint (one query), their check": (
            lambda: (
                read.anchored_leaves(run_id=rid),
                check_anchor(run=run, events=events, leaf=leaf, tails=tails, tail_noted=False),
            )
        ),
        "pricing: the price book (one query) and each usage record's cost": lambda: (
            read.load_price_book(),
            read.call_costs_of(run, events, book=book),
        ),
        "chain: every event's hash recomputed (its time formatted)": chain,
        "write tags: every event's HMAC checked": lambda: tag_verdict(
            events, domain=writeauth.RUN, vouched_upto=legacy_vouched_upto(anchors)
        ),
        "row digests: every step, tool, reasoning row and review, the run, its session": digests,
        "the chain's bindings, token reconciliation, provenance": verification,
        "the body: serialisation and JSON encoding": lambda: trace_json(trace),
    }
    facts = {
        "rows": (len(steps), len(tools), len(reasoning)),
        "body": len(trace_json(trace)),
        "anchored": leaf is not None,
    }
    return stages, facts


def markdown(result: dict[int, dict]) -> str:
    sizes = sorted(result)
    head = "| stage (CPU per read) | " + " | ".join(f"{n} events" for n in sizes) + " |"
    lines = [head, "|---|" + "---|" * len(sizes)]
    names = list(result[sizes[0]]["ms"])
    for name in [*names, "rest: the view's mapping, the summary, the stages' overlap"]:
        cells = []
        for n in sizes:
            ms = result[n]["ms"]
            whole = ms["whole request"]
            value = ms.get(name, whole - sum(v for k, v in ms.items() if k != "whole request"))
            cells.append(f"{value:.2f} ms ({value / whole * 100:.0f} %)")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    facts = "; ".join(
        f"{n} events: {r['rows'][0]} steps, {r['rows'][1]} tools, {r['rows'][2]} reasoning rows, body "
        f"{r['body']:,} B{', anchored' if r['anchored'] else ''}"
        for n, r in sorted(result.items())
    )
    return "\n".join(lines) + f"\n\n({facts}.)"
