"""B4 — the agent loop's own cost: share of a run's wall time spent outside the model.

Full diagnosis runs are executed in this process by the real runtime (`executor.execute_run`: lease,
router, agent loop with the real `lookup_knowledge` tool over the shipped runbooks, evidence and semantic
guards, release, every decision recorded durably) against the local fake provider, which takes exactly
`call_seconds` (300 ms) per model call. Runs follow each other in one event loop, as in a server process.
Time outside the model = the run's wall time (claim to outcome) − the time its model calls took as the
runtime measured them itself (request sent → stream ended: router attempts, agent steps, semantic guard);
it is the loop's own work: lease, recording every decision durably, the tool, guards, scheduling.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.test.utils import override_settings

from agent.runtime.events import NullSink
from agent.runtime.executor import execute_run, prepare_run
from agent.runtime.llm import aclose_clients
from agent.runtime.supervisor import settle
from bench.provider import BenchProvider
from bench.stats import Row, spread
from tests.fakes.openai_server import FakeLLMServer

RUNBOOKS = Path(settings.BASE_DIR) / "runbooks"


def load_runbooks() -> None:
    import io

    call_command("load_knowledge", str(RUNBOOKS), stdout=io.StringIO())


def model_seconds(run_id: str) -> float:
    """The run's model-call time as the runtime itself measured it (request sent → stream ended): router
    attempts, agent steps and the semantic guard."""
    from audit.models import AgentStep, EventType, TraceEvent

    total_ms = sum(
        d or 0 for d in AgentStep.objects.filter(run_id=run_id).values_list("duration_ms", flat=True)
    )
    for details in TraceEvent.objects.filter(
        run_id=run_id, event_type__in=[EventType.ROUTING_ATTEMPT, EventType.SEMANTIC_GUARD_DECISION]
    ).values_list("details", flat=True):
        total_ms += details.get("durationMs") or 0
    return total_ms / 1000


def run_batch(user, n: int) -> list[tuple[float, str, str]]:
    """Execute `n` runs one after the other in one event loop (as a server process would, reusing the
    SDK client and its connections); (wall seconds, run id, release decision) each."""

    async def main():
        out = []
        try:
            for _ in range(n):
                run = await asyncio.to_thread(
                    prepare_run, user=user, query="Why is MySQL replication lagging on the replica?"
                )
                start = time.perf_counter()
                outcome = await execute_run(run_id=run.run_id, sink=NullSink())
                wall = time.perf_counter() - start
                if outcome.status != "SUCCESS":
                    raise RuntimeError(f"bench run ended {outcome.status}")
                out.append((wall, run.run_id, outcome.release_decision or ""))
        finally:
            await aclose_clients()
        return out

    return asyncio.run(main())


def loop_overhead(*, runs_per_rep: int, reps: int, call_seconds: float = 0.3, log=print) -> list[Row]:
    from bench.b1_recording import bench_user

    load_runbooks()
    user = bench_user()
    provider = BenchProvider(call_seconds=call_seconds)
    shares, overheads = [], []
    decisions = set()
    with FakeLLMServer(handler=provider) as server, override_settings(**provider.settings(server.base_url)):
        run_batch(user, 1)  # warm-up: index, SDK client, connections
        settle()  # as a server after start-up (`config.asgi`): its heap out of the full passes
        for rep in range(reps):
            walls, model = 0.0, 0.0
            for wall, run_id, release in run_batch(user, runs_per_rep):
                decisions.add(release)
                walls += wall
                model += model_seconds(run_id)
            outside = walls - model
            shares.append(outside / walls * 100)
            overheads.append(outside / runs_per_rep * 1e3)
            log(
                f"  B4 rep {rep + 1}/{reps}: {walls / runs_per_rep * 1e3:.0f} ms per run, "
                f"{model / runs_per_rep * 1e3:.0f} ms in model calls, "
                f"{outside / runs_per_rep * 1e3:.1f} ms outside ({shares[-1]:.2f} %)"
            )
        if server.errors:
            raise RuntimeError(f"fake provider errors: {server.errors}")
    calls_per_run = len(provider.calls) // (reps * runs_per_rep + 1)
    return [
        Row(
            "B4",
            f"loop overhead at {call_seconds * 1e3:.0f} ms per model call ({calls_per_run} calls per run)",
            f"{spread(overheads).median:.1f} ms per run outside the model calls; "
            f"release {', '.join(sorted(decisions))}",
            spread(shares),
            3.0,
            ratio_unit=" %",
        )
    ]
