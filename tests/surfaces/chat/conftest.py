"""Fixtures of the chat tests: the runbooks loaded, the local OpenAI-compatible server scripted for
in-process transports (`llm_server`) or for daphne subprocesses (`provider`), and the chat site in a
daphne subprocess behind a proxy that can drop connections (`site`) with a Chromium page on it (`page`)."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.contrib.auth.models import Group
from django.core.management import call_command

from core.groups import STAFF_VIEWERS
from tests.browser import launch_chromium
from tests.fakes.openai_server import FakeLLMServer, serving
from tests.surfaces.chat.support import PASSWORD, DaphneServer, DroppingProxy, ScriptedProvider

TIMEOUT_MS = 20_000


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
    with serving(ScriptedProvider()) as scripted:
        yield scripted


@pytest.fixture
def site(provider, staff_user):
    """The chat in a daphne subprocess on the test database, with the runbooks, behind a `DroppingProxy`
    (`site.url`, `site.drop()`); `staff_user` may sign in with `PASSWORD` and read the console."""
    # The daphne subprocess knows only the production hashers (the suite's MD5 is for this process).
    staff_user.password = PBKDF2PasswordHasher().encode(PASSWORD, "browser-salt", iterations=1000)
    staff_user.save(update_fields=["password"])
    staff_user.groups.add(Group.objects.get(name=STAFF_VIEWERS))  # the console's read access
    call_command("load_knowledge", "runbooks", stdout=StringIO())
    server = DaphneServer(
        env={**provider.env(provider.base_url), "RUN_SWEEP_INTERVAL_SECONDS": "0"},
        app="tests.surfaces.chat.asgi:application",
        name="browser",
    ).start()
    proxy = DroppingProxy(server.port).start()
    yield proxy
    proxy.stop()
    server.stop()


@pytest.fixture
def page(site, monkeypatch):
    """A headless Chromium page (Debian's) for `site`."""
    sync_api = pytest.importorskip("playwright.sync_api")
    # Playwright's sync API keeps an event loop on this thread; the test's own ORM reads are sequential.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_api.sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        context = browser.new_context(viewport={"width": 1100, "height": 900})
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        yield page
        context.close()
        browser.close()
