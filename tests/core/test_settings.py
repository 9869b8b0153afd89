"""Security settings: production hardening, the Content-Security-Policy, secrets only from the
environment, and logs without reasoning, answers or tokens.

* `manage.py check --deploy --fail-level WARNING` is clean in a production process (DEBUG off, a strong
  SECRET_KEY, ALLOWED_HOSTS, reasoning keys), and fails with a weak key (the check can fail);
* in that production process, the settings and real responses show HSTS, secure and HttpOnly cookies,
  the HTTPS redirect behind a proxy (`SECURE_PROXY_SSL_HEADER`), CSRF enforcement and the CSP header;
* the CSP header of this process: strict everywhere, inline styles only where the admin's waterfall and
  Swagger UI need them, WebSocket sources of the request's own host, a view's own policy left alone;
* no key-like literal in the repository, and every secret setting read from the environment;
* a full run through the provider (reasoning sent back within the turn, DeepSeek style) and API reads
  with a token, logged at DEBUG on every logger in development mode: no reasoning, no answer text, no
  token in any log line; the production logging config never logs SQL (whose parameters carry tokens,
  questions and answers) nor the provider SDK's request bodies, whatever LOG_LEVEL says.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import secrets
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from django.conf import settings as django_settings
from django.http import HttpResponse
from django.test import RequestFactory

from agent.runtime import db as runtime_db
from audit.transparency.keys import generate_key_text
from core.csp import HEADER, ContentSecurityPolicyMiddleware, build_policy
from core.settings_spec import SETTINGS
from tests.agent.runtime.support import AGENT, ask, evidence_ids, load_corpus
from tests.factories import issue_token, make_recorded_run
from tests.fakes.openai_server import stream_answer, stream_tool_calls, usage
from tests.local_dirs import is_local
from tests.surfaces.admin.support import grant_console

BASE_DIR = Path(django_settings.BASE_DIR)
PRODUCTION_HOST = "diagnosis.example.com"


def _production_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO_", "PYTEST", "LLM_", "REASONING_", "AUDIT_"))
        and k not in ("DATABASE_URL", "REDIS_URL")
    }
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DEBUG": "false",
            "SECRET_KEY": secrets.token_urlsafe(50),
            "ALLOWED_HOSTS": f"{PRODUCTION_HOST},testserver",
            "REASONING_ENCRYPTION_KEYS": Fernet.generate_key().decode(),
            "AUDIT_SIGNING_KEYS": generate_key_text(),
            "AUDIT_WRITE_KEYS": generate_key_text(),
            "REDACTION_HMAC_KEY": secrets.token_hex(32),
            "DATABASE_URL": "sqlite:///:memory:",
            "LOG_LEVEL": "DEBUG",
        }
    )
    env.update(extra)
    return env


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# --------------------------------------------------------------------------------------------------
# Production settings
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("secret_key", "clean"),
    [(None, True), ("django-insecure-short", False)],
    ids=["strong-key", "weak-key"],
)
def test_check_deploy_is_clean_with_production_settings(secret_key, clean):
    env = _production_env(**({"SECRET_KEY": secret_key} if secret_key else {}))
    done = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if clean:
        assert done.returncode == 0, done.stdout + done.stderr
        assert "System check identified no issues" in done.stdout
    else:
        assert done.returncode != 0 and "security.W009" in done.stdout + done.stderr


PRODUCTION_PROBE = """
import json, logging
import django
django.setup()
from django.conf import settings
from django.core.management import call_command
from django.db import connection
from django.test import Client
call_command("migrate", verbosity=0)
out = {
    "debug": settings.DEBUG,
    "hsts": settings.SECURE_HSTS_SECONDS,
    "hsts_sub": settings.SECURE_HSTS_INCLUDE_SUBDOMAINS,
    "ssl_redirect": settings.SECURE_SSL_REDIRECT,
    "proxy_header": list(settings.SECURE_PROXY_SSL_HEADER or []),
    "session_secure": settings.SESSION_COOKIE_SECURE,
    "session_httponly": settings.SESSION_COOKIE_HTTPONLY,
    "csrf_secure": settings.CSRF_COOKIE_SECURE,
    "csrf_middleware": "django.middleware.csrf.CsrfViewMiddleware" in settings.MIDDLEWARE,
    "sql_logged": connection.queries_logged,
    "levels": {name: logging.getLogger(name).getEffectiveLevel()
               for name in ("", "django.db.backends", "openai", "httpx", "httpx2", "httpcore", "aiohttp",
                            "mcp")},
}
c = Client(HTTP_HOST="%(host)s")
plain = c.get("/admin/login/")
out["http_status"], out["http_location"] = plain.status_code, plain.get("Location")
secure = c.get("/admin/login/", HTTP_X_FORWARDED_PROTO="https")
out["https_status"] = secure.status_code
out["hsts_header"] = secure.get("Strict-Transport-Security")
out["csp"] = secure.get("Content-Security-Policy")
cookie = secure.cookies["csrftoken"]
out["csrf_cookie_secure"] = bool(cookie["secure"])
strict = Client(HTTP_HOST="%(host)s", enforce_csrf_checks=True)
login = strict.post("/admin/login/", {"username": "x", "password": "y"}, HTTP_X_FORWARDED_PROTO="https")
out["login_without_csrf"] = login.status_code
print("PROBE " + json.dumps(out))
"""


def test_production_process_has_hsts_secure_cookies_https_redirect_csrf_and_csp():
    done = _python(PRODUCTION_PROBE % {"host": PRODUCTION_HOST}, _production_env())
    line = next((x for x in done.stdout.splitlines() if x.startswith("PROBE ")), None)
    assert line, done.stdout[-2000:] + done.stderr[-3000:]
    probe = json.loads(line[len("PROBE ") :])
    assert probe["debug"] is False
    assert probe["hsts"] >= 31536000 and probe["hsts_sub"] is True
    assert probe["ssl_redirect"] is True and probe["proxy_header"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert probe["session_secure"] and probe["session_httponly"] and probe["csrf_secure"]
    assert probe["csrf_middleware"]
    # Plain HTTP is redirected to HTTPS; behind the TLS proxy the page is served with HSTS and CSP.
    assert probe["http_status"] == 301 and probe["http_location"] == f"https://{PRODUCTION_HOST}/admin/login/"
    assert probe["https_status"] == 200
    assert probe["hsts_header"].startswith("max-age=31536000") and "includeSubDomains" in probe["hsts_header"]
    assert "script-src 'self';" in probe["csp"] and f"wss://{PRODUCTION_HOST}" in probe["csp"]
    assert probe["csrf_cookie_secure"] is True
    assert probe["login_without_csrf"] == 403
    # Logging: no SQL at all in production, and the noisy libraries stay above DEBUG whatever LOG_LEVEL.
    assert probe["sql_logged"] is False
    assert probe["levels"][""] == logging.DEBUG  # LOG_LEVEL=DEBUG was honoured for the application
    for name in ("django.db.backends", "openai", "httpx", "httpx2", "httpcore", "aiohttp"):
        assert probe["levels"][name] > logging.DEBUG, name
    assert probe["levels"]["mcp"] == logging.WARNING  # not a remote session's id at INFO


# --------------------------------------------------------------------------------------------------
# Content-Security-Policy
# --------------------------------------------------------------------------------------------------
def _directives(policy: str) -> dict[str, list[str]]:
    return {part.split()[0]: part.split()[1:] for part in policy.split("; ")}


@pytest.mark.django_db
def test_every_page_carries_the_policy_and_only_admin_and_docs_allow_inline_style(client, staff_user):
    grant_console(staff_user)
    run = make_recorded_run(staff_user)
    client.force_login(staff_user)
    pages = {
        "/chat/": False,
        "/admin/": True,
        f"/admin/diagnosis/diagnosisrun/{run.pk}/change/": True,
        "/api/docs/": True,
        "/api/diagnosis/sessions/": False,
    }
    for path, inline_style in pages.items():
        response = client.get(path)
        assert response.status_code == 200, path
        d = _directives(response[HEADER])
        assert d["default-src"] == ["'self'"] and d["script-src"] == ["'self'"], path
        assert d["style-src"] == (["'self'", "'unsafe-inline'"] if inline_style else ["'self'"]), path
        assert d["img-src"] == ["'self'", "data:"] and d["object-src"] == ["'none'"], path
        assert d["frame-ancestors"] == ["'none'"] and d["base-uri"] == ["'self'"], path
        assert d["form-action"] == ["'self'"], path
        assert d["connect-src"] == ["'self'", "ws://testserver", "wss://testserver"], path
    # Swagger UI needs no inline script: its init script is a separate, same-origin request.
    docs = client.get("/api/docs/").content.decode()
    assert not re.search(r"<script>(?!\s*</script>)", docs) and "?script=" in docs
    init = client.get("/api/docs/?script=")
    assert init.status_code == 200 and init["Content-Type"].startswith("application/javascript")


def test_a_views_own_policy_is_kept_and_a_bad_host_gets_no_websocket_source(settings):
    settings.ALLOWED_HOSTS = ["good.example"]
    own = ContentSecurityPolicyMiddleware(lambda request: HttpResponse(headers={HEADER: "sandbox"}))
    assert own(RequestFactory().get("/chat/", HTTP_HOST="good.example"))[HEADER] == "sandbox"
    plain = ContentSecurityPolicyMiddleware(lambda request: HttpResponse())
    policy = plain(RequestFactory().get("/chat/", HTTP_HOST="evil.example"))[HEADER]
    assert policy == build_policy(host=None, inline_style=False) and "evil" not in policy


def test_the_websocket_sources_keep_a_non_standard_port(settings):
    # The shipped nginx passes `Host: host:port` (deploy/nginx/diagnosis.conf): a page served on :8443
    # may open wss://host:8443, which `wss://host` alone would not allow.
    settings.ALLOWED_HOSTS = ["good.example"]
    plain = ContentSecurityPolicyMiddleware(lambda request: HttpResponse())
    policy = plain(RequestFactory().get("/chat/", HTTP_HOST="good.example:8443"))[HEADER]
    assert "connect-src 'self' ws://good.example:8443 wss://good.example:8443;" in policy


# --------------------------------------------------------------------------------------------------
# Secrets only from the environment
# --------------------------------------------------------------------------------------------------
KEY_PATTERNS = {
    "OpenAI-style key": re.compile(r"\bsk-[A-Za-z0-9_-]{20,}"),
    "Fernet key": re.compile(r"(?<![A-Za-z0-9_-])[A-Za-z0-9_-]{43}=(?![A-Za-z0-9=])"),
    "AWS access key": re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
    "private key": re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    "Django secret key": re.compile(r"SECRET_KEY\s*[=:]\s*[\"'](?!django-insecure-)[^\"']{16,}[\"']"),
    # Placeholders such as `user:pass@host` in the docs are fine; a real-looking password is not.
    "password in a URL": re.compile(
        r"\b(?:mysql|redis|postgres(?:ql)?)://[^:/@\s{]+:(?!pass@|password@|PASSWORD@|\$)[^@\s/{<]{3,}@"
    ),
    "token literal": re.compile(r"(?i)\b(?:api[_-]?key|token|secret)\s*=\s*[\"'][0-9a-f]{32,}[\"']"),
}
TEXT_SUFFIXES = {".py", ".md", ".txt", ".toml", ".cfg", ".ini", ".yml", ".yaml", ".json", ".sh", ".html"}
TEXT_SUFFIXES |= {".js", ".css", ".env", ""}


def _repository_files():
    for path in BASE_DIR.rglob("*"):
        if any(is_local(part) for part in path.relative_to(BASE_DIR).parts):
            continue
        if path.is_file() and (path.suffix in TEXT_SUFFIXES or path.name in ("Makefile", "run")):
            yield path


def test_no_key_like_literal_is_committed_and_secrets_come_from_the_environment():
    found = []
    for path in _repository_files():
        if path.name == ".env":
            found.append(f"{path}: a .env file must not be committed")
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for label, pattern in KEY_PATTERNS.items():
            for match in pattern.finditer(text):
                found.append(f"{path.relative_to(BASE_DIR)}: {label}: {match.group(0)[:12]}…")
    assert not found, "\n".join(found)
    ignored = (BASE_DIR / ".gitignore").read_text()
    assert ".env" in ignored and ".local" in ignored
    # Read from the environment by the declaration (core/settings_spec.py), marked secret: no default is
    # shown, and config/settings.py reads no variable itself (tests/core/test_settings_spec.py).
    declared = {item.name: item for item in SETTINGS}
    names = (
        "SECRET_KEY",
        "LLM_API_KEY",
        "REASONING_ENCRYPTION_KEYS",
        "AUDIT_SIGNING_KEYS",
        "AUDIT_WRITE_KEYS",
        "DATABASE_URL",
    )
    for name in (*names, "REDIS_URL"):
        assert declared[name].secret and declared[name].environment, name


def test_the_key_patterns_catch_real_looking_secrets():
    samples = {
        "OpenAI-style key": "LLM_API_KEY=sk-" + "a1B2" * 8,
        "Fernet key": "KEYS=" + Fernet.generate_key().decode(),
        "AWS access key": "AKIA" + "ABCDEFGHIJKLMNOP",
        "private key": "-----BEGIN RSA " + "PRIVATE KEY-----",
        "Django secret key": "SECRET_KEY = '" + "k" * 40 + "'",
        "password in a URL": "mysql://app:" + "hunter22@db:3306/x",
        "token literal": 'token = "' + "ab12" * 10 + '"',
    }
    for label, sample in samples.items():
        assert KEY_PATTERNS[label].search(sample), label


# --------------------------------------------------------------------------------------------------
# Logs: no reasoning, answers or tokens
# --------------------------------------------------------------------------------------------------
REASONING = "LOG-REASONING-MARKER-5e1d: the upstream pool is exhausted, check ss -ltnp first."


async def _drain(response) -> bytes:
    return b"".join([chunk async for chunk in response.streaming_content])


@pytest.mark.django_db(transaction=True)
def test_no_reasoning_answer_or_token_reaches_any_log_line_at_debug(
    llm, tmp_path, user, auditor, settings, caplog
):
    runtime_db.shutdown_pools()
    load_corpus(tmp_path / "kb")
    settings.DEBUG = True  # development mode: Django would log SQL here if the product let it
    answer_marker = "ANSWER-MARKER-77c2"
    llm.route("DIAGNOSIS")
    llm.add(
        AGENT,
        # DeepSeek style: the reasoning of a tool-calling step is sent back to the provider in the next
        # request of the turn, so it travels through the SDK's request logging too.
        stream_tool_calls(
            [("c_kb", "lookup_knowledge", '{"query": "nginx 502"}')], reasoning=REASONING, usage=usage(50, 9)
        ),
        lambda request: stream_answer(
            f"{answer_marker} check the upstream [{evidence_ids(request)[0]}].", reasoning=REASONING
        ),
    )
    llm.supported()
    token = issue_token(auditor)
    user_token = issue_token(user)
    with caplog.at_level(logging.DEBUG):
        run, outcome, _sink = ask(user, "nginx answers 502 after the deploy")
        assert any(m.get("reasoning_content") == REASONING for m in llm.requests[AGENT][1].messages)
        from django.test import Client

        reader = Client(HTTP_AUTHORIZATION=f"Token {token}")
        reasoning = reader.get(f"/api/diagnosis/{run.session_id}/trace/reasoning", {"runId": run.run_id})
        owner = Client(HTTP_AUTHORIZATION=f"Token {user_token}")
        reads = [
            owner.get(f"/api/diagnosis/{run.session_id}/trace", {"runId": run.run_id}),
            owner.get("/api/diagnosis/sessions/"),
            owner.get(f"/api/diagnosis/{run.session_id}/runs/"),
            owner.get(f"/api/diagnosis/{run.session_id}/runs/{run.run_id}/events"),
            Client(HTTP_AUTHORIZATION=f"Token {token}x").get("/api/diagnosis/sessions/"),  # a wrong token
        ]
        for response in reads:
            if response.streaming:  # the SSE replay of the finished run, read to its end
                asyncio.run(_drain(response))
    runtime_db.shutdown_pools()
    assert outcome.release_decision == "PUBLISHED" and answer_marker in run.content
    assert REASONING in reasoning.content.decode()  # the API does serve it to the auditor
    assert [r.status_code for r in reads] == [200, 200, 200, 200, 401]
    text = "\n".join(record.getMessage() for record in caplog.records)
    assert len(caplog.records) > 10  # the logs were really captured at DEBUG
    for secret in (REASONING[:24], answer_marker, token, user_token, "sk-test"):
        assert secret not in text, secret
    # The logging configuration keeps SQL (and its parameters: questions, answers) out. Tokens are not
    # in SQL at all: with the database logger opened to DEBUG, the auth query shows the token's clear
    # prefix (access.models.ApiToken) and never the token.
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="django.db.backends"):
        Client(HTTP_AUTHORIZATION=f"Token {user_token}").get("/api/diagnosis/sessions/")
    assert "access_api_token" in caplog.text and user_token[:8] in caplog.text
    assert user_token not in caplog.text
