"""Settings for the diagnosis service, in sections, every machine-specific value from the environment.

Every environment variable is declared once, in `core/settings_spec.py` (its parsing, default, section and
meaning; docs/configuration.md's table is generated from it). `read` parses them all here, and each becomes
the Django setting of its name, so code reads `settings.NAME` and never restates a default; this module
adds what is not read from the environment and composes the settings built from several variables
(DATABASES, CACHES, CHANNEL_LAYERS, ...). Development defaults (DEBUG on, embedded SQLite, demo model,
in-memory channel layer and canonical store) let a fresh clone run with no configuration; production
hardening switches on whenever DEBUG is off.
"""

import os

from core.env import BASE_DIR, env
from core.settings_spec import django_settings, read

# ---------------------------------------------------------------------------------------------------
# Core: every variable of core/settings_spec.py (SECRET_KEY is required with DEBUG off: environ raises)
# ---------------------------------------------------------------------------------------------------
_values = read(env)
globals().update(django_settings(_values))
_debug = _values["DEBUG"]

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

# STATIC_ROOT (the spec) is where `collectstatic` puts what the proxy serves (deploy/nginx/diagnosis.conf).
STATIC_URL = "static/"

LOGIN_URL = "admin:login"

# ---------------------------------------------------------------------------------------------------
# Database: embedded SQLite by default, mysql://… for MariaDB/MySQL (utf8mb4, strict mode)
# ---------------------------------------------------------------------------------------------------
DATABASES = {"default": _values["DATABASE_URL"]}


def mysql_options(*, wsrep_sync_wait: int = 0) -> dict:
    """The MariaDB/MySQL connection options; `wsrep_sync_wait` (Galera: DATABASE_WSREP_SYNC_WAIT) is set
    on each connection when not 0 (docs/reliability.md, *A Galera cluster behind HAProxy*)."""
    init = (
        "SET sql_mode='STRICT_TRANS_TABLES,STRICT_ALL_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,"
        "ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION', "
        "collation_connection='utf8mb4_unicode_ci'"
    )
    if wsrep_sync_wait:
        init += f", wsrep_sync_wait={int(wsrep_sync_wait)}"
    return {"charset": "utf8mb4", "init_command": init, "isolation_level": "read committed"}


MYSQL_OPTIONS = mysql_options(wsrep_sync_wait=_values["DATABASE_WSREP_SYNC_WAIT"])
_db = DATABASES["default"]
if _db["ENGINE"] == "django.db.backends.mysql":
    from core.mysql_conversions import conversions

    # Date-times parsed in C, the driver's result for every value (core/mysql_conversions.py).
    MYSQL_OPTIONS["conv"] = conversions()
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
_db.setdefault("CONN_MAX_AGE", _values["DB_CONN_MAX_AGE"])
_db["CONN_HEALTH_CHECKS"] = True

# A read replica (docs/reliability.md, *Reads on a replica*): read-only surfaces read it through
# `core.db_router` while it is up and within the lag limit; everything else, and every write, uses the
# primary. In tests it mirrors the primary (the replica tests build their own pair: tests/core/replica/).
if _values["DATABASE_REPLICA_URL"]:
    _replica = env.db_url_config(_values["DATABASE_REPLICA_URL"])
    if _replica["ENGINE"] == "django.db.backends.mysql":
        from core.mysql_conversions import conversions

        _replica.setdefault("OPTIONS", {}).update({**MYSQL_OPTIONS, "conv": conversions()})
        # A replica that is down is refused at once; one that hangs holds a read at most this long to connect.
        _replica["OPTIONS"].setdefault("connect_timeout", int(_values["DATABASE_REPLICA_CONNECT_TIMEOUT"]))
    _replica["CONN_MAX_AGE"] = _db["CONN_MAX_AGE"]
    _replica["CONN_HEALTH_CHECKS"] = True
    _replica["TEST"] = {"MIRROR": "default"}
    DATABASES["replica"] = _replica
DATABASE_ROUTERS = ["core.db_router.ReplicaRouter"]

# ---------------------------------------------------------------------------------------------------
# Redis: channel layer and the canonical store (in-memory without REDIS_URL)
# ---------------------------------------------------------------------------------------------------
_redis = _values["REDIS_URL"]
if _redis:
    CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": _redis},
        "canonical": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": _redis,
            "KEY_PREFIX": "canonical",
            "TIMEOUT": _values["CANONICAL_TTL_SECONDS"],
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
                        "address": _redis,
                        "socket_timeout": _values["REDIS_CHANNEL_SOCKET_TIMEOUT"],
                    }
                ],
                # All of a process's followers share one Redis list (its process-local channels): the
                # default of 100 messages dropped frames of a few dozen streaming chats (B3).
                "capacity": _values["REDIS_CHANNEL_CAPACITY"],
            },
        }
    }
else:
    CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "default"},
        "canonical": {
            "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
            "LOCATION": "canonical",
            "TIMEOUT": _values["CANONICAL_TTL_SECONDS"],
            "OPTIONS": {"MAX_ENTRIES": 100_000},
        },
    }
    # One process: channels' in-memory layer with its per-frame expiry sweep amortised
    # (core/channel_layers.py).
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "core.channel_layers.InMemoryChannelLayer",
            "CONFIG": {"sweep_interval": _values["CHANNEL_LAYER_SWEEP_SECONDS"]},
        }
    }

# ---------------------------------------------------------------------------------------------------
# Development keys: without its variable, DEBUG generates a key once into this file and reuses it
# (core/devkeys.py); with DEBUG off there is no fallback, and a check stops the server (diagnosis.E004,
# reasoning.E001, audit.E001, audit.E005).
# ---------------------------------------------------------------------------------------------------
REDACTION_DEV_KEY_FILE = BASE_DIR / ".local" / "redaction-hmac.key" if _debug else None
REASONING_DEV_KEY_FILE = BASE_DIR / ".local" / "reasoning-encryption.key" if _debug else None
AUDIT_DEV_SIGNING_KEY_FILE = BASE_DIR / ".local" / "audit-signing.key" if _debug else None
AUDIT_DEV_WRITE_KEY_FILE = BASE_DIR / ".local" / "audit-write.key" if _debug else None

# ---------------------------------------------------------------------------------------------------
# Access governance (access/, docs/security.md)
# ---------------------------------------------------------------------------------------------------
# django-axes: failed logins and failed token authentications, each counted against the one who guessed
# (access.lockout, docs/security.md): per (username, client address) for attempts that name a user, per
# address for anonymous ones (unknown API tokens), and per address in their own counters for wrong
# webhook and /metrics tokens. A locked counter refuses only its own attempts, uncounted. The limits are
# LOCKOUT_FAILURE_LIMIT and LOCKOUT_ANONYMOUS_FAILURE_LIMIT (AXES_FAILURE_LIMIT, ..._ANONYMOUS_... in the
# environment), the lockout's length AXES_COOLOFF_TIME (AXES_COOLOFF_MINUTES).
AXES_FAILURE_LIMIT = "access.lockout.failure_limit"
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

# Single sign-on over OpenID Connect (access/oidc.py, docs/security.md): the OIDC_* variables of the spec;
# mozilla-django-oidc's views are ours, and a login lands on the front door.
OIDC_CALLBACK_CLASS = "surfaces.oidc_views.CallbackView"
OIDC_AUTHENTICATE_CLASS = "surfaces.oidc_views.AuthenticateView"
LOGIN_REDIRECT_URL = "front-door"
LOGIN_REDIRECT_URL_FAILURE = "/admin/login/"

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
    "DEFAULT_THROTTLE_RATES": {"reasoning": _values["REASONING_THROTTLE_RATE"]},
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
if not _debug:
    # SECURE_SSL_REDIRECT and SECURE_HSTS_SECONDS come from the spec, read only here (DEBUG off).
    # Behind a TLS-terminating proxy that sets X-Forwarded-Proto (see docs/deployment.md).
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    # Never redirected to https://: the readiness probe (no data) and the metrics (bearer token or
    # METRICS_ALLOW_ANONYMOUS), which a process manager or Prometheus may ask a daphne port directly for,
    # where there is no TLS (docs/deployment.md, "Metrics and readiness"). A redirect there would loop.
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True

# ---------------------------------------------------------------------------------------------------
# Logging: structured enough to grep, never content (see audit.write for what a line may hold)
# ---------------------------------------------------------------------------------------------------
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": _values["LOG_LEVEL"]},
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
        # The MCP SDK logs a remote server's session id at INFO (a handle of a live session) and
        # messages at DEBUG: only its warnings reach our logs (the hub logs what happened, redacted).
        "mcp": {"level": "WARNING"},
    },
}
