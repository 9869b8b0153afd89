"""A real Arize Phoenix (`phoenix serve` from `.venv-phoenix`, which `scripts/setup.sh dev` creates: the
package is too heavy for the app's own venv) on free 127.0.0.1 ports, for the trace export tests.

`PhoenixServer(workdir)` starts it with `PHOENIX_WORKING_DIR` in `workdir` (its own SQLite database),
HTTP and gRPC on free ports and its usage telemetry off, and waits for `/healthz`. `.otlp_endpoint` is
its OTLP/HTTP traces endpoint; `spans(trace_id)` reads the spans of one trace back through Phoenix's
REST API (`GET /v1/projects/default/spans`); `stop()`/`start()` take it down and up again on the same
ports and data. `missing()` says why it cannot run (no `.venv-phoenix`). Like `tests/agent/aiops/servers.py`,
whose helpers it reuses, the process gets SIGTERM if the test process dies.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx

from tests.agent.aiops.servers import ServerFailed, _die_with_parent, free_port

BASE_DIR = Path(__file__).resolve().parents[2]
PHOENIX_BIN = BASE_DIR / ".venv-phoenix" / "bin" / "phoenix"
# Phoenix imports a large application before it answers: ~15 s alone, over 60 s seen with the other
# pytest worker and other processes busy on a 2-core machine. A start-up bound, not a test of speed.
READY_TIMEOUT = 180.0
PROJECT = "default"


def missing() -> str | None:
    if not PHOENIX_BIN.exists():
        return f"{PHOENIX_BIN.relative_to(BASE_DIR)} not installed (scripts/setup.sh dev creates it)"
    return None


class PhoenixServer:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.grpc_port = free_port()
        self.log_path = workdir / "phoenix.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def otlp_endpoint(self) -> str:
        return f"{self.url}/v1/traces"

    def start(self) -> None:
        if self.process is not None and self.process.poll() is None:
            return
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PHOENIX_"))},
            "PHOENIX_WORKING_DIR": str(self.workdir / "data"),
            "PHOENIX_HOST": "127.0.0.1",
            "PHOENIX_PORT": str(self.port),
            "PHOENIX_GRPC_PORT": str(self.grpc_port),
            "PHOENIX_TELEMETRY_ENABLED": "false",
        }
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [str(PHOENIX_BIN), "serve"],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.workdir,
                env=env,
                preexec_fn=_die_with_parent,
            )
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerFailed(f"Phoenix exited with {self.process.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return
            time.sleep(0.1)
        self.stop()
        raise ServerFailed(f"Phoenix was not ready within {READY_TIMEOUT:g} s:\n{self.log_tail()}")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(15)

    close = stop

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def spans(self, trace_id: int) -> list[dict]:
        """Every span Phoenix stores for the trace (hex id), through its REST API."""
        found: list[dict] = []
        cursor = None
        while True:
            params = {"trace_id": format(trace_id, "032x"), "limit": 1000}
            if cursor:
                params["cursor"] = cursor
            response = httpx.get(f"{self.url}/v1/projects/{PROJECT}/spans", params=params, timeout=10.0)
            response.raise_for_status()
            body = response.json()
            found += body.get("data", [])
            cursor = body.get("next_cursor")
            if not cursor:
                return found

    def wait_for_spans(self, trace_id: int, count: int, timeout: float = 20.0) -> list[dict]:
        """The trace's spans once Phoenix has ingested at least `count` of them (it writes in batches)."""
        deadline = time.monotonic() + timeout
        spans: list[dict] = []
        while time.monotonic() < deadline:
            spans = self.spans(trace_id)
            if len(spans) >= count:
                return spans
            time.sleep(0.2)
        raise AssertionError(f"Phoenix has {len(spans)} of {count} spans of the trace after {timeout:g} s")
