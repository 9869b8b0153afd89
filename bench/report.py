"""The bench's table, its profiles and docs/performance.md."""

from __future__ import annotations

import datetime as dt
import textwrap
from dataclasses import dataclass, field

from bench.env import Machine
from bench.stats import Row


@dataclass
class Results:
    machine: Machine
    quick: bool
    rows: list[Row] = field(default_factory=list)
    evidence: dict = field(default_factory=dict)
    profiles: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0


def table(rows: list[Row]) -> str:
    head = ("bench", "scenario", "result", "ratio: median (min–max, n)", "target", "met")
    body = [(r.bench, r.name, r.result, r.ratio_text, r.target_text, r.met_text) for r in rows]
    widths = [max(len(str(x[i])) for x in [head, *body]) for i in range(len(head))]
    widths[1] = min(widths[1], 70)
    widths[2] = min(widths[2], 60)
    line = "  ".join("{:<" + str(w) + "}" for w in widths)
    out = [line.format(*head), line.format(*("-" * w for w in widths))]
    out += [line.format(*(str(c)[: widths[i]] for i, c in enumerate(row))) for row in body]
    return "\n".join(out)


def _md_table(rows: list[Row]) -> str:
    out = [
        "| bench | scenario | result | ratio: median (min–max, n) | target | met |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(f"| {r.bench} | {r.name} | {r.result} | {r.ratio_text} | {r.target_text} | {r.met_text} |")
    return "\n".join(out)


# --------------------------------------------------------------------------------------------------
# Profiles (pyinstrument)
# --------------------------------------------------------------------------------------------------
def _excerpt(text: str, lines: int = 45) -> str:
    body = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(body) if ln.lstrip().startswith(("0.", "1.", "2.", "3."))), 0)
    return "\n".join(body[start : start + lines])


def profile_recorder(runs: int = 20) -> str:
    """Wall-clock profile of the recorder recording `runs` full runs one after the other (direct path)."""
    from pyinstrument import Profiler

    from bench import b1_recording, workload
    from diagnosis import services

    inputs = workload.make_inputs()
    session = services.create_session(owner=b1_recording.bench_user(), title="bench profile")
    target = b1_recording.new_runs(session, runs, "profile")
    profiler = Profiler(interval=0.0002)
    profiler.start()
    b1_recording.run_recorder(target, inputs, group_commit=False)
    profiler.stop()
    return _excerpt(profiler.output_text(unicode=True, color=False, show_all=False))


def profile_trace(database: str, events: int = 500, reads: int = 20) -> str:
    from pyinstrument import Profiler

    from bench import b2_trace

    b2_trace.use_database(database)
    user = b2_trace._bench_owner()
    target = b2_trace.make_targets(user, sizes=(events,))[0]
    client = b2_trace.login_client(user)
    b2_trace.endpoint_read(client, target)
    profiler = Profiler(interval=0.0002)
    profiler.start()
    for _ in range(reads):
        b2_trace.endpoint_read(client, target)
    profiler.stop()
    return _excerpt(profiler.output_text(unicode=True, color=False, show_all=False), lines=70)


# --------------------------------------------------------------------------------------------------
# docs/performance.md
# --------------------------------------------------------------------------------------------------
def _b2_explain(evidence: dict) -> str:
    out = []
    for _sql, plan in evidence.get("explain", []):
        table = plan[0].get("table") if plan else "?"
        steps = "; ".join(
            f"{p.get('table')}: type={p.get('type')}, key={p.get('key')}, rows={p.get('rows')}"
            + (f", {p.get('Extra')}" if p.get("Extra") else "")
            for p in plan
        )
        out.append(f"| `{table}` | {steps} |")
    return "\n".join(["| query on | EXPLAIN (MariaDB) |", "|---|---|", *out]) if out else "(not run)"


def _b3_table(evidence: dict) -> str:
    """B3's sweeps (`bench.b3_live.capacity`): every level of every configuration, capacity marked."""
    if not evidence:
        return "(not run)"
    out = [
        "| release, servers | chats | SUCCESS | extra delay per frame p50 | p99 | release latency p99 "
        "| CPU per run | draft frames / chunks | lost records |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, sweep in evidence.items():
        for e in sweep["levels"]:
            mark = " (capacity)" if e["chats"] == sweep["capacity"] else ""
            out.append(
                f"| {name} | {e['chats']}{mark} | {e['succeeded']}/{e['chats']} | {e['p50']:.1f} ms "
                f"| {e['p99']:.1f} ms | {e['release_p99']:.0f} ms | {e['cpu_per_run_ms']:.1f} ms "
                f"| {e['draft_frames']} / {e['chunks']} | {e['missing']} ({e['bad_runs']} runs) |"
            )
    return "\n".join(out)


def b3_chat_markdown(evidence: dict) -> str:
    """B3 on the chat profile (`bench.b3_chat.markdown`): the CPU split and every ramp level."""
    from bench import b3_chat

    return b3_chat.markdown(evidence)


B6_START = "<!-- B6 -->"
B6_END = "<!-- /B6 -->"


def b6_section(res: Results) -> str:
    """The B6 section of docs/performance.md: every list page at both sizes, with its plan."""
    ev = res.evidence.get("b6")
    if not ev:
        return f"{B6_START}\n{B6_END}"
    small, big = ev["sizes"]
    rows = [r for r in res.rows if r.bench == "B6"]
    lines = [
        "| page | "
        + f"{small:,} runs | {big:,} runs | growth | queries | target | met | EXPLAIN at {big:,} runs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for page, row in zip(ev["pages"], rows, strict=True):
        problems = f" **{'; '.join(page['problems'])}**" if page["problems"] else ""
        queries = " / ".join(str(page["queries"][n]) for n in sorted(page["queries"]))
        lines.append(
            f"| {page['name']} | {page['small_ms']:.1f} ms | {page['big_ms']:.1f} ms | "
            f"{row.ratio_text} | {queries} | ≤ {page['limit']:g} ms, ≤ 1.5× | {row.met_text} | "
            f"{page['plan'] or '–'}{problems} |"
        )
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"""{B6_START}
## B6: staff lists and list APIs at {small:,} and {big:,} runs

Measured {when}{" (quick run)" if res.quick else ""} by `python -m bench --only b6` (`bench/b6_lists.py`).
Each page through Django's test client as a logged-in superuser (REST: also as the owner of every
session), in `<db>` ({small:,} background runs) and `<db>_big` ({big:,}), B2's generator with a mix of
statuses, release decisions, intents, providers, failed audit writes (1 %), drafts shown (2 %) and
questions naming Redis (1 %) or in Chinese (1 %), one session per 10 runs; the runs' stored list facts
are what `audit.read.list_facts` decides. Times are medians of the repetitions (each the mean of several
reads), growth is big / small per repetition; queries are per request (small / big: constant per page). The
EXPLAIN column summarises, per table, the access type, the key and the estimated rows of every SELECT
the page sends on the big database (`index … ~N` with a LIMIT reads only up to the LIMIT; a
`filesort` sorts only the rows the key range found); a full scan or a filesort of more than 100 000
estimated rows would be flagged in bold. The machine's buffer pool ({res.machine.innodb}) is far
smaller than the big database, so what a page reads from disk shows.

{chr(10).join(lines)}

A filter that matches fewer runs than one page (100) at {small:,} runs renders fewer rows there than at
{big:,}: its growth is the rendering of the rows missing at the small size, not the table (in this data
set: audit complete "no" matches 10 runs at {small:,} and 1,000 at {big:,}, draft shown and blocked
likewise; the rare word matches 100 runs at {small:,}, found through the FULLTEXT index, and 10,000 at
{big:,}, more than 1,000, so it is searched among the newest 20,000 runs; a substring search reads
the whole table at the small size, which is smaller than its bound of 20,000 runs, and 20,000 at the big
one, whatever the table's size beyond).

How the lists stay flat: stored per-run facts (`audit_complete`, the persisted counts) and session facts
(`run_count`, `last_run_at`) instead of per-row subqueries and GROUP BYs; ascending indexes `(filter,
created_at)` read backwards for `ORDER BY created_at DESC, id DESC` (InnoDB appends the ascending
primary key); a count capped at 10 000 rows without ORDER BY that selects only the primary key (not the
run list's evaluation-score annotations, which would be computed for every counted row); sorting only by
indexed columns, tied by the primary key in the same direction; related rows prefetched by key instead
of joined; date-range filters instead of the date hierarchy; run and session ids by exact or prefix
match on their indexes; question words through the FULLTEXT index when they match at most 1 000 runs,
otherwise (and for Chinese) as substrings among the newest 20 000 runs; REST lists with cursor pages.
{B6_END}"""


B7_START = "<!-- B7 -->"
B7_END = "<!-- /B7 -->"


def b7_section(res: Results) -> str:
    """The B7 section of docs/performance.md: AI Ops analyses through the queue worker."""
    rows = [r for r in res.rows if r.bench == "B7"]
    if not rows:
        return f"{B7_START}\n{B7_END}"
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"""{B7_START}
## B7: AI Ops analyses through the queue worker

Measured {when}{" (quick run)" if res.quick else ""} by `python -m bench --only b7` (`bench/b7_aiops.py`).
Analyses are queued as staff queue them and executed by the real queue worker in one event loop kept up
across repetitions, as in a server process: claim under the lease (`SELECT … FOR UPDATE SKIP LOCKED`),
planner, executor with `query_metrics` on a real Prometheus (Debian's, started by the bench) and
`lookup_knowledge` over the shipped runbooks in one parallel step, its cited report, evidence and semantic
guards, release and self-evaluation, every decision durable. The fake provider takes 300 ms per model
call (4 calls per analysis). Throughput: analyses completed per minute from the first claim to the last
outcome. Overhead: wall time − the model time the runtime measured itself − the tool time it recorded
(the longest tool of each parallel step), per analysis and as a share of wall time (target as B4's).

{_md_table(rows)}

Outside the models and tools an analysis spends its time in its durable decisions
(`innodb_flush_log_at_trx_commit=1`), the ping of a pool connection that was idle through a model call,
and the CPU of the pool thread that writes (canonical JSON, hashing, reasoning encryption). The openai SDK's
own request building and stream parsing, the largest share of the event loop's CPU in a pyinstrument
profile, lies inside the model time the runtime measures (from before the request to the last chunk).
The overhead row also gives the commits and pings per analysis, counted (not timed) at the MySQL
backend's cursor and connection while the worker runs (the worker's claims included; `B7_TRACE=1`
names the decision that paid each commit): they do not move with the machine's load. What the
profile of issue 15's target found and the worker now avoids (`agent/runtime/worker.py`,
`audit/read/list_facts.py`, `audit/write/chain_writer.py`, `agent/runtime/tools/boundary.py`):

* **The hand-over**: the claim's transaction and the next run's first records (RUN_STARTED, the routing
  decision) sat between one analysis and the next. A run now says when its last model call is made; the
  worker claims its next run then and launches it behind a gate that its first model call waits on, so
  both overlap the end of the run before (no more runs call models at once than the worker's slots).
* **The terminal write's stored-facts UPDATE** was compiled by the ORM at every run's finish (several ms
  of CPU); it is compiled once per database.
* **One commit per decision**: 20.3 commits per analysis. A decision that no effect of the run follows
  before its next record (the routing decision, a model step that calls no tool, the plan decisions,
  the evidence and semantic guards' verdicts) is now *held* (`RunContext.hold`, `RunRecorder.hold`):
  chained at once, with the sequence numbers, hash, timestamps and counts of the moment it was decided,
  and committed in one transaction with the run's next write (the count of the next model call before
  its request, the release, another decision). A frame to a reader, the run's end and every read of the
  run's own rows commit what is held first; RUN_FINISHED commits with the terminal row; a step's parallel
  tool starts commit together, in the order of the calls, before any of them runs
  (`RunRecorder.record_together`). A combined write that fails is written again decision by decision, so
  only what fails alone is counted and shown as lost; a fenced one counts one refused write per
  decision. 12.3 commits per analysis (12.5 when the worker claims once more).

Measured and left: what still commits alone is each model call's count before its request (4), the step
that declares the tool calls (their rows name its row id, which only its commit returns), the tool
starts, each tool's terminal (its live frame follows it), the release (the self-evaluation reads it),
the terminal row, RUN_STARTED (its frame follows it) and the worker's claims. **Pings**: the runtime's
database pool used to be a `ThreadPoolExecutor`, which hands each job to the thread idle longest, so most
jobs after a model call paid a ping round trip first (11–19 per analysis). Since the async write path
(issue 19) the pool is `RUNTIME_DB_THREADS` threads with their own queues and a new job goes to the
first idle thread, so one run at a time keeps using one thread and one connection, and a recorder's
concurrent jobs go to the thread of its previous one (parallel tool starts keep their order): 6.1 pings
per analysis. The rule that detects a restarted database is unchanged (a connection idle for longer
than `PING_IDLE_SECONDS` is pinged before its next job; `tests/agent/reliability/test_restart.py`).

Every decision is still durable before the next effect of the run (a model request, a tool run, a frame,
the release) and never after a later decision (a held one commits in the transaction of the next),
fenced by the lease epoch and bound into the chain in order, with gapless sequence numbers; the audit
stays fail-open. The machine is shared (2 cores), so the share moves with the load more than with the
code: the table above is one full `make bench` (its machine and load in the header and the notes).
While the held decisions were built, main (before them) and that change alternated run by run on
2026-12-01 19:12–19:25 UTC, with other sessions' suites on the same cores (`python -m bench --only b7
--no-write` each; load average at each start): 6.36 % / 7.16 % (load 5.0 / 4.5), 8.70 % / 9.52 % (6.0 /
8.0), 8.63 % / 5.63 % (8.5 / 5.6), 3.73 % / 3.63 % (2.8 / 1.9): under load CPU and scheduling dominate
(the runtime's pools use 45–55 ms of thread CPU per analysis, `B7_TRACE=1`; 30 ms of it in the tool
threads, mostly inside the tool time). On the quiet machine, with the held decisions (20.3 → 12.3
commits per analysis), the pool that keeps one connection per run (≈ 12–19 → 6.1 pings) and the trace
path's cheaper row digests and times, the overhead is 37.1 ms per analysis against 49.6 ms (3.76 %)
measured the same way on a quiet machine before them.
{B7_END}"""


B3P_START = "<!-- B3P -->"
B3P_END = "<!-- /B3P -->"


def b3p_section(res: Results) -> str:
    """The B3 profile section of docs/performance.md: one daphne's CPU per run by category."""
    from bench import b3_profile

    evidence = res.evidence.get("b3_profile")
    if not evidence:
        return f"{B3P_START}\n{B3P_END}"
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"""{B3P_START}
## B3 profile: where one daphne's CPU goes per run

Measured {when}{" (quick run)" if res.quick else ""} by `python -m bench --only b3p`
(`bench/b3_profile.py`), on this shared 2-core machine. The B3 harness (fake provider streaming a chunk
every 20 ms, one daphne, N WebSocket chats sent at once) with py-spy attached to the daphne process for
the level (`--gil`: only the thread holding the GIL is sampled, so the samples partition the process's
Python CPU; `--nonblocking`). CPU per run = the process's user + system CPU over the level / runs; a
category's cost = its share of samples × CPU per run. A sample belongs to the knowledge search, the
recorder or the model SDK when any frame of its stack is theirs (they own what runs beneath them: a
`json` frame under the recorder is the recorder's), otherwise to the first of SDK transport (httpx,
httpcore, h11, pydantic, anyio), frames (channels, daphne, autobahn, twisted, the consumer, live
frames), other database work (token authentication, lockout, run setup), thread-pool hops
(concurrent.futures, asgiref, the runtime's pool), runtime and event loop found from the innermost frame
outwards. The SDK is split by whether `openai/_streaming.py` is on the stack (chunk parsing) or not
(request building and HTTP).

{b3_profile.markdown(evidence)}
{B3P_END}"""


def write_b3p(path, res: Results) -> None:
    """Rewrite (or append) the B3 profile section of the existing docs/performance.md."""
    write_section(path, b3p_section(res), B3P_START, B3P_END)


def write_section(path, section: str, start: str, end: str) -> None:
    """Rewrite (or append) one marked section of the existing docs/performance.md."""
    text = path.read_text(encoding="utf-8") if path.exists() else "# Performance\n"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        text = head + section + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text, encoding="utf-8")


def write_b6(path, res: Results) -> None:
    """Rewrite (or append) the B6 section of the existing docs/performance.md."""
    write_section(path, b6_section(res), B6_START, B6_END)


def write_b7(path, res: Results) -> None:
    """Rewrite (or append) the B7 section of the existing docs/performance.md."""
    write_section(path, b7_section(res), B7_START, B7_END)


B11_START = "<!-- B11 -->"
B11_END = "<!-- /B11 -->"


def b11_section(res: Results) -> str:
    """The B11 section of docs/performance.md: retrieval quality on the paraphrase set and the scenarios."""
    from bench import b11_retrieval

    evidence = res.evidence.get("b11")
    if not evidence:
        return f"{B11_START}\n{B11_END}"
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")

    def table(scores: dict) -> str:
        out = ["| group | n | recall@1 | recall@3 | MRR |", "|---|---|---|---|---|"]
        for key in sorted(scores, key=lambda k: (k != "all", k)):
            s = scores[key]
            out.append(f"| {key} | {s.n} | {s.recall1:.3f} | {s.recall3:.3f} | {s.mrr:.3f} |")
        return "\n".join(out)

    scenarios = evidence["scenarios"]
    skipped = evidence["skipped"]
    scenario_text = (
        table(scenarios)
        if scenarios.get("all") and scenarios["all"].n
        else "No scenario with a question and an expected runbook yet."
    )
    misses = "\n".join(f"- {line}" for line in evidence["misses"]) or "- none"
    r1, r3 = b11_retrieval.TARGET_R1, b11_retrieval.TARGET_R3
    return f"""{B11_START}
## B11: retrieval quality

Measured {when} by `python -m bench --only b11` (`bench/b11_retrieval.py`): every question
is asked of `search_knowledge` (the `lookup_knowledge` tool's search, top 10 chunks) over the shipped
runbooks, and the rank of the first expected runbook (each runbook at the rank of its best chunk) gives
recall@1, recall@3 and MRR. A ranking, not a timing: the same on every machine. Targets on the paraphrase set
(`benchmarks/retrieval/questions.yaml`): recall@1 ≥ {r1:g}, recall@3 ≥ {r3:g};
`holdout` is the part written with the rest before any tuning and never tuned on;
`cross-language` = the question's language differs from every expected runbook's.

**Paraphrase set**

{table(evidence["paraphrase"])}

Questions whose expected runbook is not first:

{misses}

**Incident scenarios' questions** (`benchmarks/incidents/*/scenario.yaml`; {len(skipped)} skipped: no
question, or `expected.runbooks: []`)

{scenario_text}
{B11_END}"""


def write_b11(path, res: Results) -> None:
    """Rewrite (or append) the B11 section of the existing docs/performance.md."""
    write_section(path, b11_section(res), B11_START, B11_END)


B13_START = "<!-- B13 -->"
B13_END = "<!-- /B13 -->"


def b13_section(res: Results) -> str:
    """The B13 section of docs/performance.md: the Galera cluster behind HAProxy (its rows)."""
    rows = [r for r in res.rows if r.bench == "B13"]
    if not rows:
        return f"{B13_START}\n{B13_END}"
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"""{B13_START}
## B13: the Galera cluster behind HAProxy

Measured {when} by `python -m bench --only b13` (`bench/b13_galera.py` says how): the three nodes of
`scripts/mariadb-galera.sh` and HAProxy on the same 2-core machine as the single server and the bench, so
the ratio shows what synchronous replication costs each commit here (certification and the group's
round trip on loopback, three servers sharing two cores), not a networked cluster's latency. In `make
bench`'s default set (it starts the cluster itself); no target in issue 48: the rows report.

{_md_table(rows)}
{B13_END}"""


def write_b13(path, res: Results) -> None:
    """Rewrite (or append) the B13 section of the existing docs/performance.md."""
    write_section(path, b13_section(res), B13_START, B13_END)


NOTES_START = "<!-- NOTES -->"
NOTES_END = "<!-- /NOTES -->"


def kept_section(text: str, start: str, end: str) -> str:
    """The marked section of an existing docs/performance.md, markers included ("" when absent)."""
    if start in text and end in text:
        return start + text.split(start, 1)[1].split(end, 1)[0] + end
    return ""


def _row(res: Results, bench: str, prefix: str) -> Row | None:
    return next((r for r in res.rows if r.bench == bench and r.name.startswith(prefix)), None)


def _ms(spread_value, places: int = 1) -> str:
    return "–" if spread_value is None else f"{spread_value.median:.{places}f} ms"


def limits_section(res: Results) -> str:
    """What bounds B1, B2 and B3 (issue 19's targets), with the figures of this run where it measured
    them: the process CPU per concurrent run, the endpoint's CPU per read, B3's CPU per run per level."""
    concurrent = _row(res, "B1", "200 concurrent runs, one asyncio process, group commit")
    extra = concurrent.extra if concurrent else {}
    cpu, floor, bound = extra.get("cpu_ms_per_run"), extra.get("floor_ms_per_run"), extra.get("bound")
    if cpu is not None and floor is not None and bound is not None:
        b1c = (
            f"In this run the process spent **{cpu.median:.2f} ms of CPU per run** "
            f"({cpu.low:.2f}–{cpu.high:.2f}) against a floor of {floor.median:.1f} ms per run "
            f"({floor.low:.1f}–{floor.high:.1f}), so the speed-up cannot exceed floor / CPU = "
            f"{bound.median:.2f}× ({bound.low:.2f}–{bound.high:.2f}×, per repetition) on this machine"
        )
    else:
        b1c = "This run did not measure B1 concurrent"
    b2_lines = []
    for n in (10, 100, 500):
        row = _row(res, "B2", f"trace endpoint vs raw SQL, run of {n} events")
        if row is not None and "cpu_ms" in row.extra:
            b2_lines.append(
                f"{n} events: endpoint CPU {_ms(row.extra['cpu_ms'], 2)} per read, floor "
                f"{_ms(row.extra.get('floor_ms'), 2)} wall"
            )
    b2 = "; ".join(b2_lines) if b2_lines else "not measured in this run"
    sweep = res.evidence.get("b3", {}).get("draft / one process, in-memory layer")
    if sweep and sweep.get("levels"):
        first = sweep["levels"][0]
        cpus = sorted(e["cpu_per_run_ms"] for e in sweep["levels"])
        cpu_run = cpus[len(cpus) // 2]
        b3 = (
            f"In this run a chat's run took {first['wall']:.1f} s at {first['chats']} chats and cost "
            f"{cpu_run:.0f} ms of CPU (median over the levels): one core is saturated near "
            f"{first['wall'] * 1000 / cpu_run:.0f} concurrent chats, and 200 chats inside the same "
            f"{first['wall']:.1f} s would need ≤ {first['wall'] * 1000 / 200:.1f} ms of CPU per run, "
            f"about {cpu_run / (first['wall'] * 1000 / 200):.0f}× less"
        )
    else:
        b3 = "B3 did not run"
    if res.evidence.get("b3_chat"):
        from bench import b3_chat

        short = f" On the short profile (0.8 s runs): {b3}" if sweep and sweep.get("levels") else ""
        b3 = b3_chat.limits(res.evidence["b3_chat"]) + short
    text = f"""**B1, one run at a time (≤ 1.3×).** The floor pays one redo-log flush per record (45 per run);
the recorder pays one per decision (21 per run: a decision's rows share a transaction, sent on MariaDB
as one compound statement, one round trip) plus its Python work, serial with those round trips. The
ratio therefore depends on the machine's commit latency: where a commit costs ≈ 0.5 ms (a floor of
≈ 20–40 ms per run) it is ≈ 1.0–1.2×, where commits are fast (a floor of 10–15 ms) ≈ 2×, because the
recorder's CPU per run (≈ 6–9 ms; 21.98 M instructions per run since 2026-12-02, 25.70 M before) is
then most of it. Bound: CPU per run against the floor; the limit needs the CPU below ≈ 0.3× the
floor. Profile: "Recorder" under Profiles below.

**B1, 200 concurrent runs (≥ 3×).** Bound by the process's CPU under the GIL, not by the database:
under group commit every decision suspends its greenlet on its pool thread, the `audit-writer` thread
commits the queued ops of every run in one compound transaction (≈ 80 ops per batch) and each job
resumes on its own thread, every decision still durable before the run's next one. {b1c}. The split of
that CPU (2026-12-02, per-thread CPU time over 4 × 200 runs): the recorder's work in the job greenlets
≈ 75 % (events, canonical JSON, hashes, row digests, Fernet, the compound statement's rows, `finish`'s
reconciliation and pricing reads), the batch writer ≈ 13 %, the event loop and the hand-offs ≈ 12 %.
Next lever: the same per-decision recorder work as one at a time — the remaining cost is spread over
hundreds of small Python steps per decision (no step is above ≈ 5 %), so the next large step is
structural: one canonical encoding per bound row shared by its digest and its stored JSON, and the
recorder's decisions run on the event loop itself with only the commit and the reads handed to
threads (one hand-off per decision instead of two). Group commit stays **off by default**
(`AUDIT_GROUP_COMMIT`); two batch writers measured no gain.

**B2, trace read (≤ 2×).** The floor reads rows; the endpoint also runs Django's middleware and DRF's
dispatch, loads the session and the user, verifies the whole hash chain, every write tag and every bound
row's digest on every read (no cache of data), and encodes the body. Already done: each event's hash
checked over its details as stored (the canonical JSON that was hashed) and the body carrying that text;
rows read as values through queries compiled once per process (`core.compiled`), the run's evaluation
scores too; the session and user reads compiled the same way; each bound row's digest written as its
canonical text directly; each event's time formatted once for its hash and its body; MySQL date-times
parsed in C (`core.mysql_conversions`, and the floor's raw connection parses them the same way). This run:
{b2}. Where the CPU goes (`python -m bench --only b2s`; measured 2026-12-06 under *Measured by hand*):
at 10 events the stack the trace runs in (a 404 of the same URL: the test client, middleware, DRF, the
session, the user, the run lookup) costs 1.1–1.3 ms of CPU, more than the floor's whole read, so 2× is
out of reach there while that stack stays; at 500 events reading the rows is 23–28 % of the CPU, the row
digests 15–17 %, the body 12–13 %, the chain ≈ 7 %, the write tags, pricing and the bindings ≈ 4 % each,
the stack ≈ 5 %. No stage repeats another's work now; each is Python per row over ≈ 1 000 rows (500
events, 82 steps, 164 tools, 82 reasoning rows, their ≈ 1 300 date-times), which the floor does not pay
beyond the driver's conversion. Next levers: the time columns read as stored text (the form the digests
and the chain hash) instead of date-times parsed and formatted again, and one pass per event making its
hash payload, its tag check and its body text together; 2× at 500 events needs the per-row work cut by
more than half again.

**B3, live capacity (chat profile: ≥ 200 chats per process in both release modes, CPU per chunk ≤ 1.5×
the bare SDK, fixed CPU per run ≤ 20 ms, two processes ≥ 1.8× one).** One daphne process is one
Python thread of CPU for everything: each run makes 4 model calls through the SDK (request building,
SSE decoding, each chunk's JSON read as a view: `agent.runtime.lean_chunks`), a dozen durable
decisions, a knowledge search, and for every streamed chunk a delta, a local hand-off to the run's
follower and a WebSocket frame. {b3}. The B3 profile section below
splits a run's CPU (2026-12-02, 82–88 ms per run: the model SDK 33–43 %, the recorder 16–24 %, the
run's other database work through the ORM — the chat's start, the token's scope, the claim, the lease
renewals, the previous turns — 12–14 %, the event loop 8–10 %, frames and the channel layer 4–8 %). No
single lever closes a gap of this size: the SDK's share needs a leaner client for the one provider shape (the
stack fixes the official `openai` SDK), the recorder's its structural change above, the ORM reads can be
compiled once as the trace's are (`core.compiled`). On Redis the channel layer (`channels_redis`' core
layer: a sorted set per channel, a Lua clean-up script and a blocking pop per receive) costs ≈ 80 ms
more CPU per run than the in-memory layer, so one process on Redis holds fewer chats than without it;
the next lever there is one Redis subscription per process (`channels_redis`' pub/sub layer) for the
live frames, whose losses the followers' database catch-up already covers. Nothing is lost at any
level."""
    # The figures of the run make some lines long: each paragraph is wrapped again.
    return "\n\n".join(
        textwrap.fill(" ".join(p.split()), 105, break_long_words=False, break_on_hyphens=False)
        for p in text.split("\n\n")
    )


def markdown(res: Results, previous: str = "") -> str:
    """The whole docs/performance.md of a full run. `previous` is the file it replaces: its dated notes
    (and the B3 profile, when this run did not profile) are carried over as written."""
    notes = kept_section(previous, NOTES_START, NOTES_END) or f"{NOTES_START}\n{NOTES_END}"
    if res.evidence.get("b3_profile"):
        profile = b3p_section(res)
    else:
        profile = kept_section(previous, B3P_START, B3P_END) or f"{B3P_START}\n{B3P_END}"
    m = res.machine
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    sizes = res.evidence.get("b2_sizes", {})
    size_lines = "\n".join(
        f"- `{name}` database: " + ", ".join(f"{k} {v:,}" for k, v in s.items()) for name, s in sizes.items()
    )
    b2q = res.evidence.get("b2", {}).get("queries", {})
    queries = ", ".join(f"{k} events → {v}" for k, v in b2q.items()) or "–"
    return f"""# Performance

Generated by `make bench` (`python -m bench`) on {when}{" (quick run)" if res.quick else ""}; the whole
run took {res.seconds / 60:.1f} min. Every figure is a **ratio measured side by side in one run**, the
median of several repetitions with min and max; the machine is shared and noisy, so absolute times vary
from run to run and only the ratios are compared with targets. Re-run it to reproduce the table.

## Machine

{chr(10).join(m.lines())}
- The bench runs on its own databases `diagnosis_bench`, `diagnosis_bench_big` (B2's million runs) and
  `diagnosis_bench_live` (B3's chats alone; created and migrated by the bench), with production settings
  (`DEBUG=false`, persistent connections `DB_CONN_MAX_AGE=300`).

## Results

{_md_table(res.rows)}

## Method

**B1 recording cost.** A full run's records — 23 timeline events, 4 model steps with their 4 reasoning
rows, 3 tool rows (inserted `RUNNING`, then updated once to their terminal status) and 7 updates of the
run row — recorded through `RunRecorder` exactly as the runtime records them (`bench/workload.py`, built
like `tests/factories.py::record_full_run`). Every recorder method returns only when its decision is
durable (committed; `innodb_flush_log_at_trx_commit=1`). **Floor**: the recorder's own rows, captured
statement by statement (with the same values: ciphertexts, JSON, timestamps), replayed for a fresh run id
as single-row autocommit statements over a raw `MySQLdb` connection in the same process — one durable
statement per record, no Python work but the driver's; it has 44 statements (records, and the
update of the run's stored list facts) per run.
Repetitions alternate which side runs first. *Concurrent*: 200 runs recorded at once from one asyncio
loop, every decision awaited through the runtime's database pool (`agent.runtime.db.db`, 8 threads
by default), with and without group commit; the figure is the floor's time per record divided by the
concurrent wall time per record (a speed-up). After each scenario every run is checked: stored counts
equal expected, no write failure, hash chain valid.

**B2 trace read.** `GET /api/diagnosis/{{sessionId}}/trace?runId=…` through Django's test client (all
middleware, session authentication of the run's owner, the DRF view, selectors, chain verification,
serialisation, JSON), for runs of 10, 100 and 500 events recorded through the recorder; **floor**: a raw
`MySQLdb` connection fetching the same rows (the session and user rows that authenticate the request,
the run, its events, steps and tools, and what the endpoint reads besides to verify the run: its
reasoning rows and its log leaf with the covering checkpoint; `SELECT *`) with the same WHERE and ORDER
BY. Floor and endpoint reads are interleaved call by call, so both see the same load. Queries per
request: {queries}.
*Scale*: the same reads with 10 000 and with 1 000 000 background runs stored, bulk-generated server side
(`INSERT … SELECT` from MariaDB's `seq_1_to_N` tables, 50 000 runs per statement), each background run
with 1 run row, 3 timeline events, 1 step and 1 tool row of realistic sizes, one session per 10 runs. The
large data set lives in `diagnosis_bench_big` and is kept between runs (building it takes minutes once);
reads alternate between the two databases within every repetition.

{size_lines}

**B3 live chats on the chat profile** (`bench/b3_chat.py`, issue 36; the headline of B3). The fake
provider (`python -m bench.provider`, its own process) paces every run by a *profile*: **chat** — each
of a run's 4 model calls (router, the agent's tool call, the agent's answer, the semantic guard) streams
300 output tokens, one token per chunk, 50 chunks/s per stream, so a run lasts ≈ 25 s as a user's does;
**short** — the earlier pacing (the answer in 20 chunks 20 ms apart, the other calls in 2–3 chunks at
once; a run lasts ≈ 0.8 s). The provider writes the wall-clock time at which it *sends* a chunk into
every answer chunk, and prints the send time of the guard call's last token; the finish reason and the
usage follow a stream's last token at once, as a real provider sends them (until 2026-12-03 they were
paced too, which put 40 ms of provider pacing into every release overhead). **Floor**
(`bench/b3_floor.py`): the bare `openai` SDK (`AsyncOpenAI`, streaming, usage requested, one pooled
client) consuming exactly the same streams from the same provider — the same four requests per run with
the runtime's message shapes — N runs at once in its own process, nothing else in it. *Cost split*: a
run's CPU is a fixed part plus a part per chunk, and the two profiles differ only in their chunks
(≈ 1 230 against ≈ 35 per run), so 10 runs at once on the chat profile and 3 × 10 on the short one give
both parts, for one daphne (the servers' CPU time, `/proc`) and for the floor alike: *CPU per chunk* =
(CPU per chat run − CPU per short run) / (chunks per chat run − chunks per short run), *fixed CPU per
run* = CPU per short run − its chunks × CPU per chunk; the rows give the server's figures with their
ratios to the floor's. *Capacity*: a ramp — clients are added level by level (10, 25, 50, 100, 200, 300
chats), each client chatting run after run, the new ones starting spread over the level's first fifth of
a run; each level is then held for one run length (longer, up to twice, until as many outcomes arrived
in the window as there are clients) and measured over that window. Under draft release the figure is
the *extra delay per draft frame*: time the client received a `draft` frame − time the provider sent
each chunk it carries, so the pacing itself is never counted. Under verified release it is the
*release overhead*: time the client received the outcome − time the provider sent the guard model's
last token, so the guard's own model time (reported beside it) is out of it. The ramp stops at the first
level whose p99 exceeds 50 ms or that failed a run; capacity is the level before. Configurations, for
each release mode: one process on the in-memory layer, one and two processes on the Redis layer (the
clients split across the two), one MariaDB. Afterwards every run's records are checked (stored
counts, write failures, the hash chain). *Loop lag*: every server samples its event loop every 5 ms
(`LOOP_LAG_SAMPLE_MS`, `telemetry.loop_lag`: how late a timer that fell due woke) into a histogram on
its /metrics, read before and after each level's window; the rows give the bucket holding the p99, the
samples over 10 ms and the longest's bucket, at the level held (or the first level when none was).
*Bound*: one core feeds at most 1 ÷ (CPU per chat-second) chats — a chat run's CPU over its length, from
the cost batch for the server and from the floor's batch for the bare SDK — and the rows give the chats
held ÷ the server's bound (target ≥ 0.9). `--smoke` shrinks the profile (20-chunk calls at 100/s), the
ramp (2, 4) and the cost batches (2 runs); `--quick` ramps to 50. On a 2-core machine the provider and
the clients share the cores with the servers: the servers' CPU per level is in the table, and the
provider's pacing under load is visible in the guard model's time (nominally 6.1 s); two processes are
reported with the cores the machine has, which they share with the provider and the clients.

**B3 on the short profile** (secondary, `--b3-short`). ASGI servers on `config.asgi:application`
(production settings; daphne unless
said), the fake provider in its own process (`python -m bench.provider`, which streams every response a
chunk every 20 ms and writes the wall-clock time at which it *sends* a chunk into the chunk's text), and
N authenticated WebSocket clients (`websockets`, DRF token in the handshake) in the bench process: all
connect, then all send their `chat` frame at once. *Extra delay per frame*: under draft release, time
the client received a `draft` frame − time the provider sent each chunk it carries; under verified
release (no answer text before the outcome) the outcome's release latency − the same latency of one
chat alone on the same servers. *Release latency*: outcome at the client − the provider's send time of
the released answer's last chunk. *Capacity*: the sweep 5, 10, 25, 50, 100, 150, 200 chats stops at the
first level whose p99 extra delay per frame exceeds 50 ms (or that loses a record or a run); capacity is
the level before it. Configurations: one process on the in-memory layer; one and two processes on the
Redis channel layer (`REDIS_URL`, the clients split across the two), one MariaDB. CPU per run: the
servers' CPU time over the level / N. Records lost: for every run, stored events/steps/tools vs the
recorder's expected counts, write failures and the hash chain. `--only b3l` runs the levers side by side
(daphne or uvicorn, asyncio or uvloop, draft coalescing), alternating configurations.

**B4 loop overhead.** Full diagnosis runs executed one after another in one event loop by the real
runtime (lease, router, agent loop with the real `lookup_knowledge` tool over the shipped runbooks,
guards, release, every decision recorded durably) against the fake provider taking 300 ms per model call.
Outside the model = the run's wall time − the time its model calls took as the runtime itself measured
them (request sent → stream ended).

**B11 retrieval quality** (issue 47). Not a timing: each question of
`benchmarks/retrieval/questions.yaml` (and each incident scenario's question with an expected runbook)
is asked of `search_knowledge` over the shipped runbooks indexed in memory
(`corpus_from_folder("runbooks")`, the same index `load_knowledge` gives), and recall@1, recall@3 and MRR
of the first expected runbook are reported overall, held out / tuning, per language, per kind and
cross-language; one repetition, since a ranking does not vary. Its section below lists every question
whose runbook is not first. `tests/agent/knowledge/test_retrieval_quality.py` asserts the targets.

**B5 transparency log.** A log of 10 000 and of 1 000 000 leaves is built directly (synthetic leaf
data, RFC 9162 hashes and every complete subtree computed in Python and bulk-inserted, then signed); each
repetition adds 1 000 finished runs (bulk-inserted run rows with a valid two-event chain) and times
`checkpoint()` appending them and signing. Proof latency: inclusion and consistency proofs of random
leaves and sizes from the stored tree, with the rows read; bundle latency: `build_bundle` of an anchored
run. `verify_audit` (`bench/b5_verify.py`): over 10 000 runs recorded through the recorder (B1's
workload) and anchored, plus 1 000 recorded after a full verification wrote its state file (`--quick`:
1 000 + 100), beside its floor measured in the same repetition (a raw SQL scan of every column of the
tables it reads + SHA-256 over the same bytes): `--all` with 1 and 2 workers (× the floor), incremental
from the state file with 1 and 2 workers (seconds for the new runs) and from the state it wrote (nothing
new, 1 and 2 workers: the fixed cost), and the peak RSS of a `manage.py verify_audit --all` process and
its workers (their `VmHWM`, sampled from /proc while they run). Incremental at 1,000,000 runs is composed
of measured parts (a store that size is not buildable here through the recorder): the fixed cost with 2
workers less its watermark count, that count timed per table on B2's 1,000,000-run store, scaled to this
workload's rows per table and spread over 2 connections as `verify_audit --workers 2` spreads it, and
10,000 × the cost per new run with 2 workers; once with the machine's buffer pool and once with the pool
resized online to hold the counted indexes (4 GiB, set back after). The 1 000 000-leaf log is kept
between runs (`<db>_tlog_big`), as is the verified store (`<db>_verify_<runs>`, its state under
`.local/bench/`).

### EXPLAIN of every query the trace endpoint sends (500-event run)

{_b2_explain(res.evidence.get("b2", {}))}

### B3 on the chat profile: CPU split against the bare SDK, and every level of every ramp

{b3_chat_markdown(res.evidence.get("b3_chat", {}))}

### B3 on the short profile, per level (secondary, `--b3-short`; a sweep stops at the first failing level)

{_b3_table(res.evidence.get("b3", {}))}

{notes}

{b6_section(res)}

{b7_section(res)}

{b11_section(res)}

{profile}

## What limits each figure

{limits_section(res)}

**B3, verified release.** Under the default release policy no chunk is forwarded to the reader, so the
figure that matters is the wait between the answer's last token and the outcome: the evidence check (a
canonical-store lookup), the semantic guard's model call, the release and finish decisions (two durable
writes) and the outcome frame. The guard's model call is the provider's time, not the runtime's: on the
chat profile the capacity figure is the *release overhead*, counted from the guard model's last token
(the provider's send time), and the guard's own time is reported beside it; what remains grows with the
process's CPU queue and the database pool's, as the draft figures do. (The short profile's release
latency, secondary, still includes the guard's call.)

**B4.** Outside the model a run spends its time in ~20 durable decisions (one round trip each, awaited
through the database pool), the claim and lease, the knowledge search, and handing tool results and
frames around.

**B5.** Checkpointing is bound by the candidate query and the bulk INSERTs of 1 000 leaves and about
1 000 nodes (15 queries per checkpoint, whatever the log's size: the right edge read is O(log n) rows);
a proof reads O(log n) nodes in two indexed queries (29 rows at 1 000 000 leaves), so it grows with
log n only. `verify_audit` spends its time re-reading and re-hashing every run's rows and chain.

## Profiles

Recorder, direct path, 20 full runs (pyinstrument, wall clock; the remaining time is the database):

```
{res.profiles.get("recorder", "(not run)")}
```

Trace endpoint, 500-event run, 20 reads (pyinstrument):

```
{res.profiles.get("trace", "(not run)")}
```

## Running it

`make bench` (or `.venv/bin/python -m bench`) starts MariaDB if needed (`scripts/mariadb.sh`), creates
and migrates `diagnosis_bench`, runs B1–B7 and B11 and writes this page; `--quick` runs short repetitions (B2
growth to 100 000 runs, B3's ramp up to 50 chats) without writing it; `--only b1,b4` runs a subset;
`--only b3` runs B3 on the chat profile alone (≈ 12 min; `--smoke` shrinks it to ≈ 2 min,
`--b3-short` adds the short-profile sweep);
`--only b11` measures retrieval quality alone (seconds) and rewrites its section;
`--only b3p` profiles one daphne under 50 and 200 chats with py-spy and rewrites its section
(`--b3p-chat`: on the chat profile's ≈ 25 s runs).
`--only b3l` runs B3's levers side by side (daphne or uvicorn, asyncio or uvloop, draft coalescing;
uvicorn is a development dependency, skipped when absent). The profilers are
pyinstrument and py-spy (pinned in `requirements-dev.txt`). To compare two versions of a hot path on a
noisy machine, count instructions instead of timing: `python -m bench.instructions recorder` (one B1
run, one at a time), `concurrent` (one of 150 runs under group commit), `trace10` / `trace500` (one
trace read); callgrind, repeatable within ≈ 0.2 %, 1–3 minutes each, `--annotate` for the C-level
functions that cost the most. `tests/bench/test_bench_smoke.py` runs the cheapest scenarios with tiny
sizes in the test suite so that the bench cannot rot.
"""
