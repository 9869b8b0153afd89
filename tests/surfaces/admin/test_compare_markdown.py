"""Compare renders each run's answer as the run page does (`surfaces.answers.render_answer`, the one
home: Markdown with raw HTML off, sanitized, citations linked), not as flattened raw Markdown; raw HTML
in an answer is never passed through. Two runs executed by the real runtime against the local
OpenAI-compatible server."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from surfaces.admin import oversight
from tests.agent.runtime.support import (
    AGENT,
    GUARD,
    ROUTE,
    ROUTER,
    VERDICT,
    ask,
    evidence_ids,
    stream_answer,
    stream_tool_calls,
    usage,
)
from tests.surfaces.admin.support import grant_console

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("runtime_pools")]


def _script(llm, answer: str) -> None:
    llm.add(ROUTER, stream_answer(ROUTE, usage=usage(40, 10)))
    llm.add(
        AGENT,
        stream_tool_calls(
            [("call_1", "lookup_knowledge", '{"query": "disk full /var/log"}')], usage=usage(200, 20)
        ),
        lambda request: stream_answer(answer.format(ev=evidence_ids(request)[0]), usage=usage(300, 30)),
    )
    llm.add(GUARD, stream_answer(VERDICT, usage=usage(100, 10)))


def test_compare_shows_both_answers_rendered_and_sanitized(llm, corpus, user, staff_user):
    _script(llm, "**Free space** first:\n\n- run `du -sh /var/log/*` [{ev}]\n- <script>alert(1)</script>")
    left, _outcome, _ = ask(user, "Disk full on /var/log")
    _script(llm, "## Steps\n\n1. Rotate the logs [{ev}]\n\n<img src=x onerror=alert(2)>")
    right, _outcome, _ = ask(user, "Disk full on /var/log")
    client = Client()
    client.force_login(grant_console(staff_user))
    html = client.get(oversight.compare_url(left.run_id, right.run_id)).content.decode()
    assert '<td class="dc-answer md">' in html
    assert "<strong>Free space</strong>" in html and "<code>du -sh /var/log/*</code>" in html
    assert "<h2>Steps</h2>" in html and "<ol>" in html
    assert "**Free space**" not in html  # not raw Markdown
    # Raw HTML in an answer is shown as the text it is, never as markup.
    assert "<script>alert(1)" not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "&lt;img src=x onerror=alert(2)&gt;" in html
    run_page = client.get(reverse("admin:diagnosis_diagnosisrun_change", args=[left.pk])).content.decode()
    assert "<strong>Free space</strong>" in run_page  # the same rendering as the run page
