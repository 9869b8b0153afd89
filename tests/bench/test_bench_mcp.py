"""B10 (bench/b10_mcp.py) cannot rot: its smallest run measures both paths against the real
`mcp-server-everything` of tools/mcp (skipped when not installed, required under CI). It asserts what
was measured exists, never a wall time."""

from pathlib import Path

import pytest
from django.conf import settings

from bench import b10_mcp
from tests.agent.aiops.servers import ci_requires_servers

SERVER = Path(settings.BASE_DIR) / "tools/mcp/node_modules/.bin/mcp-server-everything"


def test_b10_measures_the_toolset_and_the_bare_client():
    if not SERVER.exists():
        if ci_requires_servers():
            pytest.fail(f"{SERVER} is missing (scripts/setup.sh dev installs it)", pytrace=False)
        pytest.skip("tools/mcp is not installed (scripts/setup.sh dev)")
    configured = settings.MCP_SERVERS
    log = []
    (row,) = b10_mcp.measure(n=20, reps=1, log=log.append)
    assert row.bench == "B10" and row.target == b10_mcp.TARGET
    assert row.ratio.median > 0 and "ms per call" in row.result
    assert len(log) == 1 and log[0].startswith("  B10 rep 1:")
    assert configured == settings.MCP_SERVERS  # the bench leaves the setting as it found it
