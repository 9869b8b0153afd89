"""Running an experiment: every item of a dataset version replayed through the real runtime under a
candidate configuration (issue 34 item 4).

`run_experiment(dataset=…, candidate=…, user=…)` applies the candidate (or `CandidateError`, nothing
written), then replays each item, in order, as a new run in a session of its own, executed by
`execute_run` like any run: recorded, chained, fingerprinted, marked `experiment` and so sandboxed (a tool
that changes the world is not executed: `agent.runtime.replay`), then scores the replays and the source
runs still stored with the same evaluators; a multi-turn item is replayed without its earlier turns.
Details: docs/experiments.md, *Experiments*.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager

from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from agent.knowledge.retrieval import knowledge_snapshot
from agent.runtime.candidate import Applied, Candidate, apply_candidate
from agent.runtime.configuration import effective_configuration
from agent.runtime.events import NullSink
from agent.runtime.executor import execute_run, redact_query
from agent.runtime.llm import ModelClient, aclose_clients
from agent.runtime.providers import get_model_client
from agent.runtime.tools.registry import FLOW_CHAT, default_registry
from diagnosis import services
from diagnosis.models import AgentFlow, RunPurpose
from experiments import scoring
from experiments.models import Dataset, DatasetItem, Experiment, ExperimentRun, ExperimentStatus

logger = logging.getLogger(__name__)
ERROR_CHARS = 500


def _applied(candidate: Candidate, client: ModelClient, flow: str) -> Applied:
    return apply_candidate(candidate, client=client, registry=default_registry(flow=flow))


def _replay(item: DatasetItem, *, applied: Applied, user: AbstractBaseUser) -> str:
    flow = item.agent_flow if item.agent_flow in AgentFlow.values else AgentFlow.DIAGNOSIS_AGENT
    query, redaction = redact_query(services.validate_query(item.question))
    session = services.create_session(owner=user, title=f"experiment: {query}", purpose=RunPurpose.EXPERIMENT)
    run = services.create_run(session=session, query=query, agent_flow=flow, redaction=redaction)

    async def main() -> None:
        try:
            await execute_run(
                run_id=run.run_id,
                sink=NullSink(),
                client=applied.client,
                registry=applied.registry,
                run_prompts=applied.prompts,
                corpus=applied.corpus,
                replay_of=item.source_run_id,
            )
        finally:
            await aclose_clients()

    asyncio.run(main())
    return run.run_id


def run_experiment(
    *,
    dataset: Dataset,
    candidate: Candidate,
    user: AbstractBaseUser,
    name: str = "",
    client: ModelClient | None = None,
    around: Callable[[DatasetItem], AbstractContextManager] | None = None,
) -> Experiment:
    """Replay `dataset` under `candidate` (see the module docstring); returns the finished experiment.
    `around(item)`, when given, is entered around each item's replay (the incident benchmark loads the
    item's world there: `experiments.benchmark.world`)."""
    client = client if client is not None else get_model_client()
    flows = set(dataset.items.values_list("agent_flow", flat=True)) or {FLOW_CHAT}
    appliers = {flow or FLOW_CHAT: _applied(candidate, client, flow or FLOW_CHAT) for flow in flows}
    chat = appliers.get(FLOW_CHAT) or next(iter(appliers.values()))
    fingerprint = effective_configuration(
        client=chat.client,
        registry=chat.registry,
        flow=FLOW_CHAT if FLOW_CHAT in appliers else next(iter(appliers)),
        release_mode=services.release_mode(),
        knowledge=chat.corpus.snapshot if chat.corpus is not None else knowledge_snapshot(),
        prompts_in_use=chat.prompts,
    ).fingerprint
    experiment = Experiment.objects.create(
        name=(name or candidate.name or f"{dataset} candidate")[:200],
        dataset=dataset,
        candidate=candidate.as_dict(),
        candidate_fingerprint=fingerprint,
        created_by=getattr(user, "username", "")[:150],
    )
    replays: list[str] = []
    for item in dataset.items.order_by("position"):
        try:
            with around(item) if around is not None else contextlib.nullcontext():
                run_id = _replay(item, applied=appliers[item.agent_flow or FLOW_CHAT], user=user)
        except Exception as exc:  # one item's failure is that item's result, not the experiment's
            logger.warning(
                "experiment replay failed experiment=%s error=%s", experiment.pk, type(exc).__name__
            )
            ExperimentRun.objects.create(
                experiment=experiment, item=item, error=type(exc).__name__[:ERROR_CHARS]
            )
            continue
        ExperimentRun.objects.create(experiment=experiment, item=item, run_id=run_id)
        replays.append(run_id)
    sources = list(dataset.items.values_list("source_run_id", flat=True))
    scoring.score_runs(run_ids=replays + sources)
    Experiment.objects.filter(pk=experiment.pk).update(
        status=ExperimentStatus.FINISHED, finished_at=timezone.now()
    )
    experiment.refresh_from_db()
    return experiment
