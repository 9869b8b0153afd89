"""Starting a chat (`surfaces.chat.service.start_chat`, the path both transports take; issue 44 item 7):
the query is validated once, as the user sent it, the session is read once, and the session's row is
written once; the statements are counted, and an invalid query is refused exactly as before."""

from __future__ import annotations

import pytest

from diagnosis import services
from diagnosis.models import ChatSession, DiagnosisRun
from surfaces.chat import service
from surfaces.chat.protocol import ChatRefused
from surfaces.chat.service import start_chat
from tests.agent.secrets_corpus import AWS_KEY_ID
from tests.surfaces.chat.transports import post_chat, token_client

# Inside the test's transaction `start_chat`'s own transaction is a savepoint (2 statements); alone it is
# BEGIN … COMMIT, which the count does not see. Before: 14 with a new or untitled session, 13 with a
# titled one (the query validated twice, a savepoint each for `prepare_run` and `create_run`, the
# session's title and counts in two UPDATEs).
# savepoint, user row lock, [session], active-run count, [session insert], run insert (tagged before it:
# issue 49 item 5, was run insert, read of its created_at, tag UPDATE), session title + counts, release.
START_QUERIES = 7


@pytest.mark.django_db
@pytest.mark.parametrize("session", ["new", "untitled", "titled"])
def test_starting_a_chat_takes_seven_statements(user, session, django_assert_num_queries):
    session_id = None
    if session != "new":
        title = "Earlier question" if session == "titled" else ""
        session_id = services.create_session(owner=user, title=title).session_id
    with django_assert_num_queries(START_QUERIES):
        run = start_chat(user=user, query="  Nginx answers 502\nafter the deploy ", session_id=session_id)
    stored = ChatSession.objects.get(pk=run.session.pk)
    assert stored.run_count == 1 and stored.last_run_at == run.created_at
    expected_title = "Earlier question" if session == "titled" else "Nginx answers 502 after the deploy"
    assert stored.title == run.session.title == expected_title
    assert services.created_by_the_service(DiagnosisRun.objects.get(pk=run.pk))


@pytest.mark.django_db
def test_the_query_is_validated_once(user, monkeypatch):
    calls = []
    real = services.validate_query

    def counting(query):
        calls.append(query)
        return real(query)

    monkeypatch.setattr(services, "validate_query", counting)
    start_chat(user=user, query="Disk full on /var/log")
    assert calls == ["Disk full on /var/log"]


@pytest.mark.django_db
def test_a_query_valid_as_sent_is_not_refused_because_redaction_lengthened_it(user):
    """Validated once, as sent: placeholders longer than the secrets they replace (27 characters for a
    20-character key id) no longer push a valid question over the limit on a second check (which raised
    an `InvalidQuery` no transport answered)."""
    query = "x" * (services.QUERY_MAX_CHARS - len(AWS_KEY_ID) - 1) + " " + AWS_KEY_ID
    assert len(query) == services.QUERY_MAX_CHARS
    run = start_chat(user=user, query=query)
    assert AWS_KEY_ID not in run.query and len(run.query) > services.QUERY_MAX_CHARS


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("", "query must be a non-empty string."),
        (" \n\t", "query must be a non-empty string."),
        (None, "query must be a non-empty string."),
        (42, "query must be a non-empty string."),
        (
            "x" * (services.QUERY_MAX_CHARS + 1),
            f"query must be at most {services.QUERY_MAX_CHARS} characters.",
        ),
    ],
)
def test_an_invalid_query_is_refused_as_before_and_nothing_is_read(
    user, query, message, django_assert_num_queries
):
    with django_assert_num_queries(0), pytest.raises(ChatRefused) as refused:
        start_chat(user=user, query=query, session_id="ses_does_not_matter")
    assert (refused.value.status, refused.value.code, refused.value.message) == (
        400,
        "invalid_request",
        message,
    )
    assert not DiagnosisRun.objects.exists()


@pytest.mark.django_db
def test_an_unknown_session_is_still_404_after_a_valid_query(user, django_assert_num_queries):
    with pytest.raises(ChatRefused) as refused:
        start_chat(user=user, query="q", session_id="ses_unknown")
    assert (refused.value.status, refused.value.code) == (404, "not_found")
    assert refused.value.message == service.NOT_FOUND_SESSION


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.usefixtures("chat_settings", "stop_chat_background")
async def test_post_chat_answers_an_invalid_query_in_the_contracts_shape(user):
    client = await token_client(user)
    response = await post_chat(client, {"query": "   "})
    assert response.status_code == 400
    assert response.json() == {
        "error": {"code": "invalid_request", "message": "query must be a non-empty string."}
    }
