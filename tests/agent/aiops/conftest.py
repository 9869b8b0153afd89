"""Fixtures of the AI Ops tests: one real Alertmanager and one real Prometheus per test session.

- `alertmanager` (session): a running `servers.AlertmanagerServer` (`.url`); route its notifications with
  `alertmanager.route_webhook(url, bearer_token=...)`, or use the `alertmanager_webhook` fixture.
- `prometheus` (session): a running `servers.PrometheusServer` (`.url`) that scrapes itself every second
  and sends its always-firing alert `servers.ALERT_NAME` to `alertmanager`; it has samples when handed
  out. `with prometheus.stopped(): ...` takes it down mid-test (it is up again afterwards).
- `aiops_settings` (function): `PROMETHEUS_URL` and `ALERTMANAGER_URL` pointing at the two servers.
- `alertmanager_webhook` (function): `route(url, bearer_token=None, **options) -> receiver name`;
  routes Alertmanager's notifications to that webhook for this test, and nowhere again afterwards.

Without the binaries the tests that use these fixtures are skipped, or fail when `CI=true` or
`AIOPS_REQUIRE_SERVERS=1` (scripts/test.sh sets it: scripts/setup.sh dev installs the packages).
"""

from __future__ import annotations

import pytest

from agent.aiops.http import forget_probes
from tests.agent.aiops.servers import (
    AlertmanagerServer,
    PrometheusServer,
    ci_requires_servers,
    missing_binaries,
)


def _require_binaries() -> None:
    missing = missing_binaries()
    if not missing:
        return
    reason = f"not installed: {', '.join(missing)} (scripts/setup.sh dev installs the Debian packages)"
    if ci_requires_servers():
        pytest.fail(f"required (CI / AIOPS_REQUIRE_SERVERS) but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def alertmanager(tmp_path_factory):
    _require_binaries()
    with AlertmanagerServer(tmp_path_factory.mktemp("alertmanager")) as server:
        yield server


@pytest.fixture(scope="session")
def prometheus(tmp_path_factory, alertmanager):
    with PrometheusServer(tmp_path_factory.mktemp("prometheus"), alertmanager_url=alertmanager.url) as server:
        server.wait_for_samples()
        yield server


@pytest.fixture(autouse=True)
def fresh_probes():
    """Each test probes the servers afresh: a probe answer cached by an earlier test (a server it
    stopped, a URL it set) never decides which tools a later test's runs are offered."""
    forget_probes()
    yield
    forget_probes()


@pytest.fixture
def aiops_settings(settings, prometheus, alertmanager):
    if not prometheus.running:  # a test that stopped it failed before starting it again
        prometheus.start()
    settings.PROMETHEUS_URL = prometheus.url
    settings.ALERTMANAGER_URL = alertmanager.url
    return settings


@pytest.fixture
def alertmanager_webhook(alertmanager):
    def route(url: str, bearer_token: str | None = None, **options) -> str:
        return alertmanager.route_webhook(url, bearer_token=bearer_token, **options)

    yield route
    if alertmanager.receiver != "nowhere" and not alertmanager.receiver.startswith("nowhere-"):
        alertmanager.route_nowhere()
