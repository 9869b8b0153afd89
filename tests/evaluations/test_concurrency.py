"""Two workers scoring the same runs at the same moment (MariaDB, real row locks): every (run,
evaluator) is scored once, chained once, and every run still verifies."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections

from audit.models import EventType, TraceEvent
from audit.verify.runs import verify_run
from evaluations.models import EvaluationScore, Evaluator, EvaluatorKind
from evaluations.services import score_pending
from tests.agent.runtime.support import ask, script_reasoned_diagnosis


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("runtime_pools", "corpus")
def test_two_workers_at_once_score_each_pair_once(llm, user):
    if connection.vendor != "mysql":
        pytest.skip("needs MariaDB/MySQL (DATABASE_URL=mysql://…): SQLite serialises the writers")
    runs = []
    for i in range(3):
        script_reasoned_diagnosis(llm)
        runs.append(ask(user, f"Disk full on /var/log ({i})")[0])
    for name, kind in (
        ("citations", EvaluatorKind.CITATION_COVERAGE),
        ("no-destructive-commands", EvaluatorKind.FORBIDDEN_COMMANDS),
    ):
        Evaluator.objects.create(name=name, kind=kind)

    start = threading.Barrier(2)
    results, errors = [], []

    def worker():
        try:
            start.wait()
            results.append(score_pending(limit=10))
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert sum(len(r.scores) for r in results) == 6
    assert sum(r.errors for r in results) == 0
    for run in runs:
        assert EvaluationScore.objects.filter(run_id=run.run_id).count() == 2
        events = TraceEvent.objects.filter(run_id=run.run_id, event_type=EventType.EVALUATION_RECORDED)
        assert events.count() == 2
        result = verify_run(run.run_id)
        assert not result.invalid and not result.incomplete, (result.invalid, result.incomplete)
