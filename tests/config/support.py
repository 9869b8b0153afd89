"""The shipped deployment (deploy/), started as a test's own processes: Debian's nginx in the foreground
with `deploy/nginx/diagnosis.conf`, and daphne processes with the `ExecStart` of
`deploy/systemd/diagnosis@.service`, in the environment of `deploy/diagnosis.env.example` (not under
systemd, and never the system's nginx service).

Only what a test machine must differ in is substituted, each substitution checked to apply exactly as
often as expected, so a change to the shipped files that the test would silently stop exercising fails:
the listen ports (127.0.0.1 only, no IPv6), the upstream's daphne ports, the TLS port in the port-80
redirect, the server name (`localhost`), the certificate, the static root; in the unit, the virtualenv's
python and `%i`; in the environment, every `CHANGE_ME` and the machine's addresses.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import ipaddress
import os
import re
import secrets
import shlex
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from cryptography import x509
from cryptography.fernet import Fernet
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from django.conf import settings
from websockets.asyncio.client import connect as async_ws_connect

from audit.transparency.keys import generate_key_text
from core import writeauth
from tests.agent.aiops.servers import _die_with_parent, free_port
from tests.surfaces.chat.support import database_url

BASE_DIR = Path(settings.BASE_DIR)
DEPLOY = BASE_DIR / "deploy"
SITE = DEPLOY / "nginx" / "diagnosis.conf"
UNIT = DEPLOY / "systemd" / "diagnosis@.service"
ENV_TEMPLATE = DEPLOY / "diagnosis.env.example"
NGINX = "/usr/sbin/nginx"
HOST = "localhost"


def nginx_binary() -> str | None:
    return shutil.which("nginx") or (NGINX if Path(NGINX).exists() else None)


# -------------------------------------------------------------------------------------------------
# A self-signed certificate for localhost
# -------------------------------------------------------------------------------------------------
def self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    """(certificate, key) files for `localhost` and 127.0.0.1, valid for a day."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOST)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName(HOST), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "fullchain.pem", directory / "privkey.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


def client_tls(cert_path: Path) -> ssl.SSLContext:
    """A client context that trusts exactly the test certificate."""
    return ssl.create_default_context(cafile=str(cert_path))


class TlsWebSocket:
    """A blocking `wss://` client whose TLS socket is read and written by one thread only.

    websockets' sync client reads in a background thread while the caller writes, both on one
    `ssl.SSLSocket`. An OpenSSL connection is not safe for that: on CPython 3.11 the race failed a
    handshake's write with "[SSL] internal error" (stop 58's CI, test_deployment). This runs websockets'
    asyncio client on an event loop of its own and hands each `send` and `recv` to that loop, so every
    TLS read and write happens on the loop's thread. Errors are websockets' own (`ConnectionClosed`,
    `InvalidStatus`); `recv` raises `TimeoutError` when nothing arrives in `timeout` seconds.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, connection) -> None:
        self._loop, self._connection = loop, connection

    def _call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def send(self, message: str) -> None:
        self._call(self._connection.send(message))

    def recv(self, timeout: float) -> str:
        return self._call(asyncio.wait_for(self._connection.recv(), timeout))


@contextlib.contextmanager
def wss_connect(
    url: str, *, cert: Path, headers: dict[str, str], open_timeout: float
) -> Iterator[TlsWebSocket]:
    """Open `url` trusting exactly the test certificate; close the connection and its loop on exit."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name=f"wss {url}", daemon=True)
    thread.start()

    async def _open():
        return await async_ws_connect(
            url, ssl=client_tls(cert), additional_headers=headers, open_timeout=open_timeout
        )

    try:
        connection = asyncio.run_coroutine_threadsafe(_open(), loop).result()
        try:
            yield TlsWebSocket(loop, connection)
        finally:
            asyncio.run_coroutine_threadsafe(connection.close(), loop).result()
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


# -------------------------------------------------------------------------------------------------
# Substitutions
# -------------------------------------------------------------------------------------------------
def _sub(text: str, old: str, new: str, count: int = 1) -> str:
    found = text.count(old)
    assert found == count, f"{old!r} occurs {found} times in the shipped file, the test expects {count}"
    return text.replace(old, new)


def site_config(
    *, http_port: int, tls_port: int, upstreams: list[int], cert: Path, key: Path, static: Path
) -> str:
    text = SITE.read_text()
    text = _sub(text, "    listen 80;\n", f"    listen 127.0.0.1:{http_port};\n")
    text = _sub(text, "    listen [::]:80;\n", "")
    text = _sub(text, "    listen 443 ssl;\n", f"    listen 127.0.0.1:{tls_port} ssl;\n")
    text = _sub(text, "    listen [::]:443 ssl;\n", "")
    text = _sub(text, 'set $diagnosis_tls_suffix "";', f'set $diagnosis_tls_suffix ":{tls_port}";')
    text = _sub(text, "server_name diagnosis.example.com;", f"server_name {HOST};", count=2)
    upstream = "".join(f"    server 127.0.0.1:{port} max_fails=0;\n" for port in upstreams)
    text = _sub(
        text, "    server 127.0.0.1:8001 max_fails=0;\n    server 127.0.0.1:8002 max_fails=0;\n", upstream
    )
    text = _sub(text, "/etc/ssl/diagnosis/fullchain.pem", str(cert))
    text = _sub(text, "/etc/ssl/diagnosis/privkey.pem", str(key))
    text = _sub(text, "/srv/diagnosis/staticfiles/", f"{static}/")
    return text


def main_config(workdir: Path, site: Path) -> str:
    """The nginx.conf around the site: foreground, files in `workdir`, Debian's mime types."""
    temp = "".join(
        f"    {kind}_temp_path {workdir / kind};\n"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    # As root, nginx's workers would run as `nobody`, who cannot read a test's private temp directory.
    user = "user root;\n" if os.geteuid() == 0 else ""
    return (
        f"{user}daemon off;\nworker_processes 1;\npid {workdir / 'nginx.pid'};\n"
        f"error_log {workdir / 'error.log'} info;\n"
        "events { worker_connections 512; }\n"
        "http {\n    include /etc/nginx/mime.types;\n    default_type application/octet-stream;\n"
        f"    access_log {workdir / 'access.log'};\n{temp}    include {site};\n}}\n"
    )


def unit_command(port: int) -> list[str]:
    """The unit's ExecStart for instance `port`, with this virtualenv's python."""
    match = re.search(r"^ExecStart=(.+)$", UNIT.read_text(), re.MULTILINE)
    assert match, "no ExecStart in the shipped unit"
    argv = shlex.split(match.group(1))
    assert argv[0] == "/srv/diagnosis/app/.venv/bin/python", argv[0]
    line = " ".join(argv[1:])
    assert line.count("%i") == 1, line
    return [sys.executable, *(arg.replace("%i", str(port)) for arg in argv[1:])]


def environment(overrides: dict[str, str]) -> dict[str, str]:
    """`deploy/diagnosis.env.example` with every CHANGE_ME filled in and `overrides` applied."""
    values: dict[str, str] = {}
    for raw in ENV_TEMPLATE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, _, value = line.partition("=")
        values[name] = value
    generated = {
        "SECRET_KEY": secrets.token_urlsafe(50),
        "REASONING_ENCRYPTION_KEYS": Fernet.generate_key().decode(),
        "AUDIT_SIGNING_KEYS": generate_key_text(),
        "AUDIT_WRITE_KEYS": generate_key_text(),
        "REDACTION_HMAC_KEY": secrets.token_hex(32),
        "AIOPS_WEBHOOK_TOKEN": secrets.token_urlsafe(24),
        "METRICS_TOKEN": secrets.token_urlsafe(24),
        "DATABASE_URL": database_url(),
    }
    values.update(generated)
    values.update(overrides)
    left = sorted(name for name, value in values.items() if "CHANGE_ME" in value)
    assert not left, f"the test left CHANGE_ME in {left}"
    assert values["DEBUG"] == "false"
    return values


# -------------------------------------------------------------------------------------------------
# Processes
# -------------------------------------------------------------------------------------------------
class Nginx:
    """Debian's nginx as a foreground child of the test, with the shipped site."""

    def __init__(self, workdir: Path, site: str) -> None:
        self.workdir = workdir
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (workdir / kind).mkdir(parents=True, exist_ok=True)
        self.site = workdir / "diagnosis.conf"
        self.site.write_text(site)
        self.conf = workdir / "nginx.conf"
        self.conf.write_text(main_config(workdir, self.site))
        self.proc: subprocess.Popen | None = None

    def argv(self) -> list[str]:
        return [
            nginx_binary() or NGINX,
            "-p",
            str(self.workdir),
            "-e",
            str(self.workdir / "error.log"),
            "-c",
            str(self.conf),
        ]

    def start(self, port: int, timeout: float = 10.0) -> Nginx:
        check = subprocess.run([*self.argv(), "-t"], capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, check.stderr
        self.log = open(self.workdir / "nginx.out", "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            self.argv(), stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent
        )
        _wait_listening(
            port, self.proc, timeout, lambda: (self.workdir / "error.log").read_text(errors="replace")
        )
        return self

    def stop(self) -> None:
        _stop(self.proc)
        if getattr(self, "log", None) is not None:
            self.log.close()


class UnitDaphne:
    """One `diagnosis@PORT` instance: the unit's command line in the template's environment."""

    def __init__(self, port: int, env: dict[str, str], log_path: Path) -> None:
        self.port = port
        self.env = env
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> UnitDaphne:
        env = process_env(self.env)
        self.log = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            unit_command(self.port),
            cwd=BASE_DIR,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )
        _wait_listening(self.port, self.proc, timeout, self.output)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self, timeout: float = 20.0) -> int:
        """SIGTERM, as systemd stops the unit; the exit status."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        self.log.close()
        return code

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.log.close()

    def stop(self) -> None:
        _stop(self.proc)
        if getattr(self, "log", None) is not None and not self.log.closed:
            self.log.close()


def process_env(deployment: dict[str, str]) -> dict[str, str]:
    """The environment of a deployment process: this machine's (PATH, ...) without anything of the test
    process's own configuration, then the deployment's settings."""
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LLM_", "PYTEST", "DJANGO_", "AIOPS_", "METRICS_", "RUN_", "AUDIT_"))
        and k not in ("REDIS_URL", "DATABASE_URL", "DEBUG")
    }
    return {**base, **deployment, "PYTHONUNBUFFERED": "1", "DJANGO_SETTINGS_MODULE": "config.settings"}


def _wait_listening(port: int, proc: subprocess.Popen, timeout: float, output) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}:\n{output()[-3000:]}")
        with socket.socket() as sock:
            sock.settimeout(0.2)
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"not listening on {port} after {timeout} s:\n{output()[-3000:]}")


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def direct_client(port: int, source: str) -> httpx.Client:
    """A client that reaches a daphne port itself, from loopback address `source` (not the proxy's)."""
    return httpx.Client(
        base_url=f"http://127.0.0.1:{port}",
        transport=httpx.HTTPTransport(local_address=source),
        headers={"Host": HOST},
        timeout=20,
    )


# -------------------------------------------------------------------------------------------------
# The deployment of a test
# -------------------------------------------------------------------------------------------------
REDIS_URL = "redis://127.0.0.1:6379/0"
TIMEOUT = 20
PASSWORD = "deploy-pw-Staff-1"


def require_deployment_services() -> None:
    missing = []
    if nginx_binary() is None:
        missing.append("nginx (scripts/setup.sh dev)")
    try:
        redis.Redis.from_url(REDIS_URL, socket_timeout=1).ping()
    except redis.RedisError:
        missing.append("Redis on 127.0.0.1:6379 (scripts/redis.sh)")
    if missing:
        if os.environ.get("DEPLOY_REQUIRE_NGINX"):
            pytest.fail(f"missing: {', '.join(missing)}")
        pytest.skip(f"missing: {', '.join(missing)}")


class Deployment:
    """The running deployment of one test: nginx, two daphne instances, their environment (`env`: the
    test's own settings on top)."""

    def __init__(self, tmp_path, provider, env: dict[str, str] | None = None) -> None:
        self.tmp = tmp_path
        self.cert, key = self_signed_certificate(tmp_path)
        self.static = tmp_path / "static"
        self.http_port, self.tls_port = free_port(), free_port()
        self.ports = [free_port(), free_port()]
        self.env = environment(
            {
                **provider.env(provider.base_url),
                "ALLOWED_HOSTS": HOST,
                "CSRF_TRUSTED_ORIGINS": f"https://{HOST}:{self.tls_port}",
                "REDIS_URL": REDIS_URL,
                "STATIC_ROOT": str(self.static),
                "AUDIT_WITNESS_PATH": str(tmp_path / "witness.jsonl"),
                "PROMETHEUS_URL": "",
                "ALERTMANAGER_URL": "",
                # Short enough for a test: leases, sweeps and queue polls in seconds.
                "RUN_LEASE_SECONDS": "3",
                "RUN_SWEEP_INTERVAL_SECONDS": "1",
                "AIOPS_POLL_INTERVAL_SECONDS": "0.5",
                "LOG_LEVEL": "INFO",
                # The test database was migrated (its grants recorded and tagged) by this process: the
                # deployment serving it holds the same write key, as a deployment holds the key its
                # database was written with.
                "AUDIT_WRITE_KEYS": ",".join(writeauth.configured_key_texts()),
                **(env or {}),
            }
        )
        self.manage("collectstatic", "--noinput")
        self.nginx = Nginx(
            tmp_path / "nginx",
            site_config(
                http_port=self.http_port,
                tls_port=self.tls_port,
                upstreams=self.ports,
                cert=self.cert,
                key=key,
                static=self.static,
            ),
        )
        self.daphnes = [UnitDaphne(port, self.env, tmp_path / f"daphne-{port}.log") for port in self.ports]

    def manage(self, *args: str) -> str:
        """`manage.py ARGS` in the deployment's environment; its output."""
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=BASE_DIR,
            env=process_env(
                {**self.env, "DJANGO_SUPERUSER_PASSWORD": PASSWORD, "DJANGO_USER_PASSWORD": PASSWORD}
            ),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, (done.stdout + done.stderr)[-2000:]
        return done.stdout

    @property
    def url(self) -> str:
        return f"https://{HOST}:{self.tls_port}"

    def client(self, **kwargs) -> httpx.Client:
        kwargs.setdefault("timeout", TIMEOUT)
        return httpx.Client(base_url=self.url, verify=client_tls(self.cert), **kwargs)

    def by_pid(self, pid: int) -> UnitDaphne:
        return next(d for d in self.daphnes if d.proc is not None and d.pid == pid)

    def stop(self) -> None:
        for daphne in self.daphnes:
            daphne.stop()
        self.nginx.stop()


__all__ = [
    "BASE_DIR",
    "HOST",
    "PASSWORD",
    "REDIS_URL",
    "TIMEOUT",
    "Deployment",
    "Nginx",
    "UnitDaphne",
    "client_tls",
    "direct_client",
    "environment",
    "free_port",
    "nginx_binary",
    "process_env",
    "require_deployment_services",
    "self_signed_certificate",
    "site_config",
]
