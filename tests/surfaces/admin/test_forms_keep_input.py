"""Console forms keep what was typed when they refuse it (issue 50, item 4): the experiment form shows a
refused candidate and its name again; the run page's review form and approval note, which redirect
after posting, offer the refused verdict and note once on the page they return to."""

from __future__ import annotations

import html

import pytest
from django.contrib.auth.models import Group
from django.urls import reverse

from agent.runtime import approvals
from audit.models import RunReview
from experiments.datasets import add_runs
from tests.factories import make_recorded_run, make_waiting_approval
from tests.surfaces.admin.support import grant_console

pytestmark = pytest.mark.django_db
NOTE = "the long transaction on db-2 <b>was</b> the cause"


def test_a_refused_candidate_keeps_its_json_and_its_name(client, superuser, user):
    dataset = add_runs(name="kept", runs=[make_recorded_run(user)], by="test")
    client.force_login(superuser)
    url = reverse("admin:experiments_dataset_experiment", args=[dataset.pk])
    typed = '{"models": {"agent": "gpt-4.1-mini"}, "unknown": 1}'
    page = client.post(url, {"name": "try a smaller agent", "candidate": typed})
    assert page.status_code == 200
    text = page.content.decode()
    assert 'id="experiment-error"' in text and "What you typed is kept below" in text
    assert 'value="try a smaller agent"' in text
    assert html.escape(typed) in text
    broken = client.post(url, {"name": "half typed", "candidate": '{"models": '}).content.decode()
    assert "not JSON" in broken and 'value="half typed"' in broken


def test_a_refused_review_offers_its_verdict_and_note_once(client, auditor, user):
    grant_console(auditor)
    run = make_recorded_run(user)
    client.force_login(auditor)
    page_url = reverse("admin:diagnosis_diagnosisrun_change", args=[run.pk])
    long_note = NOTE + " " + "x" * 5000  # over the note's bound: refused
    refused = client.post(
        reverse("admin:diagnosis_diagnosisrun_review", args=[run.pk]),
        {"verdict": "incorrect", "note": long_note},
    )
    assert refused.status_code == 302 and not RunReview.objects.filter(run_id=run.run_id).exists()
    again = client.get(page_url).content.decode()
    assert "Review not recorded" in again
    assert 'value="incorrect" required checked' in again
    assert html.escape(NOTE) in again and "<b>was</b>" not in again  # escaped, never markup
    assert html.escape(NOTE) not in client.get(page_url).content.decode()  # offered once


def test_a_refused_approval_offers_its_note_again(client, user, django_user_model):
    approver = django_user_model.objects.create_user("approver", is_staff=True)
    approver.groups.add(Group.objects.get(name=approvals.APPROVERS_GROUP))
    grant_console(approver)
    run, call_id = make_waiting_approval(user)
    client.force_login(approver)
    refused = client.post(
        reverse("admin:diagnosis_diagnosisrun_decide", args=[run.pk, call_id]),
        {"decision": "approve", "note": NOTE, "argumentsDigest": "0" * 64},  # not the arguments shown
    )
    assert refused.status_code == 302
    again = client.get(reverse("admin:diagnosis_diagnosisrun_change", args=[run.pk])).content.decode()
    assert "Not decided" in again
    assert f'value="{html.escape(NOTE)}"' in again
