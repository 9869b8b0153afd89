"""The read-only runbook view citation links open: `/knowledge/<slug>/?chunk=N#chunk-N`."""

from __future__ import annotations

import re
from io import StringIO

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from agent.knowledge import ingest
from diagnosis.models import KnowledgeChunk
from surfaces.answers import chunk_url, render_answer

pytestmark = pytest.mark.django_db

SLUG = "mysql-replication-lag"


@pytest.fixture
def runbooks(db):
    call_command("load_knowledge", "runbooks", stdout=StringIO())


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_anonymous_is_sent_to_the_login_page_and_back(runbooks):
    url = chunk_url(slug=SLUG, ordinal=2)
    response = Client().get(url)
    assert response.status_code == 302
    login = reverse("admin:login")
    assert response["Location"].startswith(f"{login}?next=/knowledge/{SLUG}/")


def test_any_signed_in_user_reads_the_whole_runbook_in_order(runbooks, user, django_assert_max_num_queries):
    client = _client(user)  # not staff: every chat user can check a citation
    with django_assert_max_num_queries(6):  # session, user, document, chunks (+ savepoints)
        response = client.get(reverse("knowledge-document", kwargs={"slug": SLUG}))
    assert response.status_code == 200
    html = response.content.decode()
    ordinals = list(
        KnowledgeChunk.objects.filter(document__slug=SLUG)
        .order_by("ordinal")
        .values_list("ordinal", flat=True)
    )
    assert [int(n) for n in re.findall(r'<section id="chunk-(\d+)"', html)] == ordinals
    assert "MySQL replication lag" in html
    assert 'class="chunk cited"' not in html  # nothing highlighted without ?chunk
    assert "Content-Security-Policy" in response.headers
    assert "'unsafe-inline'" not in response.headers["Content-Security-Policy"]
    assert "<script" not in html and "style=" not in html


def test_the_cited_chunk_is_highlighted_on_the_server(runbooks, user):
    response = _client(user).get(chunk_url(slug=SLUG, ordinal=3).split("#")[0])
    assert response.status_code == 200
    html = response.content.decode()
    assert re.findall(r'<section id="chunk-(\d+)" class="chunk cited"', html) == ["3"]
    assert html.count("chunk cited") == 1
    chunk = KnowledgeChunk.objects.get(document__slug=SLUG, ordinal=3)
    assert render_answer(chunk.text) in html  # the chunk's Markdown, rendered by the one renderer


@pytest.mark.parametrize("chunk", ["999", "0", "-1", "abc", "2.0", "", "٣"])
def test_an_unknown_chunk_is_404(runbooks, user, chunk):
    response = _client(user).get(f"/knowledge/{SLUG}/", {"chunk": chunk})
    assert response.status_code == 404


def test_an_unknown_runbook_is_404(runbooks, user):
    client = _client(user)
    assert client.get("/knowledge/no-such-runbook/").status_code == 404
    assert client.get(chunk_url(slug="no-such-runbook", ordinal=1)).status_code == 404


def test_the_view_is_read_only(runbooks, user):
    assert _client(user).post(f"/knowledge/{SLUG}/").status_code == 405


def test_markup_in_a_runbook_is_sanitized_like_an_answer(user):
    ingest.upsert_document(
        slug="hostile",
        title="Hostile <b>title</b>",
        tags=["x"],
        summary="",
        body="## Steps\n\nRun `ls` <script>window.pwned=1</script> <img src=x onerror=alert(1)>\n",
    )
    html = _client(user).get("/knowledge/hostile/?chunk=1").content.decode()
    assert "<script>window" not in html and "<img" not in html and "<b>title" not in html
    assert "&lt;script&gt;" in html
