"""A scenario's world, loaded into a real Prometheus and Alertmanager that the agent's tools query.

`Worlds(prometheus_url=…, alertmanager_url=…)` is entered around a whole benchmark, `worlds.around(item)`
around each replay: for an AI Ops scenario it writes metrics.om (shifted so its last sample is `LAG` s
ago) as blocks with `promtool tsdb create-blocks-from openmetrics` and starts a Prometheus on them
(temporary dir, 127.0.0.1, a free port), makes the scenario's alerts fire in one Alertmanager for the
benchmark (the previous scenario's resolved), and points `PROMETHEUS_URL` / `ALERTMANAGER_URL` at them.
Given URLs are used as they are (only the alerts are posted). Details: docs/benchmark.md, *The world*.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from django.test import override_settings

from agent.aiops.http import forget_probes
from experiments.benchmark.scenarios import FLOWS, SAMPLE_RE, Scenario
from experiments.models import DatasetItem

LAG = 30  # seconds between the world's last sample and now: inside Prometheus' 5-minute lookback
READY_TIMEOUT = 30.0
ALERTMANAGER_BINS = ("prometheus-alertmanager", "alertmanager")


class WorldError(RuntimeError):
    """A world that cannot be loaded (a binary missing, a server that did not start)."""


def shift(text: str, *, end: int, now: float) -> str:
    """metrics.om with every timestamp moved by `now - LAG - end` (the world's end becomes "now")."""
    delta = int(now) - LAG - int(end)
    out = []
    for line in text.splitlines():
        m = SAMPLE_RE.match(line)
        out.append(f"{m[1]}{m[2] or ''} {m[3]} {float(m[4]) + delta:.3f}" if m else line)
    return "\n".join(out) + "\n"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _binary(*names: str) -> str:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    raise WorldError(f"not installed: {names[0]} (scripts/setup.sh dev installs it)")


class _Server:
    def __init__(self, argv: list[str], url: str, log: Path) -> None:
        self.url = url
        with open(log, "ab") as out:
            self.process = subprocess.Popen(  # noqa: S603 (an installed server binary, fixed arguments)
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise WorldError(f"{argv[0]} exited with {self.process.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/-/ready", timeout=1.0).status_code == 200:
                    return
            time.sleep(0.05)
        self.close()
        raise WorldError(f"{argv[0]} was not ready within {READY_TIMEOUT:g} s")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def start_prometheus(workdir: Path, scenario: Scenario, *, now: float | None = None) -> _Server:
    """A Prometheus serving `scenario`'s metrics (see the module docstring); no scrape targets."""
    data = workdir / "data"
    data.mkdir(parents=True, exist_ok=True)
    if scenario.metrics:
        world = scenario.spec.get("world") or {}
        shifted = workdir / "metrics.om"
        shifted.write_text(shift(scenario.metrics, end=int(world.get("end", 0)), now=now or time.time()))
        done = subprocess.run(  # noqa: S603 (promtool, fixed arguments)
            [_binary("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(shifted), str(data)],
            capture_output=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise WorldError(f"promtool refused {scenario.id}/metrics.om (exit {done.returncode})")
    config = workdir / "prometheus.yml"
    config.write_text(json.dumps({"global": {"scrape_interval": "15s"}, "scrape_configs": []}))
    port = _free_port()
    argv = [
        _binary("prometheus"),
        f"--config.file={config}",
        f"--storage.tsdb.path={data}",
        "--storage.tsdb.retention.time=1d",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    return _Server(argv, f"http://127.0.0.1:{port}", workdir / "prometheus.log")


def start_alertmanager(workdir: Path) -> _Server:
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "alertmanager.yml"
    config.write_text(json.dumps({"route": {"receiver": "nowhere"}, "receivers": [{"name": "nowhere"}]}))
    port = _free_port()
    argv = [
        _binary(*ALERTMANAGER_BINS),
        f"--config.file={config}",
        f"--storage.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
        "--log.level=warn",
    ]
    return _Server(argv, f"http://127.0.0.1:{port}", workdir / "alertmanager.log")


def post_alerts(url: str, alerts: list[dict[str, Any]], *, resolve: bool = False) -> None:
    """Make `alerts` fire in the Alertmanager at `url` for the next hour (API v2), or, with `resolve`,
    end them now (the next scenario's world reuses the Alertmanager)."""
    if not alerts:
        return
    now = dt.datetime.now(dt.UTC)
    ends = now - dt.timedelta(seconds=1) if resolve else now + dt.timedelta(hours=1)
    body = [
        {
            "labels": a.get("labels") or {},
            "annotations": a.get("annotations") or {},
            "startsAt": (now - dt.timedelta(minutes=20)).isoformat(),
            "endsAt": ends.isoformat(),
        }
        for a in alerts
    ]
    response = httpx.post(f"{url.rstrip('/')}/api/v2/alerts", json=body, timeout=10.0)
    if response.status_code != 200:
        raise WorldError(f"Alertmanager refused the alerts ({response.status_code})")


class Worlds:
    """The worlds of a benchmark (see the module docstring)."""

    def __init__(self, *, prometheus_url: str = "", alertmanager_url: str = "", scenarios=()) -> None:
        self.prometheus_url, self.alertmanager_url = prometheus_url, alertmanager_url
        self.by_id = {s.id: s for s in scenarios}
        self.current: str | None = None
        self._servers: list[_Server] = []  # this scenario's Prometheus
        self._alertmanager: _Server | None = None  # ours, for every scenario (alerts resolved between)
        self._posted: list[dict[str, Any]] = []
        self._override: Any = None
        self._tmp: tempfile.TemporaryDirectory | None = None

    def __enter__(self) -> Worlds:
        self._tmp = tempfile.TemporaryDirectory(prefix="benchmark-world-")
        return self

    def __exit__(self, *exc_info) -> None:
        self._unload()
        if self._alertmanager is not None:
            self._alertmanager.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    def _unload(self) -> None:
        if self._override is not None:
            self._override.disable()
            self._override = None
        for server in self._servers:
            server.close()
        self._servers = []
        if self._posted:
            post_alerts(self.alertmanager_url or self._alertmanager.url, self._posted, resolve=True)
            self._posted = []
        self.current = None
        forget_probes()

    def load(self, scenario: Scenario) -> None:
        """Make `scenario`'s world the one the tools see (a no-op when it already is)."""
        if self.current == scenario.id:
            return
        self._unload()
        workdir = Path(self._tmp.name) / scenario.id
        prometheus, alertmanager = self.prometheus_url, self.alertmanager_url
        if not prometheus:
            self._servers.append(start_prometheus(workdir / "prometheus", scenario))
            prometheus = self._servers[-1].url
        if not alertmanager:
            if self._alertmanager is None:
                self._alertmanager = start_alertmanager(Path(self._tmp.name) / "alertmanager")
            alertmanager = self._alertmanager.url
        post_alerts(alertmanager, scenario.firing)
        self._posted = scenario.firing
        self._override = override_settings(PROMETHEUS_URL=prometheus, ALERTMANAGER_URL=alertmanager)
        self._override.enable()
        forget_probes()
        self.current = scenario.id

    @contextlib.contextmanager
    def around(self, item: DatasetItem) -> Iterator[None]:
        """Entered around `item`'s replay (`experiments.runner.run_experiment(around=…)`)."""
        scenario = self.by_id.get(str((item.expected or {}).get("id") or ""))
        if scenario is not None and scenario.flow == FLOWS["aiops"]:  # the chat flow has no world tools
            self.load(scenario)
        yield
