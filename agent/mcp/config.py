"""The configured MCP servers (`MCP_SERVERS`): parsed, checked and bounded once, never guessed.

`servers()` gives one `ServerConfig` per entry (a malformed entry raises `McpConfigError`, which the
system check `diagnosis.E006` names). Secrets never sit in the setting: stdio `env` and HTTP `headers`
name the service's environment variables that hold them, read only when a connection is made.
`needs_approval` is the approval policy. Details: docs/mcp.md, *Connecting a server*, *Approval policy*.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from agent.runtime.tools.registry import FLOW_AI_OPS, FLOW_CHAT

NAME_RE = re.compile(r"[a-z0-9]+(?:[-_][a-z0-9]+)*")  # a slug: the evidence id's `<server>` part
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
FLOWS = {"chat": FLOW_CHAT, "aiops": FLOW_AI_OPS}
NAME_CHARS = 24
DEFAULT_TIMEOUT_SECONDS = 20.0
DEFAULT_OUTPUT_CHARS = 8000
MAX_OUTPUT_CHARS = 12000  # the boundary's MODEL_CONTENT_CHARS: the model never sees more
_KEYS = frozenset(
    {"name", "command", "args", "env", "url", "headers", "flows", "allow", "deny", "trusted", "readOnly"}
    | {"approve", "timeoutSeconds", "outputChars", "maxResultBytes", "protocol"}
)
PROTOCOLS = ("auto", "legacy")  # the SDK client's modes: the newest both speak, or the handshake-era one


class McpConfigError(ValueError):
    """`MCP_SERVERS` holds an entry that cannot work (its message names the entry and the key)."""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    name: str
    command: str = ""
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # (variable the server gets, the service's variable read)
    url: str = ""
    headers: tuple[tuple[str, str], ...] = ()  # (header, the service's variable holding its value)
    flows: frozenset[str] = frozenset({FLOW_CHAT, FLOW_AI_OPS})
    allow: tuple[str, ...] = ("*",)
    deny: tuple[str, ...] = ()
    trusted: bool = False
    read_only: tuple[str, ...] = ()
    approve: tuple[str, ...] = ()
    timeout: float = DEFAULT_TIMEOUT_SECONDS
    output_chars: int = DEFAULT_OUTPUT_CHARS
    max_result_bytes: int = 1 << 20
    protocol: str = "auto"

    @property
    def transport(self) -> str:
        return "stdio" if self.command else "streamable-http"

    @property
    def where(self) -> str:
        """Where its calls act, for people (never a secret): the URL's host, or the command's name."""
        if self.url:
            return f"MCP server {self.name} at {urlsplit(self.url).netloc.rpartition('@')[2]}"
        return f"MCP server {self.name} (stdio: {os.path.basename(self.command)})"

    def endpoint(self) -> dict[str, Any]:
        """How it is reached, for the run's configuration and its spans (never a secret): the transport,
        and for HTTP the URL's host and port (never its user part, path or query)."""
        if not self.url:
            return {"transport": "stdio"}
        parts = urlsplit(self.url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return {"transport": "streamable-http", "address": parts.hostname or "", "port": port}

    def offers(self, tool: str) -> bool:
        """Whether the tool named `tool` by the server passes `allow` and not `deny`."""
        return _matches(tool, self.allow) and not _matches(tool, self.deny)

    def needs_approval(self, tool: str, read_only_hint: bool | None) -> bool:
        """Every tool needs a person's approval unless it is declared read-only: by the operator
        (`readOnly`), or by the server's `readOnlyHint` when the server is `trusted`; `approve` wins."""
        if _matches(tool, self.approve):
            return True
        return not (_matches(tool, self.read_only) or (self.trusted and read_only_hint is True))

    def child_env(self) -> dict[str, str]:
        return {target: os.environ[source] for target, source in self.env if source in os.environ}

    def http_headers(self) -> dict[str, str]:
        return {header: os.environ[source] for header, source in self.headers if source in os.environ}


def _matches(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _strings(entry: Mapping[str, Any], key: str, default: Sequence[str] = ()) -> tuple[str, ...]:
    value = entry.get(key, list(default))
    if not isinstance(value, list) or not all(isinstance(v, str) and len(v) <= 500 for v in value):
        raise McpConfigError(f"MCP server {entry.get('name')!r}: {key} must be a list of strings")
    return tuple(value)


def _names(entry: Mapping[str, Any], key: str) -> tuple[tuple[str, str], ...]:
    """`env` / `headers`: a list of variable names (the same name) or an object name → variable."""
    value = entry.get(key) or {}
    pairs = [(v, v) for v in value] if isinstance(value, list) else list(dict(value).items())
    for target, source in pairs:
        if not (isinstance(target, str) and isinstance(source, str) and ENV_NAME_RE.fullmatch(source)):
            raise McpConfigError(f"MCP server {entry.get('name')!r}: {key} must name environment variables")
    return tuple(sorted(pairs))


def _number(entry: Mapping[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = entry.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise McpConfigError(f"MCP server {entry.get('name')!r}: {key} must be a number from {low} to {high}")
    return value


def parse_server(entry: Any) -> ServerConfig:
    if not isinstance(entry, dict):
        raise McpConfigError("each MCP server is a JSON object")
    name = entry.get("name")
    if not isinstance(name, str) or len(name) > NAME_CHARS or not NAME_RE.fullmatch(name):
        raise McpConfigError(f"MCP server name {name!r} must be a slug of at most {NAME_CHARS} characters")
    unknown = sorted(set(entry) - _KEYS)
    if unknown:
        raise McpConfigError(f"MCP server {name!r}: unknown key(s) {', '.join(unknown[:5])}")
    command, url = entry.get("command") or "", entry.get("url") or ""
    if bool(command) == bool(url) or not isinstance(command, str) or not isinstance(url, str):
        raise McpConfigError(f"MCP server {name!r}: give either a command (stdio) or a url (streamable HTTP)")
    if url and urlsplit(url).scheme not in ("http", "https"):
        raise McpConfigError(f"MCP server {name!r}: url must be http(s)")
    flows = _strings(entry, "flows", ("chat", "aiops"))
    if not flows or any(f not in FLOWS for f in flows):
        raise McpConfigError(f"MCP server {name!r}: flows are some of {', '.join(FLOWS)}")
    trusted = entry.get("trusted", False)
    if not isinstance(trusted, bool):
        raise McpConfigError(f"MCP server {name!r}: trusted must be true or false")
    protocol = entry.get("protocol", "auto")
    if protocol not in PROTOCOLS:
        raise McpConfigError(f"MCP server {name!r}: protocol is one of {', '.join(PROTOCOLS)}")
    return ServerConfig(
        name=name,
        command=command,
        args=_strings(entry, "args"),
        env=_names(entry, "env"),
        url=url,
        headers=_names(entry, "headers"),
        flows=frozenset(FLOWS[f] for f in flows),
        allow=_strings(entry, "allow", ("*",)),
        deny=_strings(entry, "deny"),
        trusted=trusted,
        read_only=_strings(entry, "readOnly"),
        approve=_strings(entry, "approve"),
        timeout=float(_number(entry, "timeoutSeconds", DEFAULT_TIMEOUT_SECONDS, 0.1, 600)),
        output_chars=int(_number(entry, "outputChars", DEFAULT_OUTPUT_CHARS, 100, MAX_OUTPUT_CHARS)),
        max_result_bytes=int(_number(entry, "maxResultBytes", 1 << 20, 1024, 16 << 20)),
        protocol=protocol,
    )


def servers(value: Any = None) -> tuple[ServerConfig, ...]:
    """The configured servers (`value`, default `settings.MCP_SERVERS`), checked; names unique."""
    value = settings.MCP_SERVERS if value is None else value
    if not isinstance(value, list):
        raise McpConfigError("MCP_SERVERS must be a JSON list")
    parsed = tuple(parse_server(entry) for entry in value)
    names = [s.name for s in parsed]
    if len(set(names)) != len(names):
        raise McpConfigError("MCP server names must be unique")
    return parsed
