"""A chat run's database pool jobs: decisions that follow each other without any effect between share one
job (configuration and RUN_STARTED, the evidence check and its decision, the semantic guard's decision
and the release), recording exactly what separate jobs recorded, and a failure keeps its old path."""

import pytest
from django.db import connection

from agent.runtime import configuration
from agent.runtime import db as runtime_db
from audit.models import EventType, TraceEvent
from diagnosis.models import ReleaseDecision, RunStatus
from tests.agent.runtime.support import AGENT, ask, evidence_ids
from tests.agent.runtime.test_pipeline import assert_complete_audit
from tests.fakes.openai_server import stream_answer, stream_tool_calls, usage

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("runtime_pools")]


def _script(llm):
    llm.route("DIAGNOSIS", usage=usage(5, 5))
    llm.add(
        AGENT,
        stream_tool_calls([("c1", "lookup_knowledge", '{"query": "nginx 502"}')], usage=usage(10, 5)),
        lambda request: stream_answer(f"Check the upstream [{evidence_ids(request)[0]}].", usage=usage(9, 3)),
    )
    llm.supported(usage=usage(5, 5))


def _types(run_id):
    return list(
        TraceEvent.objects.filter(run_id=run_id).order_by("sequence_no").values_list("event_type", flat=True)
    )


def test_a_chat_run_with_one_tool_step_takes_15_pool_jobs(llm, corpus, user, monkeypatch):
    jobs = []
    call = runtime_db._Worker.call

    def counting(self, loop, fn, lock=None):
        jobs.append(fn)
        return call(self, loop, fn, lock)

    monkeypatch.setattr(runtime_db._Worker, "call", counting)
    _script(llm)
    run, outcome, _ = ask(user, "nginx 502")
    assert outcome.release_decision == ReleaseDecision.PUBLISHED
    # claim, configuration + RUN_STARTED, previous turns, 4 model calls counted, routing attempt +
    # decision (held), tool step, tool start, canonical result + tool end, answer step (held),
    # evidence check + decision, semantic decision + release, finish (a heartbeat adds none in a
    # run this short).
    assert len(jobs) <= 15, [getattr(j, "args", (j,))[0] for j in jobs]
    types = _types(run.run_id)
    assert types.index("ROUTING_ATTEMPT") < types.index("ROUTING_DECISION") < types.index("AGENT_MODEL_STEP")
    assert (
        types.index("SEMANTIC_GUARD_DECISION") < types.index("RELEASE_DECISION") < types.index("RUN_FINISHED")
    )
    assert_complete_audit(run)  # every row written, the chain valid
    started = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.RUN_STARTED)
    assert started.details["configFingerprint"] == run.config_fingerprint and run.config_fingerprint


def test_a_configuration_that_fails_is_reported_after_run_started(llm, user, monkeypatch):
    def broken(**kwargs):
        raise ZeroDivisionError("configuration")

    monkeypatch.setattr("agent.runtime.executor.configure_run", broken)
    run, outcome, _ = ask(user, "nginx 502")
    assert outcome.status == run.status == RunStatus.FAILED and run.error_code == "INTERNAL_ERROR"
    assert _types(run.run_id)[0] == EventType.RUN_STARTED and not llm.requests
    started = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.RUN_STARTED)
    assert "configFingerprint" not in started.details


def test_a_configuration_copy_that_met_a_database_error_starts_the_run_in_a_job_of_its_own(
    llm, corpus, user, monkeypatch
):
    kept = configuration.services.remember_configuration

    def failing(**kwargs):
        with connection.cursor() as cursor:  # the display copy's write fails on this connection
            cursor.execute("SELECT * FROM no_such_table_here")
        return kept(**kwargs)

    monkeypatch.setattr(configuration.services, "remember_configuration", failing)
    seen = []
    original = configuration.configured_start

    def watched(configure, start, details):
        seen.append(result := original(configure, start, details))
        return result

    monkeypatch.setattr("agent.runtime.executor.configured_start", watched)
    _script(llm)
    run, outcome, _ = ask(user, "nginx 502")
    assert seen and seen[0] == (False, None, None)  # configured, not started in that job
    assert outcome.status == RunStatus.SUCCESS and outcome.release_decision == ReleaseDecision.PUBLISHED
    started = TraceEvent.objects.get(run_id=run.run_id, event_type=EventType.RUN_STARTED)
    assert started.details["configFingerprint"] == run.config_fingerprint
