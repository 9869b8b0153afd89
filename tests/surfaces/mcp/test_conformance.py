"""The record's MCP endpoint under the MCP conformance suite (`@modelcontextprotocol/conformance`, npm,
locked in tools/mcp), in the scenarios that cover a server like it: initialization, ping, the tool and
resource lists and DNS-rebinding protection. The other server scenarios test the suite's own fixture
tools, prompts, completions, logging and SSE sessions, which a read-only stateless endpoint does not
offer. The suite sends no credentials: it reaches daphne through a proxy that adds a user's token."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from django.conf import settings

from tests.agent.aiops.servers import ci_requires_servers
from tests.surfaces.mcp.support import AuthorizingProxy, executed_run, mcp_server, token_of

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("runtime_pools", "corpus"),
]

CONFORMANCE = Path(settings.BASE_DIR) / "tools" / "mcp" / "node_modules" / ".bin" / "conformance"
SCENARIOS = ("server-initialize", "ping", "tools-list", "resources-list", "dns-rebinding-protection")


@pytest.fixture
def conformance():
    if not CONFORMANCE.exists():
        reason = "not installed: the MCP conformance suite (scripts/setup.sh dev: npm ci in tools/mcp)"
        if ci_requires_servers():
            pytest.fail(f"required (CI / AIOPS_REQUIRE_SERVERS) but {reason}", pytrace=False)
        pytest.skip(reason)
    return CONFORMANCE


def test_the_endpoint_passes_the_conformance_scenarios_of_a_server(llm, user, conformance, tmp_path):
    executed_run(llm, user)
    daphne = mcp_server(MCP_SERVER_ENABLED="true")
    try:
        with AuthorizingProxy(daphne.url, token_of(user)) as proxy:
            for scenario in SCENARIOS:
                out = tmp_path / scenario
                done = subprocess.run(
                    [conformance, "server", "--url", f"{proxy.url}/mcp", "--scenario", scenario, "-o", out],
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-1000:]
                (found,) = out.rglob("checks.json")
                checks = json.loads(found.read_text())
                assert checks and {c["status"] for c in checks} == {"SUCCESS"}, (scenario, checks)
    finally:
        daphne.stop()
