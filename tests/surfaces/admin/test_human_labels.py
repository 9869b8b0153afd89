"""The console says things in people's words: reasoning steps of the router and the semantic guard are
"router" and "semantic guard" (not -1 / -101; one reading of the numbering,
`audit.write.runtime_facts.step_label`), review verdicts by their label ("needs follow-up"), correct plurals
on the admin index ("1 run needs a human", "1 tool call waits"), "Log leaves" and "Run feedback", the
approvals page with one heading and linked from the index with its count, a run waiting for approval
says so instead of "audit incomplete", and "Verify the whole transparency log" runs without a ticked
row. On runs executed by the real runtime against the local OpenAI-compatible server."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from audit.write.runtime_facts import guard_reasoning_step, router_reasoning_step, step_label
from diagnosis.models import ReleaseDecision
from tests.agent.runtime.support import ask, script_reasoned_diagnosis
from tests.surfaces.admin.support import grant_console

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("runtime_pools")]


def test_one_reading_of_the_step_numbering():
    assert step_label(router_reasoning_step(1), "router") == "router"
    assert step_label(router_reasoning_step(3), "router") == "router, attempt 3"
    assert step_label(guard_reasoning_step(1), "semantic_guard") == "semantic guard"
    assert step_label(guard_reasoning_step(2), "semantic_guard") == "semantic guard, call 2"
    assert step_label(2, "diagnosis_agent") == "agent step 2"
    assert step_label(1, "planner") == "planner step 1"
    assert step_label(None) == "—"


@pytest.fixture
def reasoned_run(llm, corpus, user):
    script_reasoned_diagnosis(llm)
    run, outcome, _ = ask(user, "Disk full on /var/log")
    assert outcome.release_decision == ReleaseDecision.PUBLISHED
    return run


def test_reasoning_rows_are_named_router_agent_step_and_semantic_guard(reasoned_run, auditor, settings):
    settings.REASONING_REQUIRE_OTP = False
    client = Client()
    client.force_login(grant_console(auditor))
    url = reverse("admin:diagnosis_diagnosisrun_reasoning", args=[reasoned_run.pk])
    panel = client.post(url, HTTP_X_REQUESTED_WITH="fetch").content.decode()
    for label in ("<b>router</b>", "<b>agent step 1</b>", "<b>agent step 2</b>", "<b>semantic guard</b>"):
        assert label in panel, panel
    assert "step -1" not in panel and "step -101" not in panel
    page = client.get(reverse("admin:diagnosis_diagnosisrun_change", args=[reasoned_run.pk])).content.decode()
    assert "step -1<" not in page and "step -101" not in page
    listed = client.get(reverse("admin:reasoning_agentreasoningaudit_changelist")).content.decode()
    assert "semantic guard" in listed and ">router<" in listed and ">-101<" not in listed


def test_names_plurals_and_the_approvals_link_on_the_index(reasoned_run, auditor, superuser, user):
    from diagnosis import services

    services.submit_feedback(run=reasoned_run, user=user, rating="down", comment="missed the inode case")
    client = Client()
    client.force_login(superuser)
    index = client.get("/admin/").content.decode()
    assert "Log leaves" in index and "Log leafs" not in index
    assert "Run feedback" in index and "Run feedbacks" not in index
    assert "1</b> run needs a human" in index
    assert 'id="dc-approvals-link"' in index and "0</b> tool calls wait for a decision" in index
    approvals = client.get(reverse("admin:diagnosis_diagnosisrun_approvals")).content.decode()
    assert approvals.count("Tool calls waiting for approval</h1>") == 1
    # A verdict by its label, in the form and in the list of reviews.
    page = client.get(reverse("admin:diagnosis_diagnosisrun_change", args=[reasoned_run.pk])).content.decode()
    assert "needs follow-up" in page and ">needs_follow_up<" not in page
    # Not an approver: no link.
    client.force_login(grant_console(auditor))
    assert 'id="dc-approvals-link"' not in client.get("/admin/").content.decode()


def test_verify_the_whole_log_without_a_ticked_row(reasoned_run, superuser):
    call_command("audit_checkpoint", stdout=io.StringIO())
    client = Client()
    client.force_login(superuser)
    url = reverse("admin:audit_checkpoint_changelist")
    response = client.post(url, {"action": "verify_whole_log", "index": "0"}, follow=True)
    text = response.content.decode()
    assert "The log verifies:" in text, text[:3000]
    assert "Items must be selected" not in text


def test_status_release_intent_and_flow_read_as_words_with_the_stored_word_kept(reasoned_run, staff_user):
    """The run list and the run page show "succeeded", "published", "diagnosis", "chat agent" — not
    SUCCESS / PUBLISHED / DIAGNOSIS_AGENT — each chip keeping the stored word as its title."""
    from surfaces.admin.display import label

    assert label("SUCCESS") == "succeeded" and label("OUT_OF_SCOPE") == "out of scope"
    assert label("AI_OPS") == "AI Ops analysis" and label("INTERRUPTED") == "waiting for approval"
    assert label(None) == label("") == "—"
    client = Client()
    client.force_login(grant_console(staff_user))
    listed = client.get(reverse("admin:diagnosis_diagnosisrun_changelist")).content.decode()
    assert 'title="SUCCESS">succeeded</span>' in listed and 'title="PUBLISHED">published</span>' in listed
    page = client.get(reverse("admin:diagnosis_diagnosisrun_change", args=[reasoned_run.pk])).content.decode()
    assert 'title="SUCCESS">succeeded</span>' in page and 'title="DIAGNOSIS_AGENT">chat agent</span>' in page
    assert 'title="DIAGNOSIS">intent: diagnosis</span>' in page and ">published</span>" in page
    assert ">SUCCESS<" not in page and ">DIAGNOSIS_AGENT<" not in page
