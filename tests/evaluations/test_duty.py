"""Online evaluation is a background duty of every serving process (issue 45 item 5): two real server
processes (`python -m config.serve`, as the shipped units start them) score the finished runs with the
enabled evaluators without anyone running `run_evaluations`, each (run, evaluator) once, and the
evaluator list says when each last scored and how many runs wait.
"""

from __future__ import annotations

import html
import time

import httpx
import pytest
from django.urls import reverse

from audit.models import EventType, TraceEvent
from audit.verify.runs import verify_run
from evaluations.models import EvaluationClaim, EvaluationScore, Evaluator, EvaluatorKind
from evaluations.services import score_pending
from tests.factories import make_recorded_run
from tests.surfaces.chat.support import DaphneServer


def _evaluators() -> list[Evaluator]:
    return [
        Evaluator.objects.create(name="length", kind=EvaluatorKind.ANSWER_LENGTH, min_chars=1),
        Evaluator.objects.create(name="no-destructive", kind=EvaluatorKind.FORBIDDEN_COMMANDS),
    ]


def _page(client) -> str:
    response = client.get(reverse("admin:evaluations_evaluator_changelist"))
    assert response.status_code == 200
    return html.unescape(response.content.decode())


def _row(page: str, name: str) -> str:
    start = page.index(f">{name}</a>")
    return page[start : page.index("</tr>", start)]


@pytest.mark.django_db(transaction=True)
def test_running_servers_score_new_runs_in_their_duties_once_each(user):
    runs = [make_recorded_run(user, query=f"Why is replication lagging on db{i}?") for i in range(4)]
    evaluators = _evaluators()
    env = {
        "EVALUATION_DUTY_INTERVAL_SECONDS": "0.3",
        "AIOPS_WORKER_CONCURRENCY": "0",
        "RUN_SWEEP_INTERVAL_SECONDS": "0",
        "AUDIT_CHECKPOINT_INTERVAL_SECONDS": "0",
    }
    servers = [DaphneServer(env=env, name=f"eval{i}", serve=True) for i in range(2)]
    try:
        for server in servers:
            server.start()
        health = httpx.get(f"{servers[0].url}/healthz", timeout=20).json()
        assert health["duties"]["evaluations:score"] == "up"
        wanted = len(runs) * len(evaluators)
        deadline = time.monotonic() + 60
        while EvaluationScore.objects.count() < wanted and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)  # a few more passes of both processes: nothing more is scored
    finally:
        for server in servers:
            server.stop()
    assert EvaluationScore.objects.count() == wanted, [s.output()[-2000:] for s in servers]
    assert not EvaluationClaim.objects.exists()  # every claim released after its score
    for run in runs:
        assert EvaluationScore.objects.filter(run_id=run.run_id).count() == len(evaluators)
        chained = TraceEvent.objects.filter(run_id=run.run_id, event_type=EventType.EVALUATION_RECORDED)
        assert chained.count() == len(evaluators)
        result = verify_run(run.run_id)
        assert not result.invalid and not result.incomplete, (result.invalid, result.incomplete)


@pytest.mark.django_db
def test_the_evaluator_list_says_when_it_last_scored_and_how_many_runs_wait(admin_client, user, settings):
    settings.EVALUATION_DUTY_INTERVAL_SECONDS = 10.0
    for i in range(3):
        make_recorded_run(user, query=f"Why is replication lagging on db{i}?")
    _evaluators()
    Evaluator.objects.create(
        name="sampled-out", kind=EvaluatorKind.ANSWER_LENGTH, min_chars=1, sample_rate=0.0
    )
    page = _page(admin_client)
    assert "scored in the background of every serving process, within about 10 seconds" in page
    row = _row(page, "length")
    assert "never" in row and '<td class="field-waiting_runs">3</td>' in row
    assert '<td class="field-waiting_runs">0</td>' in _row(page, "sampled-out")  # outside its sample

    assert len(score_pending().scores) == 6
    row = _row(_page(admin_client), "length")
    assert "never" not in row and '<td class="field-waiting_runs">0</td>' in row
    make_recorded_run(user, query="Why is replication lagging again?")
    assert '<td class="field-waiting_runs">1</td>' in _row(_page(admin_client), "no-destructive")

    settings.EVALUATION_DUTY_INTERVAL_SECONDS = 0.0
    assert "Background scoring is off" in _page(admin_client)
