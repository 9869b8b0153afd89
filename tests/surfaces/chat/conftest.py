"""Fixtures of the chat tests: the runbooks loaded, and the local OpenAI-compatible server scripted for
in-process transports (`llm_server`) or for daphne subprocesses (`provider`)."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from tests.fakes.openai_server import FakeLLMServer
from tests.surfaces.chat.support import ScriptedProvider


@pytest.fixture
def knowledge(db):
    call_command("load_knowledge", "runbooks", stdout=StringIO())


@pytest.fixture
def llm_server(chat_settings):
    """The fake provider with a scripted handler, configured into this process's settings."""
    with FakeLLMServer() as server:
        provider = ScriptedProvider()
        server.handler = provider
        for key, value in provider.settings(server.base_url).items():
            setattr(chat_settings, key, value)
        server.provider = provider
        yield server


@pytest.fixture
def provider():
    """A scripted fake provider whose `base_url` a daphne subprocess is pointed at."""
    with FakeLLMServer() as server:
        scripted = ScriptedProvider()
        server.handler = scripted
        scripted.base_url = server.base_url
        yield scripted
