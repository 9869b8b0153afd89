"""The knowledge admin: list, search, read-only chunks inline, and edits saved through the service so that
chunks and the retrieval index are rebuilt."""

import pytest
from django.urls import reverse

from agent.knowledge import ingest
from agent.knowledge.retrieval import search_knowledge
from diagnosis.models import KnowledgeChunk, KnowledgeDocument

BODY = "## Symptoms\n\nThe replica reports growing lag.\n\n## Fix\n\nEnable parallel apply."


@pytest.fixture
def admin_client(client, superuser):
    client.force_login(superuser)
    return client


@pytest.fixture
def document(db):
    return ingest.upsert_document(
        slug="replica-lag", title="Replica lag", tags=["mysql", "replication"], summary="Lag.", body=BODY
    ).document


def form_data(document: KnowledgeDocument, **changes) -> dict:
    data = {
        "title": document.title,
        "tags": ", ".join(document.tags),
        "summary": document.summary,
        "body": document.body,
        "language": document.language,
        "chunks-TOTAL_FORMS": str(document.chunks.count()),
        "chunks-INITIAL_FORMS": str(document.chunks.count()),
        "chunks-MIN_NUM_FORMS": "0",
        "chunks-MAX_NUM_FORMS": "1000",
    }
    for n, chunk in enumerate(document.chunks.order_by("ordinal")):
        data[f"chunks-{n}-id"] = str(chunk.pk)
        data[f"chunks-{n}-document"] = str(document.pk)
    data.update(changes)
    return data


def test_changelist_and_search(admin_client, document):
    ingest.upsert_document(slug="dns", title="DNS failures", tags=["dns"], summary="", body="Resolver down.")
    url = reverse("admin:diagnosis_knowledgedocument_changelist")
    page = admin_client.get(url)
    assert page.status_code == 200
    assert "replica-lag" in page.content.decode() and "dns" in page.content.decode()
    found = admin_client.get(url, {"q": "Replica"}).content.decode()
    assert "replica-lag" in found and "DNS failures" not in found


def test_change_page_shows_chunks_read_only_and_slug_fixed(admin_client, document):
    page = admin_client.get(reverse("admin:diagnosis_knowledgedocument_change", args=[document.pk]))
    html = page.content.decode()
    assert page.status_code == 200
    assert "The replica reports growing lag." in html and "Enable parallel apply." in html
    assert 'name="slug"' not in html  # read-only once created
    assert 'name="chunks-0-text"' not in html  # chunks are derived, never edited
    assert 'value="mysql, replication"' in html


def test_editing_the_body_rechunks_and_rebuilds_the_index(admin_client, document):
    assert search_knowledge("writeset").layer == ""  # index built before the edit
    old_chunk_ids = set(document.chunks.values_list("id", flat=True))
    new_body = BODY + "\n\n## Prevention\n\nTrack dependencies with WRITESET on the source."
    response = admin_client.post(
        reverse("admin:diagnosis_knowledgedocument_change", args=[document.pk]),
        form_data(document, body=new_body, tags="mysql, replication, writeset"),
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    document.refresh_from_db()
    assert document.tags == ["mysql", "replication", "writeset"]
    chunks = list(document.chunks.values_list("id", "ordinal", "heading"))
    assert [(n, h) for _id, n, h in chunks] == [(1, "Symptoms"), (2, "Fix"), (3, "Prevention")]
    assert not old_chunk_ids & {pk for pk, _n, _h in chunks}
    result = search_knowledge("writeset")
    assert result.layer == "L0+L1"
    assert result.items[0].id == "kb:replica-lag#3"


def test_adding_through_the_admin_creates_chunks(admin_client, db):
    response = admin_client.post(
        reverse("admin:diagnosis_knowledgedocument_add"),
        {
            "slug": "etcd-quota",
            "title": "etcd database space exceeded",
            "tags": "etcd, kubernetes",
            "summary": "The etcd backend quota is full.",
            "body": "## Symptoms\n\nmvcc: database space exceeded.",
            "language": "en",
            "chunks-TOTAL_FORMS": "0",
            "chunks-INITIAL_FORMS": "0",
            "chunks-MIN_NUM_FORMS": "0",
            "chunks-MAX_NUM_FORMS": "1000",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    document = KnowledgeDocument.objects.get(slug="etcd-quota")
    assert len(document.content_sha256) == 64
    assert list(document.chunks.values_list("ordinal", "heading")) == [(1, "Symptoms")]
    assert search_knowledge("etcd quota").items[0].id == "kb:etcd-quota#1"


def test_invalid_input_is_a_form_error_not_a_crash(admin_client, document):
    response = admin_client.post(
        reverse("admin:diagnosis_knowledgedocument_change", args=[document.pk]),
        form_data(document, body="   ", tags="x" * 60),
    )
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert set(errors) >= {"body", "tags"}
    document.refresh_from_db()
    assert document.body == BODY


def test_deleting_through_the_admin_removes_chunks_and_evidence(admin_client, document):
    assert search_knowledge("replica lag").items
    response = admin_client.post(
        reverse("admin:diagnosis_knowledgedocument_delete", args=[document.pk]), {"post": "yes"}
    )
    assert response.status_code == 302
    assert not KnowledgeChunk.objects.exists()
    assert search_knowledge("replica lag").layer == ""


def test_staff_without_permission_cannot_edit(client, staff_user, document):
    client.force_login(staff_user)
    url = reverse("admin:diagnosis_knowledgedocument_change", args=[document.pk])
    assert client.get(url).status_code == 403
