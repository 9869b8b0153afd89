"""The chat service redacts the question (issue 33) before it locks the user's row and stores the run:
the run holds placeholders and the facts its recorder will chain, never the original."""

from __future__ import annotations

import pytest

from surfaces.chat.service import start_chat
from tests.agent.leaks import found_in_tables
from tests.agent.secrets_corpus import ALL_ORIGINALS, AWS_KEY_ID, pasted_all

pytestmark = pytest.mark.django_db


def test_start_chat_stores_only_placeholders_and_the_facts(user, settings):
    settings.REDACTION_HMAC_KEY = "chat-intake-key-0123456789abcdef0123456789"
    run = start_chat(user=user, query=f"nginx fails after the deploy:\n{pasted_all()}")
    assert "[REDACTED:aws-access-key#1]" in run.query and AWS_KEY_ID not in run.query
    assert run.redaction["counts"]["aws-access-key"] == 1
    assert {"kind", "placeholder", "hmac"} == set(run.redaction["items"][0])
    assert run.session.title.startswith("nginx fails after the deploy")
    assert found_in_tables(ALL_ORIGINALS) == []
