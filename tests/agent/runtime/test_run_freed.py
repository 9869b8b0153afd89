"""A run's objects are freed when the run ends: none of them is left in a reference cycle, which only a
full collection frees. Such a run waited, promoted, for one, and every full collection then walked every
such run on the serving loop (a server's full passes at 100 chats took 25-100 ms, freeing up to 44,000
objects each: docs/performance.md)."""

import pytest

from agent.runtime.cancel import CancelToken
from agent.runtime.context import RunContext
from agent.runtime.events import SafeSink
from agent.runtime.executor import _Ending
from audit.write import RunRecorder
from diagnosis.models import ReleaseDecision, RunStatus
from tests.agent.aiops.support import aiops_registry, run_aiops
from tests.agent.runtime.support import ask, cycles_left
from tests.agent.runtime.test_run_jobs import _script

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("runtime_pools")]

RUNS_OWN = {RunContext, _Ending, SafeSink, RunRecorder, CancelToken}


def test_a_finished_run_leaves_none_of_its_objects_in_a_reference_cycle(llm, corpus, user):
    _script(llm)
    with cycles_left() as left:
        _run, outcome, _ = ask(user, "nginx 502")
    assert outcome.release_decision == ReleaseDecision.PUBLISHED
    assert not left & RUNS_OWN, sorted(k.__name__ for k in left & RUNS_OWN)


def test_a_finished_ai_ops_analysis_leaves_none_of_its_objects_in_a_reference_cycle(settings, corpus, user):
    settings.LLM_PROVIDER = "demo"
    with cycles_left() as left:
        _run, outcome, _ = run_aiops(user, registry=aiops_registry())
    assert outcome.status == RunStatus.SUCCESS
    assert not left & RUNS_OWN, sorted(k.__name__ for k in left & RUNS_OWN)
