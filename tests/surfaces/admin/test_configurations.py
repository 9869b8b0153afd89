"""Configurations in the console (issue 34, item 1): the run list filters by fingerprint and shows its
short form, the configuration page shows the document and its prompt texts, and compare names what
differs between two runs' configurations — on runs the real runtime executed against the fake
OpenAI-compatible server, one of them under another agent prompt."""

from __future__ import annotations

import dataclasses
import html as markup

import pytest
from django.test import Client
from django.urls import reverse

from agent.runtime.prompts import DEFAULT_PROMPTS
from diagnosis.models import RunStatus
from surfaces.admin.oversight import compare_url
from tests.agent.runtime.support import AGENT, GUARD, ROUTE, ROUTER, VERDICT, ask, evidence_ids
from tests.fakes.openai_server import stream_answer, stream_tool_calls, usage
from tests.surfaces.admin.support import grant_console

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("runtime_pools", "corpus"),
]

TERSE = "You answer operations questions tersely from the runbooks, citing [kb:<slug>#<n>] ids."


def _run(llm, user, query: str, **kwargs):
    llm.add(ROUTER, stream_answer(ROUTE, usage=usage(40, 10)))
    llm.add(
        AGENT,
        stream_tool_calls([("c1", "lookup_knowledge", '{"query": "disk full"}')], usage=usage(200, 20)),
        lambda request: stream_answer(f"Run du [{evidence_ids(request)[0]}].", usage=usage(300, 30)),
    )
    llm.add(GUARD, stream_answer(VERDICT, usage=usage(100, 10)))
    run, outcome, _ = ask(user, query, **kwargs)
    assert run.status == RunStatus.SUCCESS, outcome
    return run


@pytest.fixture
def runs(llm, user):
    a = _run(llm, user, "Disk full on /var/log")
    b = _run(llm, user, "Disk full again")
    c = _run(llm, user, "Disk full, terse", run_prompts=dataclasses.replace(DEFAULT_PROMPTS, agent=TERSE))
    # The candidate prompt is what the agent model received.
    assert llm.requests[AGENT][-1].messages[0]["content"].startswith(TERSE)
    return a, b, c


@pytest.fixture
def console(staff_user):
    client = Client()
    client.force_login(grant_console(staff_user))
    return client


def test_the_list_filters_by_configuration_and_shows_its_short_form(runs, console):
    a, b, c = runs
    assert a.config_fingerprint == b.config_fingerprint != c.config_fingerprint
    changelist = reverse("admin:diagnosis_diagnosisrun_changelist")
    html = console.get(changelist).content.decode()
    assert a.config_fingerprint[:12] in html and c.config_fingerprint[:12] in html
    same = console.get(changelist, {"config": a.config_fingerprint}).content.decode()
    assert a.run_id in same and b.run_id in same and c.run_id not in same
    other = console.get(changelist, {"config": c.config_fingerprint}).content.decode()
    assert c.run_id in other and a.run_id not in other
    assert a.run_id not in console.get(changelist, {"config": "none"}).content.decode()


def test_the_configuration_page_shows_the_document_prompts_and_runs(runs, console, user, staff_user):
    _a, _b, c = runs
    url = reverse("admin:diagnosis_diagnosisrun_configuration", args=[c.config_fingerprint])
    page = console.get(url)
    assert page.status_code == 200
    html = page.content.decode()
    assert c.config_fingerprint in html and "1 run under it" in html and markup.escape(TERSE) in html
    assert "knowledge.digest" in html and "models.agent" in html
    assert (
        console.get(reverse("admin:diagnosis_diagnosisrun_configuration", args=["0" * 64])).status_code == 404
    )
    # The run admin's access rule.
    assert Client().get(url).status_code == 302
    plain = Client()
    plain.force_login(user)
    assert plain.get(url).status_code == 302
    bare = Client()
    bare.force_login(staff_user)
    staff_user.groups.clear()
    assert bare.get(url).status_code == 403


def test_compare_shows_what_differs_between_two_configurations(runs, console):
    a, b, c = runs
    html = console.get(compare_url(a.run_id, c.run_id)).content.decode()
    assert 'id="cmp-configuration"' in html
    assert "prompts.agent" in html and "agent prompt (text)" in html and markup.escape(TERSE) in html
    assert "knowledge.digest" not in html  # only what differs
    same = console.get(compare_url(a.run_id, b.run_id)).content.decode()
    assert "prompts.agent" not in same and a.config_fingerprint in same
