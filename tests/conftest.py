"""Shared fixtures: users with each role, a session and run, and a recorder for that run.

The suite runs twice in `make test`: on SQLite and on MariaDB (`DATABASE_URL=mysql://…`). Tests marked
`mariadb` only make sense on a server database and are skipped on SQLite.

`make test` runs each database's suite on pytest-xdist workers (each with its own test database:
pytest-django appends the worker's id to the name), then the tests marked `serial`, `load` or `replica`
alone in one process: they restart the shared MariaDB (or stop and start the one replica server of the
`replica` tests) or measure latency under a load they create, which the other worker would disturb (or
be broken by). Under xdist those are skipped here, never run side by side.
"""

import asyncio
import os

import pytest
import pytest_asyncio
from django.contrib.auth.models import Group
from django.db import connection

from agent.knowledge.retrieval import reset_knowledge_index
from diagnosis import services


class _LoopClosingModelClients(asyncio.SelectorEventLoop):
    """A test's event loop that closes its model clients (`agent.runtime.llm.aclose_clients`) before it
    closes, as the server's shutdown does (`supervisor.shutdown`): the runtime keeps one SDK client per
    loop, and an aiohttp session left open is logged as an asyncio error when it is collected."""

    def close(self) -> None:
        if not self.is_closed() and not self.is_running():
            from agent.runtime.llm import aclose_clients

            closing = aclose_clients()
            try:
                self.run_until_complete(closing)
            except Exception:  # e.g. closed from inside another running loop: leave the clients be
                closing.close()
        super().close()


class _ClosingPolicy(asyncio.DefaultEventLoopPolicy):
    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        return _LoopClosingModelClients()


# Every loop a test makes (pytest-asyncio's, and `asyncio.run` in the code under test) is one of these.
asyncio.set_event_loop_policy(_ClosingPolicy())


# Run once, in the MariaDB half, when scripts/test.sh runs the suite on both databases (SUITE_ON_BOTH=1):
# the browser tests (a page's behaviour does not depend on the database; the views under them are tested
# on both), the replica tests (they use scripts/mariadb-replica.sh's own pair whatever the suite's
# database) and `mariadb_half` tests (expensive, and what they prove is the production database's).
# Run on SQLite alone, the suite still runs them. docs/reliability.md, *The suite's time*.
ONCE_ON_MARIADB = {"browser", "replica", "galera", "mariadb_half"}


def pytest_collection_modifyitems(config, items):
    alone = pytest.mark.skip(reason="runs alone, not beside an xdist worker (scripts/test.sh runs it after)")
    on_sqlite = pytest.mark.skip(reason="needs MariaDB/MySQL (DATABASE_URL=mysql://…)")
    once = pytest.mark.skip(reason="runs once, in the MariaDB half of scripts/test.sh (SUITE_ON_BOTH)")
    in_worker = bool(os.environ.get("PYTEST_XDIST_WORKER"))
    split = os.environ.get("SUITE_ON_BOTH") == "1" and connection.vendor != "mysql"
    for item in items:
        if in_worker and ({"serial", "load", "replica", "galera"} & item.keywords.keys()):
            item.add_marker(alone)
        if connection.vendor != "mysql" and "mariadb" in item.keywords:
            item.add_marker(on_sqlite)
        if split and ONCE_ON_MARIADB & item.keywords.keys():
            item.add_marker(once)


@pytest.fixture(autouse=True)
def _fresh_knowledge_index():
    """The retrieval index is per process while each test's database rolls back: start every test cold."""
    reset_knowledge_index()


@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create_user("owner", password="pw-owner-1")


@pytest.fixture
def other_user(django_user_model):
    return django_user_model.objects.create_user("other", password="pw-other-1")


@pytest.fixture
def staff_user(django_user_model):
    return django_user_model.objects.create_user("staff", password="pw-staff-1", is_staff=True)


@pytest.fixture
def auditor(django_user_model):
    user = django_user_model.objects.create_user("auditor", password="pw-auditor-1", is_staff=True)
    user.groups.add(Group.objects.get(name="Reasoning Auditors"))
    return user


@pytest.fixture
def superuser(django_user_model):
    return django_user_model.objects.create_superuser("root", password="pw-root-1")


@pytest.fixture
def chat_session(user):
    return services.create_session(owner=user)


@pytest.fixture
def run(chat_session):
    """A PENDING run nobody claimed yet (as `prepare_run` leaves it before the executor takes it)."""
    return services.create_run(session=chat_session, query="Why is MySQL replication lagging?")


@pytest.fixture
def recorder(run):
    """`run`'s recorder as its executor holds it: the run claimed through the real claim (epoch 1),
    every write fenced by that epoch (`tests.factories.executing`)."""
    from tests.factories import executing

    return executing(run)


@pytest.fixture
def api_client():
    """A DRF test client (no credentials; use `force_login` for session auth or `credentials` for tokens)."""
    from rest_framework.test import APIClient

    return APIClient()


@pytest.fixture
def traced_run(run):
    """`run` recorded in full through the real recorder (tests.factories.record_full_run), refreshed."""
    from tests.factories import record_full_run

    record_full_run(run)
    run.refresh_from_db()
    return run


@pytest.fixture(autouse=True)
def _fresh_rate_limits():
    """Throttle counters (reasoning reads, chat starts) live in the default cache of this process, and
    user ids repeat from test to test: start every test with no request counted. Only an in-process
    cache is cleared (never a Redis that other processes may share)."""
    from django.core.cache import caches
    from django.core.cache.backends.locmem import LocMemCache

    if isinstance(caches["default"], LocMemCache):
        caches["default"].clear()


@pytest.fixture(autouse=True)
def _no_queue_worker(settings):
    """In-process tests do not serve the AI Ops queue from the supervisor's background (it would claim
    runs a test creates); tests of the worker drive `agent.runtime.worker` themselves. Server
    processes the tests start keep the default."""
    settings.AIOPS_WORKER_CONCURRENCY = 0


@pytest.fixture(autouse=True)
def _fast_password_hasher(settings):
    """The role fixtures create up to six users per test; PBKDF2's million rounds would dominate the suite
    (≈ 0.5 s per user). Tests do not measure password strength."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


# --------------------------------------------------------------------------------------------------
# Chat transport tests (in-process ASGI): use with `pytest.mark.usefixtures("chat_settings",
# "stop_chat_background")`.
# --------------------------------------------------------------------------------------------------
@pytest.fixture
def chat_settings(settings):
    """In-memory channel layer, no periodic sweeper or checkpointer, the demo provider; the runtime's
    pools are closed afterwards so no pool thread keeps a connection to this test's database."""
    from agent.runtime import db as runtime_db

    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.RUN_SWEEP_INTERVAL_SECONDS = 0
    settings.AUDIT_CHECKPOINT_INTERVAL_SECONDS = 0
    settings.AUDIT_PURGE_INTERVAL_SECONDS = 0
    settings.LLM_PROVIDER = "demo"
    yield settings
    runtime_db.shutdown_pools()


@pytest_asyncio.fixture
async def stop_chat_background():
    """Stop the supervisor's per-loop background tasks (control listener, sweeper) after the test."""
    from agent.runtime import supervisor

    yield
    await supervisor.stop_background()


# --------------------------------------------------------------------------------------------------
# Runtime tests: fresh thread pools, the local fake provider, a small runbook corpus
# --------------------------------------------------------------------------------------------------
@pytest.fixture
def runtime_pools():
    """The runtime's database and tool pools are closed before and after the test, so no pool thread
    keeps a connection (or a stale one) across tests."""
    from agent.runtime import db as runtime_db

    runtime_db.shutdown_pools()
    yield
    runtime_db.shutdown_pools()


@pytest.fixture
def llm(settings):
    """The local OpenAI-compatible server with a scripted `Provider`, and settings pointing at it; the
    test fails if the server itself hit an error."""
    from tests.agent.runtime.support import Provider, use_fake_llm
    from tests.fakes.openai_server import FakeLLMServer

    with FakeLLMServer() as server:
        use_fake_llm(settings, server)
        yield Provider(server)
        assert not server.errors


@pytest.fixture
def corpus(tmp_path):
    """The small runbook corpus of `tests.agent.runtime.support.load_corpus`, loaded into the knowledge
    base."""
    from tests.agent.runtime.support import load_corpus

    load_corpus(tmp_path / "kb")
