# Over 600 lines: the declaration of every setting, one entry each, is a table; splitting it would
# split the one place a setting is declared.
"""Every setting of the service, declared once (issue 44): its environment variable, django-environ's
reader, its default, its section and one sentence for people. `config/settings.py` reads them all with
`read(env)` and makes each the Django setting of its name, so code reads `settings.NAME` and never
restates a default; docs/configuration.md's tables are generated from this list (`core/settings_doc.py`).

A default is a value or a function of the values declared before it (`not v["DEBUG"]`), returning
`REQUIRED` where the variable must be set (django-environ then raises ImproperlyConfigured). A secret's
default is never shown. Reading needs no Django setup. How to add one: docs/contributing.md.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from core.env import BASE_DIR
from core.groups import GOVERNED

REQUIRED = object()  # a default that says: no default, the variable must be set

# The readers of django-environ a setting may name, and their names in the documentation.
CASTS = {
    "str": "string",
    "bool": "bool",
    "int": "int",
    "float": "number",
    "list": "list",
    "json": "JSON",
    "path": "path",
    "db_url": "URL",
}


@dataclass(frozen=True, slots=True)
class Setting:
    """One environment variable and the Django setting it becomes."""

    name: str  # the environment variable, and the Django setting unless `setting` names another
    cast: str  # the django-environ reader (CASTS)
    default: Any  # a value, or a function of the values read before it (may return REQUIRED)
    doc: str  # for people: what it does, its unit, the check that stops a bad value
    shown: str = ""  # the default as the documentation shows it, when not the plain value
    secret: bool = False  # a credential or a URL that may hold one: its default is never shown
    setting: str = ""  # the Django setting's name when it is not the variable's
    convert: Callable[[Any, Mapping[str, Any]], Any] | None = None  # (value, values before it) → value
    composed: bool = False  # config/settings.py builds another setting from it (DATABASES, CACHES, ...)
    production: bool = False  # read only with DEBUG off (production hardening)
    environment: bool = True  # False: documented here but read by its one consumer, not a setting
    section: str = ""

    @property
    def django_name(self) -> str | None:
        """The Django setting this variable becomes; None when it becomes none by itself."""
        if self.composed or not self.environment:
            return None
        return self.setting or self.name


def read(env) -> dict[str, Any]:
    """The value of every variable (by variable name), read in declaration order with `env`; a variable
    marked `production` only when DEBUG is off."""
    values: dict[str, Any] = {}
    for item in SETTINGS:
        if not item.environment or (item.production and values["DEBUG"]):
            continue
        default = item.default(values) if callable(item.default) else copy.deepcopy(item.default)
        reader = getattr(env, item.cast)
        value = reader(item.name) if default is REQUIRED else reader(item.name, default=default)
        values[item.name] = item.convert(value, values) if item.convert else value
    return values


def django_settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """The Django settings among `values` (of `read`), by setting name."""
    return {
        item.django_name: values[item.name]
        for item in SETTINGS
        if item.django_name is not None and item.name in values
    }


def _in_sections(*entries: str | Setting) -> tuple[Setting, ...]:
    """The settings, each in the section whose title (a string) precedes it."""
    section, out = "", []
    for entry in entries:
        if isinstance(entry, str):
            section = entry
        else:
            out.append(replace(entry, section=section))
    names = [item.name for item in out]
    assert len(names) == len(set(names)), "a variable is declared twice"
    return tuple(out)


def _lowered(value: str, values: Mapping[str, Any]) -> str:
    return value.strip().lower()


def _minutes(value: float, values: Mapping[str, Any]) -> timedelta:
    return timedelta(minutes=value)


def _otlp_traces(value: str, values: Mapping[str, Any]) -> str:
    """The traces endpoint: set (non-empty) itself, else the base endpoint + /v1/traces, else none."""
    base = values["OTEL_EXPORTER_OTLP_ENDPOINT"]
    return value or (base.rstrip("/") + "/v1/traces" if base else "")


SETTINGS: tuple[Setting, ...] = _in_sections(
    "Core",
    Setting(
        "DEBUG",
        "bool",
        True,
        "development mode. With `false`: `SECRET_KEY` is required, HSTS, secure cookies, SSL redirect and "
        "`SECURE_PROXY_SSL_HEADER` are on (see [deployment.md](deployment.md))",
    ),
    Setting(
        "SECRET_KEY",
        "str",
        lambda v: "django-insecure-development-only-key-never-use-in-production" if v["DEBUG"] else REQUIRED,
        "Django's signing key; required with `DEBUG=false`",
        shown="development key (DEBUG only)",
        secret=True,
    ),
    Setting(
        "ALLOWED_HOSTS",
        "list",
        lambda v: ["127.0.0.1", "localhost", "[::1]"] if v["DEBUG"] else [],
        "comma-separated host names this service answers to",
        shown="`127.0.0.1,localhost,[::1]` in DEBUG, else empty",
    ),
    Setting(
        "CSRF_TRUSTED_ORIGINS",
        "list",
        [],
        "comma-separated origins (scheme included) behind a proxy",
    ),
    Setting(
        "STATIC_ROOT",
        "path",
        BASE_DIR / "staticfiles",
        "where `manage.py collectstatic` writes the files the proxy serves under `/static/` "
        "([deployment.md](deployment.md))",
        shown="`<project>/staticfiles`",
    ),
    "Database",
    Setting(
        "DATABASE_URL",
        "db_url",
        f"sqlite:///{BASE_DIR / 'db.sqlite3'}",
        "the database: `mysql://user:pass@host:3306/name` for MariaDB/MySQL (utf8mb4, strict mode, READ "
        "COMMITTED), else embedded SQLite",
        shown="`sqlite:///<project>/db.sqlite3`",
        secret=True,
        composed=True,
    ),
    Setting(
        "DB_CONN_MAX_AGE",
        "int",
        0,
        "seconds a database connection is kept (0 = one per request)",
        composed=True,
    ),
    Setting(
        "DATABASE_WSREP_SYNC_WAIT",
        "int",
        0,
        "MariaDB Galera only: the `wsrep_sync_wait` every connection sets (0 = not set). Behind a Galera "
        "cluster set 1: each read first waits until its node has applied every write-set the cluster "
        "ordered before it, so the first reads on the node the proxy fails over to see every commit the "
        "dead node acknowledged (the recorder's check of a commit whose answer was lost, the chain head, "
        "the lease). See [reliability.md](reliability.md#a-galera-cluster-behind-haproxy)",
        composed=True,
    ),
    Setting(
        "DATABASE_REPLICA_URL",
        "str",
        "",
        "`mysql://reader:…@replica:3306/name`: a MariaDB replica of `DATABASE_URL`'s database (a "
        "SELECT-only account is enough). The read-only surfaces (admin lists and run pages, traces, "
        "reasoning records, evidence bundles, exports, the OpenTelemetry export's trace reads, the "
        "`/metrics` collectors) read it while it is up and within the lag limit; everything else and "
        "every write uses the primary. Unset: one database. See "
        "[reliability.md](reliability.md#reads-on-a-replica)",
        shown="unset",
        secret=True,
    ),
    Setting(
        "DATABASE_REPLICA_CONNECT_TIMEOUT",
        "float",
        2.0,
        "seconds a connection to the replica may take (the replica alias and the heartbeat's reads) "
        "before the replica counts as down",
    ),
    Setting(
        "DATABASE_REPLICA_MAX_LAG_SECONDS",
        "float",
        5.0,
        "a replica whose heartbeat lags more than this (or that does not answer) gets no reads: they go "
        "to the primary until it catches up",
    ),
    Setting(
        "DATABASE_REPLICA_PIN_SECONDS",
        "float",
        10.0,
        "after a user's request that may have written (any method but GET/HEAD/OPTIONS) or a chat they "
        "started, that user's reads stay on the primary this long (read your own writes; shared through "
        "the `default` cache, so Redis with several processes); 0 = off",
    ),
    Setting(
        "DATABASE_REPLICA_CHECK_SECONDS",
        "float",
        1.0,
        "how often each process measures the replica (one heartbeat write on the primary, one read on the "
        "replica, on connections of its own)",
    ),
    "Redis",
    Setting(
        "REDIS_URL",
        "str",
        "",
        "`redis://host:6379/0`: channel layer, `default` and `canonical` caches in Redis",
        shown="unset",
        secret=True,
    ),
    Setting(
        "CANONICAL_TTL_SECONDS",
        "int",
        3600,
        "lifetime of a run's full tool results in the canonical store",
    ),
    Setting(
        "REDIS_CHANNEL_SOCKET_TIMEOUT",
        "float",
        15.0,
        "with `REDIS_URL`: socket timeout of the Redis channel layer; must stay above channels_redis's 5 "
        "s blocking read, or idle receives fail",
        composed=True,
    ),
    Setting(
        "REDIS_CHANNEL_CAPACITY",
        "int",
        5000,
        "with `REDIS_URL`: messages a process's channel list holds before frames are dropped (all "
        "followers of a process share it)",
        composed=True,
    ),
    Setting(
        "CHANNEL_LAYER_SWEEP_SECONDS",
        "float",
        1.0,
        "single-process (in-memory) channel layer: expired messages are swept at most this often (0 = on "
        "every receive and send, channels' own behaviour)",
        composed=True,
    ),
    "Model provider",
    Setting(
        "LLM_API_KEY",
        "str",
        "",
        "the model provider's API key; without it the offline `demo` model answers",
        shown="unset",
        secret=True,
    ),
    Setting(
        "LLM_PROVIDER",
        "str",
        lambda v: "openai" if v["LLM_API_KEY"] else "demo",
        "`openai` (any OpenAI-compatible API) or `demo` (offline)",
        shown="`demo` without `LLM_API_KEY`, else `openai`",
    ),
    Setting(
        "LLM_BASE_URL",
        "str",
        "https://api.openai.com/v1",
        "the provider's OpenAI-compatible endpoint, e.g. `https://api.deepseek.com`",
    ),
    Setting(
        "LLM_MODEL",
        "str",
        lambda v: "gpt-4o-mini" if v["LLM_PROVIDER"] == "openai" else "demo",
        "the agent's model",
        shown="`gpt-4o-mini` (`demo` for the demo provider)",
    ),
    Setting(
        "LLM_ROUTER_MODEL",
        "str",
        lambda v: v["LLM_MODEL"],
        "the router's model",
        shown="`LLM_MODEL`",
    ),
    Setting(
        "LLM_GUARD_MODEL",
        "str",
        lambda v: v["LLM_MODEL"],
        "the semantic guard's model",
        shown="`LLM_MODEL`",
    ),
    Setting(
        "LLM_TIMEOUT_SECONDS",
        "float",
        60.0,
        "seconds a request to the provider may take",
    ),
    Setting(
        "LLM_MAX_RETRIES",
        "int",
        3,
        "retries on 429, 5xx and connection errors",
    ),
    Setting(
        "LLM_HTTP_CLIENT",
        "str",
        "aiohttp",
        "the HTTP client the `openai` SDK sends with: `aiohttp` (the SDK's aiohttp transport, "
        "`openai.DefaultAioHttpClient`; less CPU per streamed chunk, B3's two floors in "
        "[performance.md](performance.md)) or `httpx` (the SDK's default); both honour "
        "`LLM_TIMEOUT_SECONDS` and `HTTPS_PROXY`; anything else stops the server (check `diagnosis.E005`)",
    ),
    "AI Ops: monitoring servers",
    Setting(
        "PROMETHEUS_URL",
        "str",
        "",
        "base URL of the Prometheus the `query_metrics` tool reads (`http://prometheus:9090`; userinfo is "
        "sent as basic auth); empty = not configured, the tool is not offered to analyses and their "
        "configuration says why ([aiops.md](aiops.md))",
    ),
    Setting(
        "ALERTMANAGER_URL",
        "str",
        "",
        "base URL of the Alertmanager the `list_alerts` tool reads and `create_silence` writes to "
        "(`http://alertmanager:9093`); empty = not configured, neither tool is offered",
    ),
    Setting(
        "AIOPS_HTTP_TIMEOUT_SECONDS",
        "float",
        10.0,
        "per HTTP request to Prometheus or Alertmanager (keep it below `TOOL_TIMEOUT`)",
    ),
    Setting(
        "AIOPS_MAX_RESPONSE_BYTES",
        "int",
        4 * 1024 * 1024,
        "a larger Prometheus/Alertmanager response is refused while it is read (`ResponseTooLarge`)",
    ),
    Setting(
        "AIOPS_PROBE_TIMEOUT_SECONDS",
        "float",
        2.0,
        "the bound of the reachability probe (`GET /-/ready`) made before a run offers a server's tools; "
        "a server that does not answer ready within it is left out of the run's tools, which says why",
    ),
    Setting(
        "AIOPS_PROBE_CACHE_SECONDS",
        "float",
        30.0,
        "how long a probe's answer (ready or why not) is reused by the runs a process starts; 0 = probe "
        "for every run",
    ),
    "MCP servers (toolsets)",
    Setting(
        "MCP_SERVERS",
        "json",
        [],
        "JSON list of MCP servers whose tools runs are offered ([mcp.md](mcp.md)): each `name` (a slug), "
        "`command` + `args` + `env` (stdio; `env` names the service's variables passed on) or `url` + "
        "`headers` (streamable HTTP; each header's value names the variable holding it), `flows`, "
        "`allow`/`deny` tool-name globs, `trusted`, `readOnly`/`approve` globs, `timeoutSeconds`, "
        "`outputChars`; empty = none; a malformed entry stops the server (check `diagnosis.E006`)",
    ),
    Setting(
        "MCP_CONNECT_TIMEOUT_SECONDS",
        "float",
        10.0,
        "seconds to start (or reach) an MCP server and list its tools; a server not ready by then is left "
        "out of the runs that start meanwhile, and retried with back-off (1 s doubling up to 60 s)",
    ),
    "Agent runtime",
    Setting(
        "AGENT_MAX_STEPS",
        "int",
        6,
        "model calls of the agent loop per run",
    ),
    Setting(
        "TOOL_TIMEOUT",
        "float",
        20.0,
        "seconds per tool call",
    ),
    Setting(
        "REDACTION_MODE",
        "str",
        "enforce",
        "secret redaction of what enters a run from outside (the question, previous turns, tool arguments "
        "and outputs, alert payloads) before the model call and before anything is stored: `enforce` or "
        "`off`; anything else stops the server (check `diagnosis.E003`). See "
        "[security.md](security.md#6-secret-redaction-and-pii-masking)",
    ),
    Setting(
        "REDACTION_ALLOW_KINDS",
        "list",
        [],
        "comma-separated placeholder kinds never redacted (e.g. `high-entropy-hex,secret-keyword`)",
    ),
    Setting(
        "REDACTION_EXTRA_PATTERNS",
        "list",
        [],
        "comma-separated `kind=regex` entries redacted besides the built-in detectors (group 1 when the "
        "regex has a group, else the match); an invalid one stops the server (check `diagnosis.E003`)",
    ),
    Setting(
        "REDACTION_HMAC_KEY",
        "str",
        "",
        "the key of the HMAC-SHA256 each `REDACTION_APPLIED` event records per original (at least 32 "
        "characters); required with `DEBUG=false` (check `diagnosis.E004`); in DEBUG generated once into "
        "`.local/redaction-hmac.key`",
        shown="development key (DEBUG only)",
        secret=True,
    ),
    Setting(
        "PII_MASKING",
        "bool",
        False,
        "`true`: personal data of the kinds in `PII_MASKING_KINDS` is masked by the same mechanism (see "
        "the false-positive trade-off in [security.md](security.md#6-secret-redaction-and-pii-masking))",
    ),
    Setting(
        "PII_MASKING_KINDS",
        "list",
        ["email", "phone", "ipv4", "ipv6"],
        "the PII kinds masked when `PII_MASKING` is on",
    ),
    Setting(
        "CHAT_MAX_ACTIVE_RUNS_PER_USER",
        "int",
        3,
        "running runs per user",
    ),
    Setting(
        "CHAT_THROTTLE_RATE",
        "str",
        "30/min",
        "chats a user may start per period, SSE and WebSocket together (429 `throttled`; empty = off)",
    ),
    Setting(
        "RUN_LEASE_SECONDS",
        "int",
        30,
        "lease of the executing process on a run",
    ),
    Setting(
        "RUNTIME_DB_THREADS",
        "int",
        8,
        "threads (and so database connections) the runtime uses for audit writes per process",
    ),
    Setting(
        "RUNTIME_TOOL_THREADS",
        "int",
        8,
        "threads for synchronous tools per process",
    ),
    Setting(
        "AUDIT_GROUP_COMMIT",
        "bool",
        False,
        "group commit of concurrent audit writers (`audit/write/group_commit.py`): decisions of runs that "
        "wait for a COMMIT at the same time share one transaction; every decision is still durable before "
        "its recorder method returns. Worth it with many concurrent runs and spare cores; measurements in "
        "[performance.md](performance.md)",
    ),
    Setting(
        "AUDIT_BATCH_WRITERS",
        "int",
        1,
        "with group commit on an event loop (the runtime's `db()` jobs): batches written at once, one "
        "connection each; 2 measured no gain ([performance.md](performance.md), issue 19 item 3)",
    ),
    Setting(
        "RUN_DRAIN_GRACE_SECONDS",
        "float",
        30.0,
        "on SIGTERM a serving process takes no new runs or connections and lets its runs finish for this "
        "long; the rest are handed over to another process at a step boundary "
        "([deployment.md](deployment.md#draining-restarts))",
    ),
    Setting(
        "RUN_HANDOVER_WINDOW_SECONDS",
        "float",
        10.0,
        "after the drain grace, how long runs have to reach a step boundary (a running tool finishes) "
        "before a model stream still in progress is cut and asked again by the next owner; the unit's "
        "`TimeoutStopSec` must exceed grace + 2 × window",
    ),
    Setting(
        "RUN_ADOPT_INTERVAL_SECONDS",
        "float",
        1.0,
        "how often each server process claims runs another process handed over (0 = off)",
    ),
    Setting(
        "RUN_SWEEP_INTERVAL_SECONDS",
        "float",
        15.0,
        "how often each server process fails runs whose lease expired (0 = off; see docs/chat.md)",
    ),
    Setting(
        "CHAT_SSE_HEARTBEAT_SECONDS",
        "float",
        15.0,
        "keep-alive comment period of chat SSE streams",
    ),
    Setting(
        "CHAT_RELEASE",
        "str",
        "verified",
        "`verified`: no answer text reaches a reader before the release decision; `draft`: unverified "
        "drafts stream as `draft` events and are recorded as delivered "
        "([chat.md](chat.md#release-policy-chat_release)); anything else stops the server (check "
        "`diagnosis.E001`)",
        convert=_lowered,
    ),
    Setting(
        "CHAT_DRAFT_COALESCE_MS",
        "float",
        10.0,
        "with `CHAT_RELEASE=draft`: draft pieces arriving within this window after a draft frame go out "
        "as one frame (text in order, nothing dropped; a piece that finds the run quiet goes out at once; "
        "0 = one frame per piece). See [chat.md](chat.md)",
    ),
    "AI Ops analyses and approvals",
    Setting(
        "AIOPS_WEBHOOK_TOKEN",
        "str",
        "",
        "bearer token Alertmanager sends to `POST /api/aiops/alertmanager`; empty: the webhook refuses "
        "every request (401). See [aiops.md](aiops.md)",
        secret=True,
    ),
    Setting(
        "AIOPS_SERVICE_USER",
        "str",
        "alertmanager",
        "the user owning alert-group sessions (created on first use, no usable password)",
    ),
    Setting(
        "AIOPS_WORKER_CONCURRENCY",
        "int",
        2,
        "queued AI Ops analyses each server process executes at once (0 = this process serves no queue; "
        "run `manage.py run_worker` instead)",
    ),
    Setting(
        "AIOPS_POLL_INTERVAL_SECONDS",
        "float",
        2.0,
        "how often a worker looks at an empty queue",
    ),
    Setting(
        "AIOPS_QUEUE_TIMEOUT_SECONDS",
        "int",
        3600,
        "a queued analysis no worker took in this time is failed by the sweeper (`QUEUE_EXPIRED`)",
    ),
    Setting(
        "APPROVAL_TIMEOUT_SECONDS",
        "int",
        1800,
        "a tool call waiting for approval (`create_silence`) expires after this long: a decision at or "
        "after it is refused (409 `expired`) and, like the sweeper, recorded as `APPROVAL_DECIDED` "
        "`EXPIRED`, treated as rejected; with `AIOPS_QUEUE_TIMEOUT_SECONDS` it also bounds the saved "
        "resume state's lifetime ([aiops.md](aiops.md#approvals))",
    ),
    Setting(
        "APPROVAL_ALLOW_SELF",
        "bool",
        False,
        "`true`: the requester of a run (its session's owner) may approve its own run's tool calls",
    ),
    Setting(
        "APPROVAL_SILENCE_MAX_SECONDS",
        "int",
        4 * 3600,
        "the longest silence `create_silence` may ask Alertmanager for",
    ),
    "Reasoning governance",
    Setting(
        "REASONING_ENCRYPTION_KEYS",
        "list",
        [],
        "comma-separated Fernet keys, newest first; required with `DEBUG=false` (check `reasoning.E001`); "
        "in DEBUG a key is generated once into `.local/reasoning-encryption.key`",
        secret=True,
    ),
    Setting(
        "REASONING_RETENTION_DAYS",
        "int",
        30,
        "reasoning content older than this is purged",
    ),
    Setting(
        "REASONING_THROTTLE_RATE",
        "str",
        "60/min",
        "reasoning reads per user (DRF rate: `N/sec`, `N/min`, `N/hour`, `N/day`)",
    ),
    Setting(
        "TRUSTED_PROXY_COUNT",
        "int",
        0,
        "reverse proxies appending to `X-Forwarded-For`; 0 = the access log records `REMOTE_ADDR` (also "
        "the address lockouts count)",
    ),
    Setting(
        "TRUSTED_PROXIES",
        "list",
        ["127.0.0.1/32", "::1/128"],
        "comma-separated CIDRs or addresses of the reverse proxies: only a peer inside them may send "
        "`X-Forwarded-For`, `X-Forwarded-Proto` and the other forwarded headers; from any other peer they "
        "are removed before anything reads them (`core/proxy.py`), so a client reaching a daphne port "
        "directly is recorded as itself and cannot claim HTTPS. An invalid entry stops the server (check "
        "`diagnosis.E002`)",
    ),
    "Access governance",
    Setting(
        "API_TOKEN_TTL_HOURS",
        "int",
        24 * 30,
        "lifetime of a newly issued API token (`manage.py issue_token`, `POST /api/auth/tokens/`); see "
        "[security.md](security.md)",
    ),
    Setting(
        "REASONING_REQUIRE_OTP",
        "bool",
        lambda v: not v["DEBUG"],
        "reading reasoning (API and admin) also needs a verified TOTP second factor: a verified session "
        "or a token issued after verification; a user who may read reasoning gets a token only after a "
        "TOTP check (`issue_token --otp CODE`, or a verified session). `make run` sets it to true "
        "(`scripts/run-env.sh`); `false` turns it off there explicitly",
        shown="`true` when `DEBUG=false`, else `false`",
    ),
    Setting(
        "SENSITIVE_PERMISSIONS",
        "list",
        [
            "reasoning.view_reasoning_content",
            "audit.place_legal_hold",
            "diagnosis.approve_tool_call",
            "audit.review_run",
        ],
        "permissions whose grants the governance log records and the access review reports",
    ),
    Setting(
        "REVIEW_CLAIM_MINUTES",
        "float",
        30.0,
        "how long a reviewer's claim on a run of the review queue keeps other reviewers off it "
        "([admin.md](admin.md#the-review-queue-diagnosis-runs--review-queue))",
    ),
    Setting(
        "GOVERNED_GROUPS",
        "list",
        list(GOVERNED),
        "groups whose membership and deletion the governance log always records, by name (whether they "
        "exist yet or not)",
    ),
    Setting(
        "AXES_ENABLED",
        "bool",
        True,
        "lockout of repeated failed logins and token authentications (django-axes)",
    ),
    Setting(
        "AXES_FAILURE_LIMIT",
        "int",
        5,
        "failures per (user, client address) before that user is locked out from that address (429 "
        "`locked_out`); "
        "[security.md](security.md#1-no-unlimited-guessing-no-locking-out-the-team-django-axes)",
        setting="LOCKOUT_FAILURE_LIMIT",
    ),
    Setting(
        "AXES_ANONYMOUS_FAILURE_LIMIT",
        "int",
        20,
        "failures per client address before its anonymous guesses (unknown API tokens) are locked out; "
        "wrong webhook and `/metrics` tokens have their own counters with this limit",
        setting="LOCKOUT_ANONYMOUS_FAILURE_LIMIT",
    ),
    Setting(
        "AXES_COOLOFF_MINUTES",
        "float",
        15.0,
        "how long a lockout lasts after the failure that caused it (`Retry-After`; `manage.py axes_reset` "
        "lifts it earlier)",
        setting="AXES_COOLOFF_TIME",
        convert=_minutes,
    ),
    "The record over MCP",
    Setting(
        "MCP_SERVER_ENABLED",
        "bool",
        False,
        "serve the record read-only over MCP (streamable HTTP) at `/mcp`, to API tokens "
        "([mcp.md](mcp.md#the-record-over-mcp)); off: `/mcp` is 404",
    ),
    Setting(
        "MCP_SERVER_THROTTLE_RATE",
        "str",
        "120/min",
        "requests one user may send to `/mcp` per period (429 with `Retry-After`; empty = off)",
    ),
    "Single sign-on (OpenID Connect)",
    Setting(
        "OIDC_ENABLED",
        "bool",
        False,
        "single sign-on over OpenID Connect "
        "([security.md](security.md#7-single-sign-on-openid-connect-and-break-glass-passwords)); off: "
        "`/oidc/` is 404 and nothing changes",
    ),
    Setting(
        "OIDC_PROVIDER_NAME",
        "str",
        "single sign-on",
        'the login page\'s button: "Sign in with <name>"',
    ),
    Setting(
        "OIDC_RP_CLIENT_ID",
        "str",
        "",
        "this service's client id at the provider (confidential client; redirect URI "
        "`https://<host>/oidc/callback/`)",
    ),
    Setting(
        "OIDC_RP_CLIENT_SECRET",
        "str",
        "",
        "the secret of that client at the provider",
        secret=True,
    ),
    Setting(
        "OIDC_OP_ISSUER",
        "str",
        "",
        "the provider's issuer: its discovery document is `<issuer>/.well-known/openid-configuration`, "
        "whose `issuer` and every ID token's `iss` must equal it exactly (required with OIDC on: "
        "`access.E003`)",
    ),
    Setting(
        "OIDC_OP_DISCOVERY",
        "bool",
        True,
        "read the endpoints, keys and token authentication methods from the provider's discovery document "
        "(an explicit `OIDC_OP_*_ENDPOINT` still wins); off: set the authorization, token and JWKS "
        "endpoints (`access.E003`)",
    ),
    Setting(
        "OIDC_DISCOVERY_CACHE_SECONDS",
        "int",
        3600,
        "how long each process keeps the discovery document and the JWKS (a key id not seen yet fetches "
        "the JWKS again at once)",
    ),
    Setting(
        "OIDC_OP_AUTHORIZATION_ENDPOINT",
        "str",
        "",
        "the provider's authorization endpoint; empty: the discovery document's (https with DEBUG off: "
        "`access.W001`)",
    ),
    Setting(
        "OIDC_OP_TOKEN_ENDPOINT",
        "str",
        "",
        "the provider's token endpoint; empty: the discovery document's (https with DEBUG off: "
        "`access.W001`)",
    ),
    Setting(
        "OIDC_OP_USER_ENDPOINT",
        "str",
        "",
        "the provider's userinfo endpoint; empty: the discovery document's (none there: the ID token's "
        "claims alone are used)",
    ),
    Setting(
        "OIDC_OP_JWKS_ENDPOINT",
        "str",
        "",
        "the provider's JWKS endpoint (the ID tokens' signing keys); empty: the discovery document's "
        "`jwks_uri` (https with DEBUG off: `access.W001`)",
    ),
    Setting(
        "OIDC_OP_END_SESSION_ENDPOINT",
        "str",
        "",
        "the provider's `end_session_endpoint` (RP-initiated logout); empty: the discovery document's",
    ),
    Setting(
        "OIDC_LOGOUT",
        "str",
        "provider",
        '`provider`: "Log out" of a single sign-on session ends the provider\'s session too (register '
        "`https://<host>/oidc/signed-out/` as post-logout redirect URI); where the provider has no "
        "`end_session_endpoint`, or with `local`, only this service's session ends and the signed-out "
        "page says so (`access.E006`)",
        convert=_lowered,
    ),
    Setting(
        "OIDC_TOKEN_AUTH_METHOD",
        "str",
        "",
        "the client authentication at the token endpoint, `client_secret_basic` or `client_secret_post`; "
        "empty: the first of these the discovery document advertises (`client_secret_basic` when it "
        "lists none) (`access.E006`)",
        shown="from discovery",
        convert=_lowered,
    ),
    Setting(
        "OIDC_RP_SIGN_ALGO",
        "str",
        "RS256",
        "the ID tokens' signing algorithm; asymmetric only (`access.E005`)",
    ),
    Setting(
        "OIDC_RP_SCOPES",
        "str",
        "openid email profile",
        "scopes asked for (add the one that releases the groups claim if your provider needs it)",
    ),
    Setting(
        "OIDC_USE_PKCE",
        "bool",
        True,
        "PKCE (S256) in the code flow",
    ),
    Setting(
        "OIDC_TIMEOUT",
        "float",
        10.0,
        "seconds per request to the provider; no answer by then: the sign-in says it is unreachable",
    ),
    Setting(
        "OIDC_CLOCK_SKEW_SECONDS",
        "int",
        60,
        "leeway for `exp`, `iat`, `nbf`",
    ),
    Setting(
        "OIDC_USERNAME_CLAIM",
        "str",
        "preferred_username",
        "the claim that names a new account (`sub` when absent)",
    ),
    Setting(
        "OIDC_LINK_EXISTING_USERS",
        "bool",
        False,
        "link a first login to a local account of the same name (never a superuser); off: refused",
    ),
    Setting(
        "OIDC_GROUPS_CLAIM",
        "str",
        "groups",
        "the claim listing the user's IdP groups",
    ),
    Setting(
        "OIDC_GROUP_MAP",
        "json",
        {},
        "JSON: IdP group → governed group or list of them (`Staff viewers`, `Reasoning Auditors`, "
        "`Approvers`, `Reviewers`; `access.E004`), applied on every login: added and removed, each a "
        "governance event",
    ),
    Setting(
        "OIDC_ACCEPTED_AMR",
        "list",
        [],
        "comma-separated `amr` values (e.g. `otp,mfa,hwk`) that count as the reasoning step-up's second "
        "factor",
    ),
    Setting(
        "OIDC_ACCEPTED_ACR",
        "list",
        [],
        "comma-separated `acr` values that count as it",
    ),
    Setting(
        "LOCAL_PASSWORD_LOGIN",
        "str",
        "all",
        "`breakglass`: local password sign-in only for the active superusers in `BREAK_GLASS_USERNAMES`; "
        "others are refused before their password is checked (`access.E001`)",
        convert=_lowered,
    ),
    Setting(
        "BREAK_GLASS_USERNAMES",
        "list",
        [],
        "comma-separated break-glass superusers (required with `breakglass`: `access.E002`)",
    ),
    Setting(
        "DJANGO_USER_PASSWORD",
        "str",
        "",
        "read only by `manage.py user_groups NAME --create`: the new user's password (like "
        "`createsuperuser --noinput`'s `DJANGO_SUPERUSER_PASSWORD`); unset = no usable password "
        "([deployment.md](deployment.md#5-accounts))",
        shown="unset",
        secret=True,
        environment=False,
    ),
    "Transparency log",
    Setting(
        "AUDIT_SIGNING_KEYS",
        "list",
        [],
        "Ed25519 signing keys of the transparency log's checkpoints, comma-separated, newest first "
        "(base64 of 32-byte seeds); required with `DEBUG=false` (check `audit.E001`); in DEBUG a key is "
        "generated once into `.local/audit-signing.key`. See [audit-integrity.md](audit-integrity.md)",
        secret=True,
    ),
    Setting(
        "AUDIT_VERIFY_KEYS",
        "list",
        [],
        "public keys (base64 of 32 raw bytes) of retired signing keys, so their checkpoints still verify",
    ),
    Setting(
        "AUDIT_LOG_ORIGIN",
        "str",
        "diagnosis-audit",
        "the log's name: the C2SP checkpoint's origin line and the signing key's name. Set it once to a "
        "schema-less URL naming the deployment (e.g. `audit.example.com/diagnosis`) before configuring "
        "witnesses; changing it starts a new log for them "
        "([audit-integrity.md](audit-integrity.md#checkpoint-format))",
    ),
    Setting(
        "AUDIT_CHECKPOINT_EXTENSION_LINES",
        "bool",
        False,
        "sign checkpoints with the `signed-at`/`previous` extension lines of issues 35 to 49 instead of a "
        "plain C2SP checkpoint and its signed link note; standard witnesses refuse extension lines unless "
        "their operator allows them for this log "
        "([audit-integrity.md](audit-integrity.md#checkpoint-format))",
    ),
    Setting(
        "AUDIT_CHECKPOINT_INTERVAL_SECONDS",
        "float",
        60.0,
        "how often each server process appends finished runs to the log and signs a checkpoint (0 = off; "
        "`manage.py audit_checkpoint` does it on demand)",
    ),
    Setting(
        "AUDIT_CHECKPOINT_FULL_SCAN_EVERY",
        "int",
        10,
        "the server's checkpointer searches every run, not only those since its search cursor, at its "
        "first call and every this many calls (the cursor is only an optimisation; `manage.py "
        "audit_checkpoint` always searches every run unless `--incremental`)",
    ),
    Setting(
        "AUDIT_ANCHOR_DEADLINE_SECONDS",
        "float",
        lambda v: 2 * (v["AUDIT_CHECKPOINT_INTERVAL_SECONDS"] or 60.0),
        "a finished run not anchored this long after its chained finish is a problem for `verify_audit` "
        "(liveness)",
        shown="2 × `AUDIT_CHECKPOINT_INTERVAL_SECONDS` (120)",
    ),
    Setting(
        "AUDIT_CLOCK_TOLERANCE_SECONDS",
        "float",
        5.0,
        "how far apart the clocks of the processes writing the record may be: `verify_audit`'s time "
        "checks (an anchored event after its checkpoint's signed time, a run's times going back) allow "
        "this much",
    ),
    Setting(
        "AUDIT_WRITE_KEYS",
        "list",
        [],
        "HMAC keys (base64 of 32 random bytes, comma-separated, newest first) that tag every chain link "
        "the service writes; the newest tags, every listed one verifies (keep a rotated key listed while "
        "its tags must verify); never a signing key, never in the database; required with `DEBUG=false` "
        "(check `audit.E005`); in DEBUG a key is generated once into `.local/audit-write.key` "
        "([audit-integrity.md](audit-integrity.md#write-authentication))",
        secret=True,
    ),
    Setting(
        "AUDIT_WITNESS_PATH",
        "str",
        "",
        "a fallback to witnesses: a file every signed checkpoint is appended to (one JSON line), to ship "
        "to write-once storage; `verify_audit` reads it",
    ),
    Setting(
        "AUDIT_VERIFY_STATE_PATH",
        "str",
        "",
        "where `verify_audit` keeps the state of its last clean verification (the newest checkpoint it "
        "verified, signed note and all, and each audited table's watermark, signed by the log key), so that "
        "the next one verifies only what changed since; keep it outside the database host's reach; empty: "
        "every verification is a full one "
        "([audit-integrity.md](audit-integrity.md#incremental-and-parallel-verification))",
    ),
    Setting(
        "AUDIT_WITNESSES",
        "list",
        [],
        "C2SP tlog-witness witnesses cosigning each checkpoint: comma-separated `<submission URL> "
        "<cosigner vkey>` entries; refusals are recorded and on `/metrics` "
        "([audit-integrity.md](audit-integrity.md#witnesses))",
    ),
    Setting(
        "AUDIT_WITNESS_TIMEOUT_SECONDS",
        "float",
        5.0,
        "the HTTP timeout of one submission to a witness",
    ),
    Setting(
        "AUDIT_WITNESS_POLICY",
        "list",
        [],
        "cosigner vkeys (comma-separated) whose cosignatures `verify_audit` requires on the newest "
        "checkpoint; empty: no policy",
    ),
    Setting(
        "AUDIT_WITNESS_QUORUM",
        "int",
        0,
        "how many of `AUDIT_WITNESS_POLICY` must have cosigned (0: all of them)",
    ),
    Setting(
        "AUDIT_RETENTION_DAYS",
        "int",
        183,
        "trace records of finished runs are kept this long (EU AI Act Art. 19/26(6): at least six "
        "months), then purged to tombstones",
    ),
    Setting(
        "AUDIT_PURGE_INTERVAL_SECONDS",
        "float",
        3600.0,
        "how often each server process runs that purge (0 = off; `manage.py purge_audit`)",
    ),
    "Telemetry",
    Setting(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "str",
        "",
        "the standard OTLP base endpoint: without `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, finished runs are "
        "exported to it + `/v1/traces`",
        shown="unset",
        composed=True,
    ),
    Setting(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "str",
        "",
        "where finished runs are exported as OpenTelemetry GenAI traces (OTLP/HTTP; the base endpoint "
        "gets `/v1/traces`); unset = no export. The other standard `OTEL_EXPORTER_OTLP_*` variables "
        "(headers, timeout, compression, certificates) and `OTEL_SERVICE_NAME`/`OTEL_RESOURCE_ATTRIBUTES` "
        "are read by the exporter. See [observability.md](observability.md)",
        shown="unset",
        convert=_otlp_traces,
    ),
    Setting(
        "OTEL_EXPORT_INTERVAL_SECONDS",
        "float",
        10.0,
        "how often each server process enqueues finished runs and exports due ones (0 = off; `manage.py "
        "export_otel` backfills)",
    ),
    Setting(
        "OTEL_EXPORT_BATCH",
        "int",
        50,
        "runs exported per pass",
    ),
    Setting(
        "OTEL_EXPORT_MAX_BACKOFF_SECONDS",
        "float",
        300.0,
        "longest wait between attempts of a failed export (exponential from 2 s)",
    ),
    Setting(
        "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT",
        "bool",
        False,
        "`true`: tool arguments and results go into the spans as bounded previews (≤ 500 characters); "
        "reasoning never does",
    ),
    Setting(
        "METRICS_TOKEN",
        "str",
        "",
        "bearer token `GET /metrics` requires (constant-time comparison); anything else is 401",
        secret=True,
    ),
    Setting(
        "LOOP_LAG_SAMPLE_MS",
        "float",
        0.0,
        "a serving process samples its event loop's lag this often (a timer's overshoot, served on "
        "/metrics as `diagnosis_event_loop_lag_seconds`); 0 = off",
    ),
    Setting(
        "METRICS_ALLOW_ANONYMOUS",
        "bool",
        lambda v: v["DEBUG"],
        "without a token: serve anonymous scrapes (development, or an internal-only listener); false = "
        "403. `/metrics` and `/healthz` are never redirected to HTTPS (`SECURE_REDIRECT_EXEMPT`), so a "
        "daphne port can be scraped and probed",
        shown="`DEBUG`",
    ),
    Setting(
        "METRICS_CACHE_SECONDS",
        "float",
        5.0,
        "how long the database aggregates behind `/metrics` are reused per process",
    ),
    Setting(
        "METRICS_WINDOW_SECONDS",
        "int",
        3600,
        "the record metrics cover the runs, steps and tool calls created in this sliding window (read "
        "through indexes: a scrape costs the same at any number of stored runs)",
    ),
    "Online evaluations",
    Setting(
        "EVALUATION_DUTY_INTERVAL_SECONDS",
        "float",
        10.0,
        "seconds between the online evaluators' passes in the background duties of every serving process "
        "(and `make run`): a finished run is scored within about this delay plus the time the pass takes "
        "for the runs ahead of it; several processes share the work through claims, never scoring a run "
        "twice. 0 = off (then run `manage.py run_evaluations`, or nothing is scored)",
    ),
    Setting(
        "EVALUATION_LOOKBACK_HOURS",
        "float",
        24.0,
        "the background duty and `run_evaluations` score runs finished in this many past hours (older "
        "runs are scored only by `evaluations.services.evaluate_run`)",
    ),
    Setting(
        "EVALUATION_CLAIM_SECONDS",
        "float",
        300.0,
        "a worker's claim on scoring one run with one evaluator; after this long another worker takes it "
        "over (the first died mid-judge)",
    ),
    Setting(
        "EVALUATION_JUDGE_ATTEMPTS",
        "int",
        3,
        "passes (the duty's or `run_evaluations`') that try a failing LLM-judge call (each after its "
        "claim went stale) "
        "before the failure is recorded as a `judge_error` score",
    ),
    "Security",
    Setting(
        "SECURE_SSL_REDIRECT",
        "bool",
        True,
        "with `DEBUG=false`: plain HTTP requests are redirected to HTTPS (behind a TLS proxy that sets "
        "`X-Forwarded-Proto`); `/healthz` and `/metrics` never are",
        production=True,
    ),
    Setting(
        "SECURE_HSTS_SECONDS",
        "int",
        31536000,
        "with `DEBUG=false`: the `Strict-Transport-Security` max-age in seconds (with subdomains and "
        "preload)",
        production=True,
    ),
    Setting(
        "WEBSOCKET_REQUIRE_TLS",
        "bool",
        lambda v: not v["DEBUG"],
        "a chat WebSocket that did not arrive over TLS (at daphne, or per a trusted proxy's "
        "`X-Forwarded-Proto: https`) is closed with code 4426 before anything else happens",
        shown="`true` when `DEBUG=false`, else `false`",
    ),
    "Logging",
    Setting(
        "LOG_LEVEL",
        "str",
        "INFO",
        "root log level",
    ),
)
