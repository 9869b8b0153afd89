"""Settings for the diagnosis service, in sections, every machine-specific value from the environment.

The variables are listed in docs/configuration.md and in the API contract's *Configuration* section.
Development defaults (DEBUG on, embedded SQLite, demo model, in-memory channel layer and canonical store)
let a fresh clone run with no configuration; production hardening switches on whenever DEBUG is off.
"""

import datetime as dt
import os

from core.env import BASE_DIR, env
from core.groups import GOVERNED

# ---------------------------------------------------------------------------------------------------
# Core
# ---------------------------------------------------------------------------------------------------
DEBUG = env.bool("DEBUG", default=True)

# In development an insecure key is acceptable; with DEBUG off SECRET_KEY must be set (environ raises).
SECRET_KEY = (
    env.str("SECRET_KEY", default="django-insecure-development-only-key-never-use-in-production")
    if DEBUG
    else env.str("SECRET_KEY")
)

ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]"] if DEBUG else [])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = None
ASGI_APPLICATION = "config.asgi.application"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# ---------------------------------------------------------------------------------------------------
# Applications (daphne first so that `runserver` is the ASGI server)
# ---------------------------------------------------------------------------------------------------
INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    # Lockout of repeated failed logins and token authentications (access/lockout.py, docs/security.md).
    "axes",
    # TOTP second factor for reading reasoning (access/stepup.py).
    "django_otp",
    "django_otp.plugins.otp_totp",
    # The layers, bottom up (docs/architecture.md): identity, the record, the agent, its surfaces.
    "diagnosis",
    "audit",
    "reasoning",
    "access",
    "telemetry",
    # What model calls cost: the pricing rule, price overrides, runs' stored cost (pricing/).
    "pricing",
    "agent",
    # Online evaluators scoring finished runs, chained into their record (evaluations/, issue 34).
    "evaluations",
    # Datasets from real runs and experiments replaying them under a candidate configuration
    # (experiments/, issue 34).
    "experiments",
    "surfaces",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Content-Security-Policy on every response (core/csp.py; Django 5.2 has none built in).
    "core.csp.ContentSecurityPolicyMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # request.user.is_verified(): whether this session passed a TOTP check (django-otp).
    "django_otp.middleware.OTPMiddleware",
    # The request, for code beneath it: the governance events' actor (access/middleware.py) and the
    # replica pin below (core/request_context.py).
    "core.request_context.CurrentRequestMiddleware",
    # Read your writes: a user who wrote reads the primary for a while (core/db_router.py).
    "core.db_router.ReplicaPinMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Answers a request that axes marked locked out (access.lockout.lockout_response).
    "axes.middleware.AxesMiddleware",
    # Innermost: any non-JSON error response under /api/ becomes {"error": {"code", "message"}}.
    "core.api.ApiErrorMiddleware",
]

# axes first: a locked-out username or address is refused before any password is checked. Then
# Django's ModelBackend with its per-request user read compiled once (access/backends.py).
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "access.backends.ModelBackend",
    # OpenID Connect (access/oidc.py): answers nothing while OIDC_ENABLED is off.
    "access.oidc.OidcBackend",
]
# Django's database sessions, their per-request read compiled once (access/sessions.py).
SESSION_ENGINE = "access.sessions"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                # The login page's "Sign in with …" button and password policy (access/passwords.py).
                "access.passwords.login_context",
            ],
        },
    },
]

STATIC_URL = "static/"
# Where `collectstatic` puts the files the proxy serves under /static/ (deploy/nginx/diagnosis.conf).
STATIC_ROOT = env.path("STATIC_ROOT", default=BASE_DIR / "staticfiles")

LOGIN_URL = "admin:login"

# ---------------------------------------------------------------------------------------------------
# Database: embedded SQLite by default, mysql://… for MariaDB/MySQL (utf8mb4, strict mode)
# ---------------------------------------------------------------------------------------------------
DATABASES = {"default": env.db_url("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}")}

MYSQL_OPTIONS = {
    "charset": "utf8mb4",
    "init_command": (
        "SET sql_mode='STRICT_TRANS_TABLES,STRICT_ALL_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,"
        "ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION', "
        "collation_connection='utf8mb4_unicode_ci'"
    ),
    "isolation_level": "read committed",
}
_db = DATABASES["default"]
if _db["ENGINE"] == "django.db.backends.mysql":
    _db.setdefault("OPTIONS", {}).update(MYSQL_OPTIONS)
    # One test database per test process, so parallel suites on one server never clobber each other.
    _db["TEST"] = {
        "NAME": f"test_{_db['NAME']}_{os.getpid()}",
        "CHARSET": "utf8mb4",
        "COLLATION": "utf8mb4_unicode_ci",
    }
elif _db["ENGINE"] == "django.db.backends.sqlite3":
    # WAL lets readers proceed beside the one writer; IMMEDIATE takes the write lock at BEGIN so that
    # concurrent writers queue on `timeout` instead of failing with "database is locked" on upgrade.
    _db.setdefault("OPTIONS", {}).update(
        {
            "timeout": 30,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    )
    # A file, not shared-cache memory: the recorder's concurrency tests write from many threads.
    _db["TEST"] = {"NAME": str(BASE_DIR / f".test-db-{os.getpid()}.sqlite3")}
_db.setdefault("CONN_MAX_AGE", env.int("DB_CONN_MAX_AGE", default=0))
_db["CONN_HEALTH_CHECKS"] = True

# A read replica (docs/reliability.md, *Reads on a replica*): read-only surfaces read it through
# `core.db_router` while it is up and within the lag limit; everything else, and every write, uses the
# primary. In tests it mirrors the primary (the replica tests build their own pair: tests/core/replica/).
DATABASE_REPLICA_URL = env.str("DATABASE_REPLICA_URL", default="")
if DATABASE_REPLICA_URL:
    _replica = env.db_url_config(DATABASE_REPLICA_URL)
    if _replica["ENGINE"] == "django.db.backends.mysql":
        _replica.setdefault("OPTIONS", {}).update(MYSQL_OPTIONS)
        # A replica that is down is refused at once; one that hangs holds a read at most this long to connect.
        _replica["OPTIONS"].setdefault(
            "connect_timeout", env.int("DATABASE_REPLICA_CONNECT_TIMEOUT", default=2)
        )
    _replica["CONN_MAX_AGE"] = _db["CONN_MAX_AGE"]
    _replica["CONN_HEALTH_CHECKS"] = True
    _replica["TEST"] = {"MIRROR": "default"}
    DATABASES["replica"] = _replica
DATABASE_ROUTERS = ["core.db_router.ReplicaRouter"]
# Reads fall back to the primary while the replica's heartbeat lags more than this (seconds).
DATABASE_REPLICA_MAX_LAG_SECONDS = env.float("DATABASE_REPLICA_MAX_LAG_SECONDS", default=5.0)
# After a user's request that may have written, that user's reads stay on the primary this long.
DATABASE_REPLICA_PIN_SECONDS = env.float("DATABASE_REPLICA_PIN_SECONDS", default=10.0)
# How often each process measures the replica's heartbeat (a write on the primary, a read on the replica).
DATABASE_REPLICA_CHECK_SECONDS = env.float("DATABASE_REPLICA_CHECK_SECONDS", default=1.0)
DATABASE_REPLICA_CONNECT_TIMEOUT = env.float("DATABASE_REPLICA_CONNECT_TIMEOUT", default=2.0)

# ---------------------------------------------------------------------------------------------------
# Redis: channel layer and the canonical store (in-memory without REDIS_URL)
# ---------------------------------------------------------------------------------------------------
REDIS_URL = env.str("REDIS_URL", default="")

# How long a run's full tool results stay in the canonical store (seconds).
CANONICAL_TTL_SECONDS = env.int("CANONICAL_TTL_SECONDS", default=3600)

if REDIS_URL:
    CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL},
        "canonical": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": "canonical",
            "TIMEOUT": CANONICAL_TTL_SECONDS,
        },
    }
    # The socket timeout must outlast channels_redis's blocking pop (BZPOPMIN, 5 s): redis-py 8 defaults it
    # to 5 s, which made every idle `receive` fail with TimeoutError and live frames wait for the
    # followers' database catch-up (docs/performance.md, issue 19). Still finite, so a dead Redis is seen.
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                "hosts": [
                    {
                        "address": REDIS_URL,
                        "socket_timeout": env.float("REDIS_CHANNEL_SOCKET_TIMEOUT", default=15.0),
                    }
                ],
                # All of a process's followers share one Redis list (its process-local channels): the
                # default of 100 messages dropped frames of a few dozen streaming chats (B3).
                "capacity": env.int("REDIS_CHANNEL_CAPACITY", default=5000),
            },
        }
    }
else:
    CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "default"},
        "canonical": {
            "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
            "LOCATION": "canonical",
            "TIMEOUT": CANONICAL_TTL_SECONDS,
            "OPTIONS": {"MAX_ENTRIES": 100_000},
        },
    }
    # One process: channels' in-memory layer with its per-frame expiry sweep amortised
    # (core/channel_layers.py).
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "core.channel_layers.InMemoryChannelLayer",
            "CONFIG": {"sweep_interval": env.float("CHANNEL_LAYER_SWEEP_SECONDS", default=1.0)},
        }
    }

# ---------------------------------------------------------------------------------------------------
# Model provider (OpenAI-compatible, or the offline `demo` model)
# ---------------------------------------------------------------------------------------------------
LLM_API_KEY = env.str("LLM_API_KEY", default="")
LLM_PROVIDER = env.str("LLM_PROVIDER", default="openai" if LLM_API_KEY else "demo")
LLM_BASE_URL = env.str("LLM_BASE_URL", default="https://api.openai.com/v1")
LLM_MODEL = env.str("LLM_MODEL", default="gpt-4o-mini" if LLM_PROVIDER == "openai" else "demo")
LLM_ROUTER_MODEL = env.str("LLM_ROUTER_MODEL", default=LLM_MODEL)
LLM_GUARD_MODEL = env.str("LLM_GUARD_MODEL", default=LLM_MODEL)
LLM_TIMEOUT_SECONDS = env.float("LLM_TIMEOUT_SECONDS", default=60.0)
LLM_MAX_RETRIES = env.int("LLM_MAX_RETRIES", default=3)
# The SDK's HTTP client: `aiohttp` (its aiohttp transport) or `httpx` (docs/configuration.md; check E005).
LLM_HTTP_CLIENT = env.str("LLM_HTTP_CLIENT", default="aiohttp")

# ---------------------------------------------------------------------------------------------------
# AI Ops: the monitoring servers the `query_metrics` and `list_alerts` tools read (docs/aiops.md).
# Empty = not configured: the tools then fail with "not configured", never with invented data.
# ---------------------------------------------------------------------------------------------------
PROMETHEUS_URL = env.str("PROMETHEUS_URL", default="")
ALERTMANAGER_URL = env.str("ALERTMANAGER_URL", default="")
# Per HTTP request to either server (below TOOL_TIMEOUT, so a slow server is a typed RequestTimeout).
AIOPS_HTTP_TIMEOUT_SECONDS = env.float("AIOPS_HTTP_TIMEOUT_SECONDS", default=10.0)
# A larger response body is refused (ResponseTooLarge) while it is read, never buffered whole.
AIOPS_MAX_RESPONSE_BYTES = env.int("AIOPS_MAX_RESPONSE_BYTES", default=4 * 1024 * 1024)

# ---------------------------------------------------------------------------------------------------
# Agent runtime
# ---------------------------------------------------------------------------------------------------
AGENT_MAX_STEPS = env.int("AGENT_MAX_STEPS", default=6)
TOOL_TIMEOUT = env.float("TOOL_TIMEOUT", default=20.0)

# Secret redaction of what enters a run from outside (agent/redaction.py; docs/security.md, issue 33):
# `enforce` (default) or `off`; kinds never redacted; extra `kind=regex` patterns; the HMAC key of the
# REDACTION_APPLIED facts (required with DEBUG off: check agent.E002; in DEBUG generated once into
# .local/redaction-hmac.key); optional PII masking (off by default) and its kinds.
REDACTION_MODE = env.str("REDACTION_MODE", default="enforce")
REDACTION_ALLOW_KINDS = env.list("REDACTION_ALLOW_KINDS", default=[])
REDACTION_EXTRA_PATTERNS = env.list("REDACTION_EXTRA_PATTERNS", default=[])
REDACTION_HMAC_KEY = env.str("REDACTION_HMAC_KEY", default="")
REDACTION_DEV_KEY_FILE = BASE_DIR / ".local" / "redaction-hmac.key" if DEBUG else None
PII_MASKING = env.bool("PII_MASKING", default=False)
PII_MASKING_KINDS = env.list("PII_MASKING_KINDS", default=["email", "phone", "ipv4", "ipv6"])
CHAT_MAX_ACTIVE_RUNS_PER_USER = env.int("CHAT_MAX_ACTIVE_RUNS_PER_USER", default=3)
# Chats a user may start per period over SSE and WebSocket together (surfaces/chat/throttle.py; empty = off).
CHAT_THROTTLE_RATE = env.str("CHAT_THROTTLE_RATE", default="30/min")
RUN_LEASE_SECONDS = env.int("RUN_LEASE_SECONDS", default=30)
# Runtime thread pools (agent/runtime/db.py): audit/ORM writes, and synchronous tools. Each DB thread
# holds one database connection, so these bound this process's connections however many runs are live.
RUNTIME_DB_THREADS = env.int("RUNTIME_DB_THREADS", default=8)
RUNTIME_TOOL_THREADS = env.int("RUNTIME_TOOL_THREADS", default=8)
# Group commit of concurrent audit writers (audit/write/group_commit.py, docs/performance.md): decisions of
# several runs that wait for a COMMIT at the same time share one transaction.
AUDIT_GROUP_COMMIT = env.bool("AUDIT_GROUP_COMMIT", default=False)
# Batches of the event loop's group commit written at once (agent/runtime/db.py; one connection each).
AUDIT_BATCH_WRITERS = env.int("AUDIT_BATCH_WRITERS", default=1)
# Live chat (docs/chat.md): in-process sweeper period (0 = off) and SSE keep-alive comment period.
RUN_SWEEP_INTERVAL_SECONDS = env.float("RUN_SWEEP_INTERVAL_SECONDS", default=15.0)
CHAT_SSE_HEARTBEAT_SECONDS = env.float("CHAT_SSE_HEARTBEAT_SECONDS", default=15.0)
# What the reader may see before the guards decide (docs/chat.md, "Release policy"): `verified` (default)
# sends no answer text before RELEASE_DECISION, the outcome carries it; `draft` streams unverified drafts
# as `draft` events and records that it did (run.delivery). Anything else stops the server (check).
CHAT_RELEASE = env.str("CHAT_RELEASE", default="verified").strip().lower()
# Under `draft`, text written within this many ms of a run's first held piece goes out as one `draft`
# frame (agent/runtime/live.py; 0 = one frame per piece; 10 ms measured best in B3).
CHAT_DRAFT_COALESCE_MS = env.float("CHAT_DRAFT_COALESCE_MS", default=10.0)

# ---------------------------------------------------------------------------------------------------
# AI Ops analyses (docs/aiops.md)
# ---------------------------------------------------------------------------------------------------
# Bearer token Alertmanager sends to POST /api/aiops/alertmanager (empty: the webhook answers 401).
AIOPS_WEBHOOK_TOKEN = env.str("AIOPS_WEBHOOK_TOKEN", default="")
# The user that owns the sessions of alert groups (created on first use, with no usable password).
AIOPS_SERVICE_USER = env.str("AIOPS_SERVICE_USER", default="alertmanager")
# Queued analyses each server process runs at once (0: none; then `manage.py run_worker`), how often it
# looks for new ones, how long a run may wait for a worker before the sweeper fails it (QUEUE_EXPIRED).
AIOPS_WORKER_CONCURRENCY = env.int("AIOPS_WORKER_CONCURRENCY", default=2)
AIOPS_POLL_INTERVAL_SECONDS = env.float("AIOPS_POLL_INTERVAL_SECONDS", default=2.0)
AIOPS_QUEUE_TIMEOUT_SECONDS = env.int("AIOPS_QUEUE_TIMEOUT_SECONDS", default=3600)
# Approvals (docs/aiops.md): how long a request waits before it expires (treated as rejected), whether a
# run's requester may approve its own request, the longest silence the tool may ask Alertmanager for.
APPROVAL_TIMEOUT_SECONDS = env.int("APPROVAL_TIMEOUT_SECONDS", default=1800)
APPROVAL_ALLOW_SELF = env.bool("APPROVAL_ALLOW_SELF", default=False)
APPROVAL_SILENCE_MAX_SECONDS = env.int("APPROVAL_SILENCE_MAX_SECONDS", default=4 * 3600)

# ---------------------------------------------------------------------------------------------------
# Reasoning governance
# ---------------------------------------------------------------------------------------------------
REASONING_ENCRYPTION_KEYS = env.list("REASONING_ENCRYPTION_KEYS", default=[])
REASONING_RETENTION_DAYS = env.int("REASONING_RETENTION_DAYS", default=30)
# Development only: without REASONING_ENCRYPTION_KEYS a key is generated once into this file and reused
# (see reasoning/crypto.py). With DEBUG off there is no fallback: the check reasoning.E001 stops the server.
REASONING_DEV_KEY_FILE = BASE_DIR / ".local" / "reasoning-encryption.key" if DEBUG else None
# Reads of reasoning per user (DRF scoped throttle "reasoning").
REASONING_THROTTLE_RATE = env.str("REASONING_THROTTLE_RATE", default="60/min")
# How many reverse proxies in front of the app append to X-Forwarded-For. 0 (default): the client
# address in the reasoning access log is REMOTE_ADDR and X-Forwarded-For is ignored (it can be forged).
TRUSTED_PROXY_COUNT = env.int("TRUSTED_PROXY_COUNT", default=0)
# The peers whose forwarded headers (X-Forwarded-For, X-Forwarded-Proto, ...) are honoured at all, as
# CIDRs or addresses (core/proxy.py): from any other peer they are removed before anything reads them,
# so a client that reaches a daphne port directly is recorded as itself and cannot claim HTTPS. The
# default is the loopback, where the documented nginx runs (deploy/, docs/deployment.md).
TRUSTED_PROXIES = env.list("TRUSTED_PROXIES", default=["127.0.0.1/32", "::1/128"])

# ---------------------------------------------------------------------------------------------------
# Access governance (access/, docs/security.md)
# ---------------------------------------------------------------------------------------------------
# API tokens (access.models.ApiToken): lifetime of a newly issued token, in hours.
API_TOKEN_TTL_HOURS = env.int("API_TOKEN_TTL_HOURS", default=24 * 30)
# Reading reasoning content also needs a verified TOTP second factor (session or OTP-issued token).
REASONING_REQUIRE_OTP = env.bool("REASONING_REQUIRE_OTP", default=not DEBUG)
# Permissions whose holders the governance log and the access review follow (besides superusers).
SENSITIVE_PERMISSIONS = env.list(
    "SENSITIVE_PERMISSIONS",
    default=[
        "reasoning.view_reasoning_content",
        "audit.place_legal_hold",
        "diagnosis.approve_tool_call",
        "audit.review_run",
    ],
)
# The review queue (audit.write.reviews): how long a reviewer's claim on a queued run keeps others off it.
REVIEW_CLAIM_MINUTES = env.float("REVIEW_CLAIM_MINUTES", default=30.0)
# Groups whose membership the governance log always records, whether or not they hold a sensitive
# permission (yet) or exist (yet); any other group is followed the moment it holds a sensitive permission.
GOVERNED_GROUPS = env.list("GOVERNED_GROUPS", default=list(GOVERNED))
# django-axes: failed logins and failed token authentications, each counted against the one who guessed
# (access.lockout, docs/security.md): per (username, client address) for attempts that name a user, per
# address for anonymous ones (unknown API tokens), and per address in their own counters for wrong
# webhook and /metrics tokens. A locked counter refuses only its own attempts, uncounted.
AXES_ENABLED = env.bool("AXES_ENABLED", default=True)
LOCKOUT_FAILURE_LIMIT = env.int("AXES_FAILURE_LIMIT", default=5)
LOCKOUT_ANONYMOUS_FAILURE_LIMIT = env.int("AXES_ANONYMOUS_FAILURE_LIMIT", default=20)
AXES_FAILURE_LIMIT = "access.lockout.failure_limit"
AXES_COOLOFF_TIME = dt.timedelta(minutes=env.float("AXES_COOLOFF_MINUTES", default=15.0))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_LOCKOUT_CALLABLE = "access.lockout.lockout_response"
# An OpenID Connect callback is not a guess of a secret held here: neither counted nor refused by axes.
AXES_WHITELIST_CALLABLE = "access.lockout.not_counted"
AXES_CLIENT_IP_CALLABLE = "access.lockout.client_ip"
AXES_RESET_ON_SUCCESS = False
AXES_VERBOSE = False
# A username is not a secret but POST bodies may hold passwords: axes stores neither GET nor POST data.
AXES_SENSITIVE_PARAMETERS = ["password", "otp_token", "token"]

# Single sign-on over OpenID Connect (access/oidc.py, docs/security.md): off by default, and with it off
# nothing changes. The provider's endpoints are named here (no discovery at start); ID tokens are RS256
# (or ES256) from its JWKS, checked for issuer, audience, expiry and nonce. OIDC_GROUP_MAP (JSON) maps the
# IdP's group names to governed groups, re-applied on every login; OIDC_ACCEPTED_AMR / _ACR: the second
# factors the IdP may assert instead of the TOTP step-up.
OIDC_ENABLED = env.bool("OIDC_ENABLED", default=False)
OIDC_PROVIDER_NAME = env.str("OIDC_PROVIDER_NAME", default="single sign-on")
OIDC_RP_CLIENT_ID = env.str("OIDC_RP_CLIENT_ID", default="")
OIDC_RP_CLIENT_SECRET = env.str("OIDC_RP_CLIENT_SECRET", default="")
OIDC_OP_ISSUER = env.str("OIDC_OP_ISSUER", default="")
OIDC_OP_AUTHORIZATION_ENDPOINT = env.str("OIDC_OP_AUTHORIZATION_ENDPOINT", default="")
OIDC_OP_TOKEN_ENDPOINT = env.str("OIDC_OP_TOKEN_ENDPOINT", default="")
OIDC_OP_USER_ENDPOINT = env.str("OIDC_OP_USER_ENDPOINT", default="")
OIDC_OP_JWKS_ENDPOINT = env.str("OIDC_OP_JWKS_ENDPOINT", default="")
OIDC_RP_SIGN_ALGO = env.str("OIDC_RP_SIGN_ALGO", default="RS256")
OIDC_RP_SCOPES = env.str("OIDC_RP_SCOPES", default="openid email profile")
OIDC_USE_PKCE = env.bool("OIDC_USE_PKCE", default=True)
OIDC_TIMEOUT = env.float("OIDC_TIMEOUT", default=10.0)
OIDC_CLOCK_SKEW_SECONDS = env.int("OIDC_CLOCK_SKEW_SECONDS", default=60)
OIDC_USERNAME_CLAIM = env.str("OIDC_USERNAME_CLAIM", default="preferred_username")
OIDC_LINK_EXISTING_USERS = env.bool("OIDC_LINK_EXISTING_USERS", default=False)
OIDC_GROUPS_CLAIM = env.str("OIDC_GROUPS_CLAIM", default="groups")
OIDC_GROUP_MAP = env.json("OIDC_GROUP_MAP", default={})
OIDC_ACCEPTED_AMR = env.list("OIDC_ACCEPTED_AMR", default=[])
OIDC_ACCEPTED_ACR = env.list("OIDC_ACCEPTED_ACR", default=[])
OIDC_CALLBACK_CLASS = "surfaces.oidc_views.CallbackView"
OIDC_AUTHENTICATE_CLASS = "surfaces.oidc_views.AuthenticateView"
LOGIN_REDIRECT_URL = "front-door"
LOGIN_REDIRECT_URL_FAILURE = "/admin/login/"
# `all` (default): every user may sign in with a local password. `breakglass`: only the superusers named
# in BREAK_GLASS_USERNAMES may (everyone else signs in through the IdP; access/passwords.py).
LOCAL_PASSWORD_LOGIN = env.str("LOCAL_PASSWORD_LOGIN", default="all").strip().lower()
BREAK_GLASS_USERNAMES = env.list("BREAK_GLASS_USERNAMES", default=[])

# ---------------------------------------------------------------------------------------------------
# Transparency log (audit/transparency/, docs/audit-integrity.md)
# ---------------------------------------------------------------------------------------------------
# Ed25519 signing keys of checkpoints, newest first (base64 of 32-byte seeds); never in the database.
AUDIT_SIGNING_KEYS = env.list("AUDIT_SIGNING_KEYS", default=[])
# Public keys (base64 of 32 raw bytes) of retired signing keys, so that their checkpoints still verify.
AUDIT_VERIFY_KEYS = env.list("AUDIT_VERIFY_KEYS", default=[])
# Development only, like the reasoning key: generated once and reused; with DEBUG off audit.E001 stops.
AUDIT_DEV_SIGNING_KEY_FILE = BASE_DIR / ".local" / "audit-signing.key" if DEBUG else None
# The log's name in every checkpoint (origin line, key name): set it once, before configuring witnesses, to a
# schema-less URL naming this deployment (e.g. audit.example.com/diagnosis); changing it starts a new log.
AUDIT_LOG_ORIGIN = env.str("AUDIT_LOG_ORIGIN", default="diagnosis-audit")
# How often each server process appends finished runs and signs a checkpoint (0 = off); every Nth time (and
# at start) it searches every run, not only those created since its cursor (audit/transparency/log.py).
AUDIT_CHECKPOINT_INTERVAL_SECONDS = env.float("AUDIT_CHECKPOINT_INTERVAL_SECONDS", default=60.0)
AUDIT_CHECKPOINT_FULL_SCAN_EVERY = env.int("AUDIT_CHECKPOINT_FULL_SCAN_EVERY", default=10)
# A finished run not anchored this long after its chained finish is a problem (verify_audit, /metrics).
AUDIT_ANCHOR_DEADLINE_SECONDS = env.float(
    "AUDIT_ANCHOR_DEADLINE_SECONDS", default=2 * (AUDIT_CHECKPOINT_INTERVAL_SECONDS or 60.0)
)
# How far apart the clocks of the processes writing the record may be (verify_audit's time checks).
AUDIT_CLOCK_TOLERANCE_SECONDS = env.float("AUDIT_CLOCK_TOLERANCE_SECONDS", default=5.0)
# HMAC keys tagging every chain link the service writes (core/writeauth.py), newest first, base64 of 32
# bytes; not the signing keys, never in the database. In DEBUG, one is generated into .local/.
AUDIT_WRITE_KEYS = env.list("AUDIT_WRITE_KEYS", default=[])
AUDIT_DEV_WRITE_KEY_FILE = BASE_DIR / ".local" / "audit-write.key" if DEBUG else None
# Optional file every signed checkpoint is appended to (one JSON line each), for write-once storage.
AUDIT_WITNESS_PATH = env.str("AUDIT_WITNESS_PATH", default="")
# C2SP tlog-witness witnesses cosigning each checkpoint: "<submission URL> <cosigner vkey>", comma-separated.
AUDIT_WITNESSES = env.list("AUDIT_WITNESSES", default=[])
AUDIT_WITNESS_TIMEOUT_SECONDS = env.float("AUDIT_WITNESS_TIMEOUT_SECONDS", default=5.0)
# The witness policy verify_audit holds the log to: cosigner vkeys, and how many of them must have cosigned
# the checkpoint covering a run (0 = all). Empty: no policy (cosignatures are still verified when known).
AUDIT_WITNESS_POLICY = env.list("AUDIT_WITNESS_POLICY", default=[])
AUDIT_WITNESS_QUORUM = env.int("AUDIT_WITNESS_QUORUM", default=0)
# Trace records are kept this many days (EU AI Act Art. 19, 26(6): six months at least), then purged.
AUDIT_RETENTION_DAYS = env.int("AUDIT_RETENTION_DAYS", default=183)
# How often each server process runs that purge (0 = off; the log's lock makes processes take turns).
AUDIT_PURGE_INTERVAL_SECONDS = env.float("AUDIT_PURGE_INTERVAL_SECONDS", default=3600.0)

# ---------------------------------------------------------------------------------------------------
# Telemetry (docs/observability.md): finished runs as OpenTelemetry GenAI traces, and /metrics
# ---------------------------------------------------------------------------------------------------
# The standard OTLP variables: the traces endpoint, or the base endpoint + /v1/traces (unset: no export);
# the exporter reads OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, … and OTEL_SERVICE_NAME itself.
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT = env.str("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", default="") or (
    env.str("OTEL_EXPORTER_OTLP_ENDPOINT", default="").rstrip("/") + "/v1/traces"
    if env.str("OTEL_EXPORTER_OTLP_ENDPOINT", default="")
    else ""
)
# How often each server process enqueues finished runs and exports due ones (0 = off).
OTEL_EXPORT_INTERVAL_SECONDS = env.float("OTEL_EXPORT_INTERVAL_SECONDS", default=10.0)
# Runs exported per pass, and the longest back-off between attempts of a failed export.
OTEL_EXPORT_BATCH = env.int("OTEL_EXPORT_BATCH", default=50)
OTEL_EXPORT_MAX_BACKOFF_SECONDS = env.float("OTEL_EXPORT_MAX_BACKOFF_SECONDS", default=300.0)
# Opt-in (the GenAI conventions' variable): tool arguments and results as bounded previews.
OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT = env.bool(
    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", default=False
)
# Bearer token a scraper sends to GET /metrics. Empty: anonymous scrapes only with DEBUG on, or with
# METRICS_ALLOW_ANONYMOUS (bound to an internal address only; docs/observability.md).
METRICS_TOKEN = env.str("METRICS_TOKEN", default="")
METRICS_ALLOW_ANONYMOUS = env.bool("METRICS_ALLOW_ANONYMOUS", default=DEBUG)
# Seconds the database aggregates behind /metrics are reused between scrapes.
METRICS_CACHE_SECONDS = env.float("METRICS_CACHE_SECONDS", default=5.0)
# The record metrics cover the runs, steps and tool calls created in this window (telemetry/metrics.py).
METRICS_WINDOW_SECONDS = env.int("METRICS_WINDOW_SECONDS", default=3600)

# Online evaluators (evaluations/): the worker scores runs finished in the last EVALUATION_LOOKBACK_HOURS;
# a claim on a (run, evaluator) is taken over after EVALUATION_CLAIM_SECONDS (a worker died mid-judge).
EVALUATION_LOOKBACK_HOURS = env.float("EVALUATION_LOOKBACK_HOURS", default=24.0)
EVALUATION_CLAIM_SECONDS = env.float("EVALUATION_CLAIM_SECONDS", default=300.0)
# Tries of a failing LLM-judge call (a pass after each stale claim) before a `judge_error` score.
EVALUATION_JUDGE_ATTEMPTS = env.int("EVALUATION_JUDGE_ATTEMPTS", default=3)

# ---------------------------------------------------------------------------------------------------
# REST framework: authenticated by default, errors in the contract's shape
# ---------------------------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        "surfaces.api.authentication.ApiTokenAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    # DRF's three parsers, refusing an unknown charset with 415 rather than guessing (core/parsers.py).
    "DEFAULT_PARSER_CLASSES": [
        "core.parsers.JSONParser",
        "core.parsers.FormParser",
        "core.parsers.MultiPartParser",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    "EXCEPTION_HANDLER": "core.api.exception_handler",
    "DEFAULT_THROTTLE_RATES": {"reasoning": REASONING_THROTTLE_RATE},
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Diagnosis agent audit API",
    "DESCRIPTION": "Runs, decision traces and governed reasoning of the diagnosis agent.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # The chat endpoints are async Django views (SSE); their paths are added by a hook (docs/chat.md).
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "surfaces.chat.schema.add_chat_paths",
        # Every token-authenticated operation can answer 429 `locked_out` (access/lockout.py).
        "surfaces.api.auth_schema.add_locked_out",
    ],
    "ENUM_NAME_OVERRIDES": {
        "RunStatusEnum": "diagnosis.models.RunStatus.values",
        "ToolStatusEnum": "audit.models.ToolStatus.values",
        "AlertStatusEnum": "surfaces.api.aiops.ALERT_STATUSES",
        "CostStatusEnum": "surfaces.api.audit_serializers.COST_STATUSES",
        "CallCostStatusEnum": "surfaces.api.audit_serializers.CALL_COST_STATUSES",
    },
}

# ---------------------------------------------------------------------------------------------------
# Security (production hardening whenever DEBUG is off)
# ---------------------------------------------------------------------------------------------------
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
if not DEBUG:
    # Behind a TLS-terminating proxy that sets X-Forwarded-Proto (see docs/deployment.md).
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=True)
    # Never redirected to https://: the readiness probe (no data) and the metrics (bearer token or
    # METRICS_ALLOW_ANONYMOUS), which a process manager or Prometheus may ask a daphne port directly for,
    # where there is no TLS (docs/deployment.md, "Metrics and readiness"). A redirect there would loop.
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]
    SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True

# A WebSocket handshake that did not arrive over TLS (at daphne or, per a trusted proxy's
# X-Forwarded-Proto, at the proxy) is closed with code 4426 (core/proxy.py); on whenever DEBUG is off.
WEBSOCKET_REQUIRE_TLS = env.bool("WEBSOCKET_REQUIRE_TLS", default=not DEBUG)

# ---------------------------------------------------------------------------------------------------
# Logging: structured enough to grep, never content (see audit.write for what a line may hold)
# ---------------------------------------------------------------------------------------------------
LOG_LEVEL = env.str("LOG_LEVEL", default="INFO")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        # The ASGI server's access log would print query strings; tokens never travel there (see README).
        "django.db.backends": {"level": "INFO"},
        # Pinned above DEBUG whatever LOG_LEVEL says (docs/deployment.md): SQL parameters carry tokens,
        # questions and answers, and provider SDKs have logged request bodies (messages, reasoning sent
        # back within a turn) at DEBUG. Asserted in tests/core/test_settings.py.
        "openai": {"level": "INFO"},
        "httpx": {"level": "INFO"},
        "httpx2": {"level": "INFO"},
        "httpcore": {"level": "INFO"},
        "aiohttp": {"level": "INFO"},  # the SDK's transport (LLM_HTTP_CLIENT=aiohttp)
    },
}
