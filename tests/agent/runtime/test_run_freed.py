"""A run's objects are freed when the run ends: none of them is left in a reference cycle, which only a
full collection frees. Such a run waited, promoted, for one, and every full collection then walked every
such run on the serving loop (a server's full passes at 100 chats took 65-100 ms, freeing 12,000-44,000
objects each: docs/performance.md)."""

import gc

import pytest

from agent.runtime.cancel import CancelToken
from agent.runtime.context import RunContext
from agent.runtime.events import SafeSink
from agent.runtime.executor import _Ending
from audit.write import RunRecorder
from diagnosis.models import ReleaseDecision, RunStatus
from tests.agent.aiops.support import aiops_registry, run_aiops
from tests.agent.runtime.support import ask
from tests.agent.runtime.test_run_jobs import _script

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("runtime_pools")]

RUNS_OWN = {RunContext, _Ending, SafeSink, RunRecorder, CancelToken}


def _left_in_cycles(execute) -> tuple[object, set[type]]:
    """`execute()`'s outcome and the types of the objects it left in reference cycles."""
    gc.collect()
    gc.disable()  # only the collection below frees cycles
    try:
        _run, outcome, _ = execute()
        gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection frees is kept in gc.garbage instead
        gc.collect()
        in_cycles = {type(o) for o in gc.garbage}
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    return outcome, in_cycles & RUNS_OWN


def test_a_finished_run_leaves_none_of_its_objects_in_a_reference_cycle(llm, corpus, user):
    _script(llm)
    outcome, left = _left_in_cycles(lambda: ask(user, "nginx 502"))
    assert outcome.release_decision == ReleaseDecision.PUBLISHED
    assert not left, sorted(k.__name__ for k in left)


def test_a_finished_ai_ops_analysis_leaves_none_of_its_objects_in_a_reference_cycle(settings, corpus, user):
    settings.LLM_PROVIDER = "demo"
    outcome, left = _left_in_cycles(lambda: run_aiops(user, registry=aiops_registry()))
    assert outcome.status == RunStatus.SUCCESS
    assert not left, sorted(k.__name__ for k in left)
