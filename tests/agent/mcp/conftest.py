"""Fixtures of the MCP toolset tests: real MCP servers nobody here wrote, on 127.0.0.1 or over stdio.

- `binaries`: paths of `prometheus-mcp-server` (PyPI, in `.venv-mcp`) and `mcp-server-everything` (npm,
  under `tools/mcp`), found under the repository root (or the main checkout's, for a worktree); skipped,
  or failed under `CI` / `AIOPS_REQUIRE_SERVERS`, when scripts/setup.sh dev has not installed them.
- `everything_http` (session): `mcp-server-everything streamableHttp` on a free port (`PORT`), `.url`.
- `use_mcp(*entries)`: sets `MCP_SERVERS` and waits until each server's first connection attempt
  ended (a start may take 90 s: a loaded machine is not what these tests time); the hub is closed
  after the test (its servers stopped).
The real Prometheus and Alertmanager are the AI Ops tests' (`tests/agent/aiops/conftest.py`).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from agent.mcp.hub import close_hub, current_hub
from tests.agent.aiops.conftest import aiops_settings, alertmanager, fresh_probes, prometheus  # noqa: F401
from tests.agent.aiops.servers import _die_with_parent, ci_requires_servers, free_port

ROOTS = (Path(django_settings.BASE_DIR), Path("/work/main"))
PROMETHEUS_MCP = ".venv-mcp/bin/prometheus-mcp-server"
EVERYTHING = "tools/mcp/node_modules/.bin/mcp-server-everything"


def _find(relative: str) -> str | None:
    return next((str(root / relative) for root in ROOTS if (root / relative).exists()), None)


@pytest.fixture(scope="session")
def binaries() -> dict[str, str]:
    found = {"prometheus": _find(PROMETHEUS_MCP), "everything": _find(EVERYTHING)}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        reason = f"MCP servers not installed: {', '.join(missing)} (scripts/setup.sh dev installs them)"
        if ci_requires_servers():
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return found  # type: ignore[return-value]


class _HttpServer:
    def __init__(self, command: str) -> None:
        self.port = free_port()
        env = {**os.environ, "PORT": str(self.port)}
        self.process = subprocess.Popen(
            [command, "streamableHttp"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("mcp-server-everything streamableHttp did not listen")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()


@pytest.fixture(scope="session")
def everything_http(binaries):
    server = _HttpServer(binaries["everything"])
    yield server
    server.stop()


@pytest.fixture
def use_mcp(settings):
    # A server's start is not what these tests time: on a loaded machine `prometheus-mcp-server` (Python)
    # took more than the default 10 s to import and list its tools, and was left out of the run.
    settings.MCP_CONNECT_TIMEOUT_SECONDS = 90.0

    def configure(*entries: dict, settle: float = 120.0):
        settings.MCP_SERVERS = list(entries)
        hub = current_hub()
        assert hub is not None and hub.wait_settled(settle)
        return hub

    yield configure
    close_hub()
