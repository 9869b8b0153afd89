"""Scores in the console, on a run the real runtime executed: the run page's table (evaluator and
version, label, value, judge usage and cost, the chained event), the run list's sortable score column,
and the dashboard's trend per evaluator and per configuration fingerprint."""

from __future__ import annotations

import json

import pytest
from django.contrib import admin
from django.urls import reverse

from diagnosis.models import DiagnosisRun
from evaluations.models import Evaluator, EvaluatorKind
from evaluations.services import evaluate_run
from tests.agent.runtime.support import ask, script_reasoned_diagnosis
from tests.fakes.openai_server import stream_answer, usage

JUDGE = "fake-judge"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("runtime_pools", "corpus")
def test_scores_on_the_run_page_the_run_list_and_the_dashboard(llm, user, superuser, client):
    script_reasoned_diagnosis(llm)
    good, _, _ = ask(user, "Disk full on /var/log")
    script_reasoned_diagnosis(llm)
    bad, _, _ = ask(user, "Disk full on /var/log again")
    citations = Evaluator.objects.create(name="citations", kind=EvaluatorKind.CITATION_COVERAGE)
    judge = Evaluator.objects.create(name="groundedness", kind=EvaluatorKind.LLM_JUDGE, judge_model=JUDGE)
    evaluate_run(run_id=good.run_id, evaluators=[citations])
    llm.add(
        JUDGE,
        stream_answer(
            json.dumps({"score": 0.2, "label": "unsupported", "explanation": "not in the runbook"}),
            usage=usage(300, 20),
        ),
    )
    (judged,) = evaluate_run(run_id=bad.run_id, evaluators=[judge])
    client.force_login(superuser)

    page = client.get(reverse("admin:diagnosis_diagnosisrun_change", args=[bad.pk])).content.decode()
    assert 'id="dc-evaluations"' in page and "groundedness" in page and "v1" in page
    assert "unsupported" in page and "not in the runbook" in page and JUDGE in page and "300 / 20" in page
    assert f'href="#ev-{judged.sequence_no}"' in page

    listing = reverse("admin:diagnosis_diagnosisrun_changelist")
    html = client.get(listing).content.decode()
    assert "1.00" in html and "0.20 ⚑" in html
    column = 1 + admin.site._registry[DiagnosisRun].list_display.index("evaluation_score")  # 0: checkbox
    ascending = client.get(listing, {"o": str(column)}).content.decode()
    descending = client.get(listing, {"o": f"-{column}"}).content.decode()
    assert ascending.index(bad.run_id) < ascending.index(good.run_id)
    assert descending.index(good.run_id) < descending.index(bad.run_id)

    board = client.get(reverse("admin:diagnosis_diagnosisrun_dashboard")).content.decode()
    assert "Mean evaluation score per day by evaluator" in board
    assert "citations v1" in board and "groundedness v1" in board
    good.refresh_from_db()
    assert 'id="dc-evaluation-fingerprints"' in board and good.config_fingerprint[:14] in board
