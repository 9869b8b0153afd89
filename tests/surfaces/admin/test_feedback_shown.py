"""Readers' feedback where staff look: the run page lists every reader's vote and comment on the run
(not only the viewer's), and the oversight dashboard counts the period's votes with a link to the
down-voted runs in the review queue. On a run executed by the real runtime against the local
OpenAI-compatible server; the votes go through the service the feedback API uses."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from diagnosis import services
from diagnosis.models import ReleaseDecision
from tests.agent.runtime.support import ask, script_reasoned_diagnosis
from tests.surfaces.admin.support import grant_console

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("runtime_pools")]


def test_the_run_page_and_the_dashboard_show_every_readers_feedback(
    llm, corpus, user, other_user, staff_user
):
    script_reasoned_diagnosis(llm)
    run, outcome, _ = ask(user, "Disk full on /var/log")
    assert outcome.release_decision == ReleaseDecision.PUBLISHED
    services.submit_feedback(run=run, user=user, rating="up", comment="du found it")
    services.submit_feedback(run=run, user=other_user, rating="down", comment="missed the inode case")
    client = Client()
    client.force_login(grant_console(staff_user))  # staff who gave no feedback still see all of it

    page = client.get(reverse("admin:diagnosis_diagnosisrun_change", args=[run.pk])).content.decode()
    section = page.split('id="dc-feedback"', 1)[1].split("</dd>", 1)[0]
    assert section.count('class="dc-feedback-item"') == 2
    assert "👍 helpful</span> <b>owner</b>: du found it" in section
    assert "👎 not helpful</span> <b>other</b>: missed the inode case" in section

    board = client.get(reverse("admin:diagnosis_diagnosisrun_dashboard")).content.decode()
    assert '<td class="dc-num" id="dc-feedback">👍 1 · 👎 1</td>' in board
    assert "queue/?reason=downvoted" in board
    # A changed vote is counted once, as it now stands.
    services.submit_feedback(run=run, user=other_user, rating="up", comment="")
    board = client.get(reverse("admin:diagnosis_diagnosisrun_dashboard")).content.decode()
    assert '<td class="dc-num" id="dc-feedback">👍 2 · 👎 0</td>' in board
