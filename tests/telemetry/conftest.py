"""Fixtures of the telemetry tests: one real Phoenix per test session (`phoenix`), skipped when
`.venv-phoenix` is absent, but failing then under CI (`CI=true`) or `AIOPS_REQUIRE_SERVERS=1`
(scripts/test.sh), where scripts/setup.sh dev has installed it."""

from __future__ import annotations

import pytest

from tests.agent.aiops.servers import ci_requires_servers
from tests.telemetry.phoenix import PhoenixServer, missing


@pytest.fixture(scope="session")
def phoenix(tmp_path_factory):
    reason = missing()
    if reason:
        if ci_requires_servers():
            pytest.fail(f"required (CI / AIOPS_REQUIRE_SERVERS) but {reason}", pytrace=False)
        pytest.skip(reason)
    server = PhoenixServer(tmp_path_factory.mktemp("phoenix"))
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def phoenix_up(phoenix):
    if phoenix.process is None or phoenix.process.poll() is not None:
        phoenix.start()  # a test that stopped it failed before starting it again
    return phoenix
