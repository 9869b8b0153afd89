"""Real Prometheus and Alertmanager processes for tests (Debian's `prometheus` and
`prometheus-alertmanager`, installed by `scripts/setup.sh dev`), on 127.0.0.1 and free ports.

`AlertmanagerServer(workdir)` starts Alertmanager with clustering off, its own storage, group_wait and
group_interval of 1 s, and a route to a receiver without integrations (notifications go nowhere) until
`route_webhook(url, bearer_token=...)` rewrites the configuration to send every group to that webhook
(`http_config.authorization.credentials` = the token; a fresh receiver name per call, so groups that were
already notified elsewhere are notified again) and reloads it (`POST /-/reload`, then waits until
`/api/v2/status` serves the new configuration). `route_nowhere()` goes back.

`PrometheusServer(workdir, alertmanager_url=...)` starts Prometheus scraping itself every second,
evaluating rules every second, with the rule file `RULES`: the alert `ALERT_NAME` (severity
`warning`, summary and description annotations) fires from the first scrape on
(`scrape_duration_seconds{job="prometheus"} > 0`, `for: 0s`), sent to that Alertmanager.
With `basic_auth=(user, password)` it requires HTTP basic auth (`--web.config.file`).
`stop()` / `start()` stop it and start it again on the same port and storage; `stopped()` is the
context manager for "Prometheus goes down mid-test" (started again on exit).

Both wait for `/-/ready` (`READY_TIMEOUT` s) and raise `ServerFailed` with the tail of the process log
otherwise; `close()` terminates the process (then kills it) and is idempotent, and a server also gets
SIGTERM if the test process dies. `missing_binaries()` names
what is not installed; see `tests/agent/aiops/conftest.py` for how that skips (or, with `CI=true`, fails).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx

PROMETHEUS_BIN = "prometheus"
ALERTMANAGER_BINS = ("prometheus-alertmanager", "alertmanager")  # Debian's name, upstream's name
READY_TIMEOUT = 20.0
STOP_TIMEOUT = 10.0

ALERT_NAME = "PrometheusScrapeSlow"
ALERT_SEVERITY = "warning"
# How long a test waits for the alert to reach Alertmanager (it takes about a second once scraped).
ALERT_DEADLINE = 30.0
RULES = f"""\
groups:
  - name: aiops-test
    interval: 1s
    rules:
      - alert: {ALERT_NAME}
        expr: scrape_duration_seconds{{job="prometheus"}} > 0
        for: 0s
        labels:
          severity: {ALERT_SEVERITY}
        annotations:
          summary: Prometheus takes time to scrape itself
          description: 'scrape_duration_seconds of {{{{ $labels.instance }}}} is {{{{ $value }}}} s'
"""


class ServerFailed(RuntimeError):
    """A test server did not start or become ready."""


def missing_binaries() -> list[str]:
    missing = []
    if shutil.which(PROMETHEUS_BIN) is None:
        missing.append(PROMETHEUS_BIN)
    if not any(shutil.which(name) for name in ALERTMANAGER_BINS):
        missing.append(ALERTMANAGER_BINS[0])
    return missing


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the test process dies, so a killed test run (a timeout,
    SIGKILL) leaves no server behind (Linux `prctl(PR_SET_PDEATHSIG)`; elsewhere a no-op)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A free port below the kernel's ephemeral range: a server restarted on it (`stopped()`) finds it
    free again, where a port the kernel handed out could meanwhile be a client connection's local port
    (seen under load: "bind: address already in use" on the restart)."""
    low = _ephemeral_low()
    for _ in range(200):
        port = random.randrange(max(1024, low - 16000), low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Process:
    """One server process: started with `argv()`, ready when `/-/ready` answers 200."""

    name = "server"

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.log_path = workdir / "server.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.auth: tuple[str, str] | None = None  # basic auth the server requires, if any

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def argv(self) -> list[str]:
        raise NotImplementedError

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        if self.running:
            return
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.argv(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.workdir,
                preexec_fn=_die_with_parent,
            )
        self.wait_ready()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise ServerFailed(f"{self.name} exited with {self.process.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/-/ready", timeout=1.0, auth=self.auth).status_code == 200:
                    return
            time.sleep(0.05)
        self.close()
        raise ServerFailed(f"{self.name} was not ready within {READY_TIMEOUT:g} s:\n{self.log_tail()}")

    def stop(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL after `STOP_TIMEOUT`); a no-op when not running."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_TIMEOUT)

    close = stop

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class AlertmanagerServer(_Process):
    """A real Alertmanager (see the module docstring)."""

    name = "Alertmanager"

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.binary = next(shutil.which(n) for n in ALERTMANAGER_BINS if shutil.which(n))
        self.config_path = workdir / "alertmanager.yml"
        self._routes = 0
        self.receiver = "nowhere"
        self._write_config(receiver={"name": self.receiver})

    def argv(self) -> list[str]:
        return [
            self.binary,
            f"--config.file={self.config_path}",
            f"--storage.path={self.workdir / 'data'}",
            f"--web.listen-address={self.address}",
            "--cluster.listen-address=",
            "--log.level=warn",
        ]

    def _write_config(
        self, *, receiver: dict, repeat_interval: str = "1h", group_by: Sequence[str] = ()
    ) -> None:
        config = {
            "route": {
                "receiver": receiver["name"],
                "group_by": list(group_by) or ["alertname"],
                "group_wait": "1s",
                "group_interval": "1s",
                "repeat_interval": repeat_interval,
            },
            "receivers": [receiver],
        }
        # JSON is YAML: no YAML library needed, and no quoting mistakes.
        self.config_path.write_text(json.dumps(config, indent=2))

    def route_webhook(
        self,
        url: str,
        *,
        bearer_token: str | None = None,
        repeat_interval: str = "1h",
        group_by: Sequence[str] = ("alertname",),
    ) -> str:
        """Send every alert group to the webhook `url` (with `Authorization: Bearer <bearer_token>` when
        given); returns the receiver's name (`webhook-<n>`)."""
        self._routes += 1
        webhook: dict = {"url": url, "send_resolved": True, "max_alerts": 0}
        if bearer_token is not None:
            webhook["http_config"] = {"authorization": {"type": "Bearer", "credentials": bearer_token}}
        name = f"webhook-{self._routes}"
        self._write_config(
            receiver={"name": name, "webhook_configs": [webhook]},
            repeat_interval=repeat_interval,
            group_by=group_by,
        )
        self._reload(name)
        return name

    def route_nowhere(self) -> None:
        self._routes += 1
        name = f"nowhere-{self._routes}"
        self._write_config(receiver={"name": name})
        self._reload(name)

    def _reload(self, receiver: str) -> None:
        response = httpx.post(f"{self.url}/-/reload", timeout=5.0)
        if response.status_code != 200:
            raise ServerFailed(f"Alertmanager refused its configuration: {response.text[:500]}")
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            status = httpx.get(f"{self.url}/api/v2/status", timeout=2.0).json()
            if f"receiver: {receiver}" in (status.get("config") or {}).get("original", ""):
                self.receiver = receiver
                return
            time.sleep(0.05)
        raise ServerFailed(f"Alertmanager did not load the configuration for {receiver}")


class PrometheusServer(_Process):
    """A real Prometheus (see the module docstring)."""

    name = "Prometheus"

    def __init__(
        self,
        workdir: Path,
        *,
        alertmanager_url: str | None = None,
        rules: str = RULES,
        basic_auth: tuple[str, str] | None = None,
    ) -> None:
        super().__init__(workdir)
        self.binary = shutil.which(PROMETHEUS_BIN)
        self.web_config_path: Path | None = None
        if basic_auth is not None:
            user, password = basic_auth
            self.auth = basic_auth
            self.web_config_path = workdir / "web.yml"
            web = {"basic_auth_users": {user: _bcrypt(password)}}
            self.web_config_path.write_text(json.dumps(web))
        self.config_path = workdir / "prometheus.yml"
        rules_path = workdir / "rules.yml"
        rules_path.write_text(rules)
        config: dict = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules_path)],
            "scrape_configs": [{"job_name": "prometheus", "static_configs": [{"targets": [self.address]}]}],
        }
        if alertmanager_url:
            target = alertmanager_url.removeprefix("http://").rstrip("/")
            config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [target]}]}]}
        self.config_path.write_text(json.dumps(config, indent=2))

    def argv(self) -> list[str]:
        return [
            self.binary,
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            "--storage.tsdb.retention.time=2h",
            f"--web.listen-address={self.address}",
            "--log.level=warn",
        ] + ([f"--web.config.file={self.web_config_path}"] if self.web_config_path else [])

    @contextlib.contextmanager
    def stopped(self) -> Iterator[None]:
        """Prometheus is down inside the block and up again (same port, same data) after it."""
        self.stop()
        try:
            yield
        finally:
            self.start()

    def wait_for_samples(self, query: str = 'up{job="prometheus"}', timeout: float = 15.0) -> None:
        """Wait until `query` returns at least one series (the first scrapes have happened)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                body = httpx.get(f"{self.url}/api/v1/query", params={"query": query}, timeout=2.0).json()
                if body.get("data", {}).get("result"):
                    return
            time.sleep(0.1)
        raise ServerFailed(f"Prometheus has no samples for {query} after {timeout:g} s:\n{self.log_tail()}")


def _bcrypt(password: str) -> str:
    """A bcrypt hash (cost 4: fast, it is a test) for Prometheus' web configuration."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt  # Python 3.11's libcrypt binding; bcrypt through libxcrypt

    return crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))


def ci_requires_servers() -> bool:
    """In CI (`CI=true`) and under scripts/test.sh (`AIOPS_REQUIRE_SERVERS=1`) the servers are installed
    by scripts/setup.sh dev, so a missing binary is a failure, not a skip."""
    flags = (os.environ.get("CI", ""), os.environ.get("AIOPS_REQUIRE_SERVERS", ""))
    return any(flag.strip().lower() in ("true", "1", "yes") for flag in flags)
