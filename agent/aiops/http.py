"""The HTTP path to the monitoring servers and the errors it raises.

`MonitoringHTTP(base_url, name=..., timeout=..., max_bytes=...)` does one GET or POST at a time with
httpx, under `timeout`, reading the body in chunks and refusing it past `max_bytes` (never buffered whole
first), and decodes the JSON. Credentials in the URL's userinfo are sent as basic auth, never in a
request URL; errors name the server and the failure, never the URL. Every failure is an `AiOpsError`
(`NotConfigured`, `Unreachable`, `RequestTimeout`, `HTTPError`, `BadQuery`, `ResponseTooLarge`,
`BadResponse`), recorded as `<ClassName>: <message>`. `unavailable(name, url)`: why a server's tools
cannot run now (bounded `GET /-/ready`, cached), or None. Details: docs/aiops.md, *Failures*, *Only …*.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
from django.conf import settings

from audit.payloads import clip

DETAIL_CHARS = 300
USER_AGENT = "diagnosis-aiops/1"
# The readiness endpoint both Prometheus and Alertmanager serve (no query load, a few bytes).
PROBE_PATH = "/-/ready"
PROBE_MAX_BYTES = 64 * 1024


class AiOpsError(Exception):
    """A monitoring server could not give the answer asked for (see the module docstring)."""


class NotConfigured(AiOpsError):
    pass


class Unreachable(AiOpsError):
    pass


class RequestTimeout(AiOpsError):
    pass


class ResponseTooLarge(AiOpsError):
    pass


class BadResponse(AiOpsError):
    pass


class HTTPError(AiOpsError):
    def __init__(self, message: str, *, status: int, detail: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail


class BadQuery(AiOpsError):
    def __init__(self, message: str, *, error_type: str, error: str) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.error = error


class MonitoringHTTP:
    """One monitoring server's HTTP API (see the module docstring)."""

    def __init__(self, base_url: str, *, name: str, timeout: float, max_bytes: int) -> None:
        if not base_url:
            raise NotConfigured(f"{name} is not configured")
        try:
            url = httpx.URL(base_url)
        except (httpx.InvalidURL, TypeError):
            raise NotConfigured(f"{name} is configured with an invalid URL") from None
        self.auth = httpx.BasicAuth(url.username, url.password) if url.username or url.password else None
        self.base_url = str(url.copy_with(username=None, password=None)).rstrip("/")
        self.name = name
        self.timeout = timeout
        self.max_bytes = max_bytes

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | Sequence[tuple[str, Any]] | None = None,
        json_body: Any = None,
    ) -> tuple[int, Any]:
        """`(status, decoded JSON body or None)` for any status; transport failures raise."""
        name = self.name
        try:
            with (
                httpx.Client(
                    timeout=httpx.Timeout(self.timeout),
                    headers={"User-Agent": USER_AGENT},
                    auth=self.auth,
                    follow_redirects=False,
                ) as client,
                client.stream(method, f"{self.base_url}{path}", params=params, json=json_body) as response,
            ):
                body = self._read(response)
                status = response.status_code
        except httpx.TimeoutException as exc:
            raise RequestTimeout(
                f"{name} did not answer within {self.timeout:g} s ({type(exc).__name__})"
            ) from None
        except (httpx.TransportError, httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
            raise Unreachable(f"{name} is unreachable ({type(exc).__name__})") from None
        if not body:
            return status, None
        try:
            return status, json.loads(body)
        except ValueError:
            return status, _NotJSON(body.decode("utf-8", "replace"))

    def _read(self, response: httpx.Response) -> bytes:
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            raise ResponseTooLarge(f"{self.name} answered with more than {self.max_bytes} bytes")
        chunks: list[bytes] = []
        size = 0
        for chunk in response.iter_bytes():
            size += len(chunk)
            if size > self.max_bytes:
                raise ResponseTooLarge(f"{self.name} answered with more than {self.max_bytes} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    def http_error(self, status: int, body: Any) -> HTTPError:
        detail = (
            clip(body.text if isinstance(body, _NotJSON) else json.dumps(body), DETAIL_CHARS) if body else ""
        )
        return HTTPError(f"{self.name} answered HTTP {status}", status=status, detail=detail)


class _NotJSON:
    """A body that did not decode as JSON (kept for error details; never a successful result)."""

    def __init__(self, text: str) -> None:
        self.text = text


def host_of(base_url: str) -> str:
    """The host (and port) a server's URL points at, without credentials, path or scheme ("" when
    the URL is empty or not one): where an approved action would be executed."""
    try:
        url = httpx.URL(base_url) if base_url else None
    except (httpx.InvalidURL, TypeError):
        url = None
    if url is None or not url.host:
        return ""
    return f"{url.host}:{url.port}" if url.port else url.host


# ---------------------------------------------------------------------------------------------------
# Reachability: whether a server's tools are offered to a run (docs/aiops.md, *Only what can run*)
# ---------------------------------------------------------------------------------------------------
_probes: dict[tuple[str, str], tuple[float, str | None]] = {}
_probe_locks: dict[tuple[str, str], threading.Lock] = {}
_locks_lock = threading.Lock()


def unavailable(name: str, base_url: str) -> str | None:
    """Why the server `name` at `base_url` cannot serve a tool now, or None when it answered ready: not
    configured, or no 2xx to `GET /-/ready` within `AIOPS_PROBE_TIMEOUT_SECONDS` (the reason is the
    error a tool call would record, `<ErrorType>: <message>`, never the URL). The answer is reused for
    `AIOPS_PROBE_CACHE_SECONDS` by this process; one probe per server at a time, so concurrent run starts
    wait at most one probe's timeout for it."""
    key = (name, base_url)
    with _locks_lock:
        lock = _probe_locks.setdefault(key, threading.Lock())
    with lock:
        cached = _probes.get(key)
        if cached is not None and time.monotonic() < cached[0]:
            return cached[1]
        reason = _probe(name, base_url)
        ttl = float(settings.AIOPS_PROBE_CACHE_SECONDS)
        if ttl > 0:
            _probes[key] = (time.monotonic() + ttl, reason)
        else:
            _probes.pop(key, None)
        return reason


def _probe(name: str, base_url: str) -> str | None:
    try:
        http = MonitoringHTTP(
            base_url,
            name=name,
            timeout=float(settings.AIOPS_PROBE_TIMEOUT_SECONDS),
            max_bytes=PROBE_MAX_BYTES,
        )
        status, _body = http.request("GET", PROBE_PATH)
    except AiOpsError as exc:
        return f"{type(exc).__name__}: {exc}"
    if 200 <= status < 300:
        return None
    return f"NotReady: {name} answered HTTP {status} to GET {PROBE_PATH}"


def forget_probes() -> None:
    """Drop every cached probe answer (the next run start probes again)."""
    _probes.clear()
