"""System checks of the diagnosis runtime's configuration.

`diagnosis.E001` (an error: `runserver`, `migrate` and `check --deploy` refuse to start): `CHAT_RELEASE`
is neither `verified` nor `draft`. A typo must not silently pick a release policy.
`diagnosis.E002` (an error): an entry of `TRUSTED_PROXIES` is not an address or CIDR network
(`core.proxy`); a typo must not silently trust nobody, or somebody else.
`diagnosis.E005` (an error): `LLM_HTTP_CLIENT` is neither `aiohttp` nor `httpx`.
`diagnosis.E006` (an error): an entry of `MCP_SERVERS` cannot work (`agent.mcp.config`).
"""

from django.conf import settings
from django.core.checks import Error, register

from diagnosis.models import ReleaseMode


@register()
def check_release_mode(app_configs=None, **kwargs) -> list[Error]:
    value = str(settings.CHAT_RELEASE).strip().lower()
    if value in ReleaseMode.values:
        return []
    return [
        Error(
            f"CHAT_RELEASE={value!r} is not a release policy.",
            hint="Use `verified` (default: no answer text before the guards decide) or `draft` "
            "(unverified drafts are streamed and recorded as delivered).",
            id="diagnosis.E001",
        )
    ]


@register()
def check_trusted_proxies(app_configs=None, **kwargs) -> list[Error]:
    import ipaddress

    bad = []
    for item in settings.TRUSTED_PROXIES or ():
        try:
            ipaddress.ip_network(str(item).strip(), strict=False)
        except ValueError:
            bad.append(str(item))
    if not bad:
        return []
    return [
        Error(
            f"TRUSTED_PROXIES has entries that are not addresses or networks: {', '.join(map(repr, bad))}.",
            hint="Use comma-separated CIDRs or addresses of the reverse proxies, e.g. 127.0.0.1/32,10.0.0.5.",
            id="diagnosis.E002",
        )
    ]


@register()
def check_redaction(app_configs=None, **kwargs) -> list[Error]:
    """`diagnosis.E003`: `REDACTION_MODE` is not `enforce` or `off`, or an entry of
    `REDACTION_EXTRA_PATTERNS` is not `kind=regex`; `diagnosis.E004`: no `REDACTION_HMAC_KEY` (at least 32
    characters) with DEBUG off. Redaction must never be silently off or unkeyed (agent/redaction.py)."""
    from agent.redaction import MODES, parse_extra_patterns

    errors = []
    mode = str(settings.REDACTION_MODE).strip().lower()
    if mode not in MODES:
        errors.append(
            Error(
                f"REDACTION_MODE={mode!r} is not a redaction mode.",
                hint="Use `enforce` or `off`.",
                id="diagnosis.E003",
            )
        )
    try:
        parse_extra_patterns(settings.REDACTION_EXTRA_PATTERNS or ())
    except ValueError as exc:
        errors.append(Error(str(exc), hint="Write each entry as kind=regex.", id="diagnosis.E003"))
    key = str(settings.REDACTION_HMAC_KEY or "").strip()
    if not settings.REDACTION_DEV_KEY_FILE and len(key) < 32:
        errors.append(
            Error(
                "REDACTION_HMAC_KEY is missing or shorter than 32 characters.",
                hint="Set a random key (e.g. `python -c 'import secrets; print(secrets.token_hex(32))'`); "
                "auditors need it to confirm which secret a REDACTION_APPLIED event recorded.",
                id="diagnosis.E004",
            )
        )
    return errors


@register()
def check_llm_http_client(app_configs=None, **kwargs) -> list[Error]:
    from agent.runtime.llm import HTTP_CLIENTS

    value = str(settings.LLM_HTTP_CLIENT or "").strip().lower()
    if value in HTTP_CLIENTS:
        return []
    return [
        Error(
            f"LLM_HTTP_CLIENT={value!r} is not an HTTP client the model client knows.",
            hint="Use `aiohttp` (default: the SDK's aiohttp transport) or `httpx` (the SDK's default).",
            id="diagnosis.E005",
        )
    ]


@register()
def check_mcp_servers(app_configs=None, **kwargs) -> list[Error]:
    """`diagnosis.E006`: an entry of `MCP_SERVERS` cannot work (docs/mcp.md)."""
    from agent.mcp.config import McpConfigError, servers

    try:
        servers()
    except McpConfigError as exc:
        return [Error(str(exc), hint="See docs/mcp.md, *Connecting a server*.", id="diagnosis.E006")]
    return []
