"""Experiments (issue 34 item 4), end to end with the demo model and the shipped runbooks: a 20-item
dataset of real runs, replayed through the real runtime under a candidate whose runbook folder drops one
runbook, scored by the same evaluators, compared per item and in aggregate; the replays are recorded,
verifiable experiment runs that no production read shows."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.core.management.base import CommandError

from agent.runtime.candidate import Candidate
from agent.runtime.demo import DemoModelClient
from audit.models import EventType, ToolInvocation, TraceEvent
from audit.read.dashboard import get_dashboard
from diagnosis.models import ChatSession, DiagnosisRun, ReleaseDecision, RunPurpose
from diagnosis.review_queue import queued_runs
from diagnosis.selectors import session_list
from evaluations.models import EvaluationScore, Evaluator, EvaluatorKind
from experiments.datasets import add_runs
from experiments.models import ExperimentRun
from experiments.results import experiment_results
from experiments.runner import run_experiment
from tests.agent.runtime.support import ask

RUNBOOKS = Path(django_settings.BASE_DIR) / "runbooks"
DROPPED = "tls-certificate-expiry"

# Twenty questions a team asked; four of them are answered from the runbook the candidate drops.
QUESTIONS = [
    "The TLS certificate on our API expired and clients fail the handshake. What do I check?",
    "Browsers say the certificate chain is incomplete after we renewed the TLS certificate.",
    "Certificate renewal with certbot failed and the TLS certificate expires tomorrow.",
    "How do I replace an expiring TLS certificate without downtime?",
    "The disk is full on /var/log and services fail with 'No space left on device'.",
    "Nginx returns 502 Bad Gateway after the deploy.",
    "Kafka consumer lag keeps growing for one consumer group.",
    "MySQL replica is behind the source, Seconds_Behind_Master keeps rising.",
    "Redis is evicting keys because used memory reached maxmemory.",
    "Pods are in CrashLoopBackOff after the rollout.",
    "The OOM killer killed our Java process on the host.",
    "PostgreSQL rejects new clients: too many connections, max_connections reached.",
    "Prometheus targets are down and scrapes fail.",
    "RabbitMQ queue backlog grows and memory alarms fire.",
    "DNS resolution fails intermittently in the Kubernetes cluster.",
    "The Elasticsearch cluster health is red with unassigned shards.",
    "JVM garbage collection pauses cause latency spikes in the Java service.",
    "The load balancer marks healthy backends as unhealthy.",
    "API p99 latency regressed after the last deploy.",
    "High CPU steal time on our virtual machines.",
]


@pytest.fixture
def demo(settings):
    settings.LLM_PROVIDER = "demo"
    call_command("load_knowledge", str(RUNBOOKS), stdout=io.StringIO())


@pytest.fixture
def evaluators(db):
    return [
        Evaluator.objects.create(name="citations", kind=EvaluatorKind.CITATION_COVERAGE, min_coverage=0.5),
        Evaluator.objects.create(
            name="length", kind=EvaluatorKind.ANSWER_LENGTH, min_chars=40, max_chars=4000
        ),
    ]


def _cites(run_id: str, slug: str) -> bool:
    return f"kb:{slug}#" in DiagnosisRun.objects.get(run_id=run_id).content


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("runtime_pools", "demo")
def test_dropping_a_runbook_shows_the_expected_regressions(user, evaluators, tmp_path, settings):
    client = DemoModelClient(delta_delay=0)
    sources = [ask(user, q, client=client)[0] for q in QUESTIONS]
    assert all(r.release_decision == ReleaseDecision.PUBLISHED for r in sources), [
        (r.query, r.release_decision) for r in sources
    ]
    dependent = {r.run_id for r in sources if _cites(r.run_id, DROPPED)}
    assert len(dependent) >= 3, "the dataset must hold questions answered from the dropped runbook"
    dataset = add_runs(name="ops questions", runs=sources, by="test")
    assert dataset.item_count == 20

    folder = tmp_path / "runbooks-candidate"
    shutil.copytree(RUNBOOKS, folder)
    (folder / f"{DROPPED}.md").unlink()
    config = tmp_path / "candidate.json"
    config.write_text(json.dumps({"name": f"without {DROPPED}", "runbooks": folder.name}), encoding="utf-8")

    experiment = run_experiment(dataset=dataset, candidate=Candidate.load(config), user=user, client=client)
    replays = list(ExperimentRun.objects.filter(experiment=experiment))
    assert len(replays) == 20 and all(r.run_id and not r.error for r in replays)
    runs = DiagnosisRun.objects.filter(run_id__in=[r.run_id for r in replays])
    # Marked as experiment runs, under the candidate's configuration, different from the baseline's.
    assert {r.purpose for r in runs} == {RunPurpose.EXPERIMENT}
    assert {r.config_fingerprint for r in runs} == {experiment.candidate_fingerprint}
    assert experiment.candidate_fingerprint != sources[0].config_fingerprint
    started = TraceEvent.objects.get(run_id=replays[0].run_id, event_type=EventType.RUN_STARTED).details
    assert started["purpose"] == "experiment" and started["configuration"]["knowledge"]["documents"] == 27
    # Nothing of the dropped runbook reached a replay.
    tools = ToolInvocation.objects.filter(run_id__in=[r.run_id for r in replays])
    assert not any(f"kb:{DROPPED}#" in json.dumps(t.output_preview) for t in tools)

    results = experiment_results(experiment)
    by_source = {i.baseline.run_id: i for i in results.items}
    regressed = {run_id for run_id, i in by_source.items() if i.regressed}
    assert regressed == dependent, [(i.question, i.reasons) for i in results.items if i.regressed]
    # Regressions first.
    assert all(i.regressed for i in results.items[: len(dependent)])
    assert not any(i.regressed for i in results.items[len(dependent) :])
    # Each dependent answer lost its evidence: blocked by the guards, or published citing less.
    blocked = {
        run_id for run_id in dependent if by_source[run_id].candidate.release == ReleaseDecision.BLOCKED
    }
    assert blocked
    for run_id in dependent:
        assert run_id in blocked or by_source[run_id].deltas["citations"] < 0
    citations = next(s for s in results.evaluators if s.name == "citations")
    print(  # what the experiment measured (pytest -s)
        f"dependent={len(dependent)} blocked={len(blocked)} regressions={results.regressions} "
        f"citations delta={citations.mean_delta:+.4f} ci={citations.ci} totals={results.totals}"
    )
    assert citations.n == 20 and citations.worse == len(dependent) and citations.better == 0
    assert citations.mean_delta < 0
    assert citations.ci is not None and citations.ci[0] < citations.mean_delta <= citations.ci[1] <= 0
    assert results.totals["baseline"]["published"] == 20
    assert results.totals["candidate"]["blocked"] == len(blocked)
    assert results.totals["candidate"]["published"] == 20 - len(blocked)
    # Both sides scored by the same evaluator versions, each score chained in its run's record.
    assert EvaluationScore.objects.filter(run_id__in=[r.run_id for r in replays]).count() == 40
    assert EvaluationScore.objects.filter(run_id__in=[r.run_id for r in sources]).count() == 40

    # Each replay is a verifiable run.
    out = io.StringIO()
    call_command("verify_audit", "--run", replays[0].run_id, stdout=out)

    # Never shown as production: lists, dashboard, review queue.
    assert not session_list(user=user).filter(purpose=RunPurpose.EXPERIMENT).exists()
    assert session_list(user=user).count() == 20
    assert ChatSession.objects.filter(purpose=RunPurpose.EXPERIMENT).count() == 20
    assert not queued_runs().filter(purpose=RunPurpose.EXPERIMENT).exists()
    assert sum(day.runs for day in get_dashboard_days()) == 20


def get_dashboard_days():
    import datetime as dt

    from django.utils import timezone

    now = timezone.now()
    return get_dashboard(since=now - dt.timedelta(days=1), until=now + dt.timedelta(minutes=1)).days


@pytest.mark.django_db
def test_a_candidate_with_an_unknown_key_or_tool_is_refused(tmp_path, user):
    config = tmp_path / "c.toml"
    config.write_text('tools = ["rm_rf"]\n', encoding="utf-8")
    with pytest.raises(CommandError):
        call_command("run_experiment", "nope", "--config", str(config))
    config.write_text("temperature = 2\n", encoding="utf-8")
    from agent.runtime.candidate import CandidateError

    with pytest.raises(CandidateError, match="unknown key"):
        Candidate.load(config)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("runtime_pools", "corpus")
def test_a_candidates_models_tools_and_prompts_are_what_the_replay_sends(llm, user, tmp_path):
    """Against the fake OpenAI-compatible server: the replay calls the candidate's agent model, offers
    only the candidate's tools, sends its prompt, and its fingerprint records all three."""
    from tests.agent.runtime.support import AGENT, GUARD, ROUTE, ROUTER, VERDICT, evidence_ids
    from tests.fakes.openai_server import stream_answer, stream_tool_calls, usage

    def script(agent_model: str) -> None:
        llm.add(ROUTER, stream_answer(ROUTE, usage=usage(40, 10)))
        llm.add(
            agent_model,
            stream_tool_calls([("c1", "lookup_knowledge", '{"query": "disk full"}')], usage=usage(200, 20)),
            lambda request: stream_answer(f"Run du [{evidence_ids(request)[0]}].", usage=usage(300, 30)),
        )
        llm.add(GUARD, stream_answer(VERDICT, usage=usage(100, 10)))

    script(AGENT)
    source = ask(user, "Disk full on /var/log")[0]
    dataset = add_runs(name="one", runs=[source])
    config = tmp_path / "candidate.toml"
    config.write_text(
        'tools = ["lookup_knowledge"]\n[models]\nagent = "cand-agent"\n'
        '[prompts]\nagent = "Be brief; cite ids."\n',
        encoding="utf-8",
    )
    script("cand-agent")
    experiment = run_experiment(dataset=dataset, candidate=Candidate.load(config), user=user)
    (replay,) = experiment.replays.all()
    run = DiagnosisRun.objects.get(run_id=replay.run_id)
    assert run.release_decision == ReleaseDecision.PUBLISHED
    first = llm.requests["cand-agent"][0]
    assert [t["function"]["name"] for t in first.tools] == ["lookup_knowledge"]
    assert first.messages[0]["content"].startswith("Be brief; cite ids.")
    document = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.RUN_STARTED).details[
        "configuration"
    ]
    assert document["models"]["agent"] == "cand-agent" and document["tools"]["names"] == ["lookup_knowledge"]
    assert run.config_fingerprint == experiment.candidate_fingerprint != source.config_fingerprint
    assert experiment.candidate["models"] == {"agent": "cand-agent"}
