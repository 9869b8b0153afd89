"""Bad `Content-Type` never 500s (issue 33 item 5): every operation of the served OpenAPI schema, sent a
multipart body without (or with an empty) boundary, a truncated multipart or JSON body, an unknown or
wrong charset, a malformed parameter, an unsupported or missing type — as a valid token, an unknown token,
a revoked token (its failure is counted, and axes copies the request's POST data into the attempt), a
session with its CSRF token, and Alertmanager's bearer token — answers in the contract's error shape,
never 5xx; an operation that reads a body refuses it with 400 or 415 when the caller is authenticated.

The fuzzer's finding was `POST /api/auth/tokens/{id}/revoke` with `multipart/form-data` and no boundary:
after the revoke its token's next request was a counted failure, and recording it read `request.POST`,
which Django cannot parse (`access.lockout._readable_post`, `core.api.client_error`).
"""

from __future__ import annotations

import collections

import pytest
from django.test import Client
from django.utils.crypto import get_random_string

from access.models import ApiToken
from tests.factories import issue_token, make_recorded_run, make_waiting_approval

pytestmark = pytest.mark.django_db(transaction=True)

WEBHOOK_TOKEN = "content-type-webhook-token"
# (Content-Type, body, whether an authenticated body-reading operation must refuse it with 400/415).
# Django's multipart and form parsers are lenient about a missing final boundary and bad percent escapes
# (an operation whose fields are all optional may accept them): those must only never 500.
MALFORMED = [
    ("multipart/form-data", b"query=hi", True),
    ("multipart/form-data; boundary=", b"--\r\nbroken", True),
    ("multipart/form-data; boundary=abc", b'--abc\r\nContent-Disposition: form-data; name="que', False),
    ("multipart/form-data; boundary=x; charset=no-such-charset", b"--x--\r\n", True),
    ("multipart/mixed", b"x", True),
    ("application/json", b'{"query": "truncat', True),
    ("application/json", b'\xff\xfe{"query": 1', True),
    ("application/json; charset=no-such-charset", b'{"query": "hi"}', True),
    ("application/json; charset=utf-16", b'{"query": "hi"}', True),
    ('application/json; charset="utf-8', b"{}", False),
    ("application/json;;;", b"{}", False),
    ("application/x-www-form-urlencoded; charset=no-such-charset", b"query=hi", True),
    ("application/x-www-form-urlencoded", b"%ff%fe=&=%&x=%zz", False),
    ("text/plain", b"hello", True),
    ("", b"hello", False),
]


def _error_shape(response) -> None:
    assert response["Content-Type"].startswith("application/json"), response.content[:200]
    body = response.json()
    assert set(body) == {"error"} and isinstance(body["error"].get("code"), str), body
    assert isinstance(body["error"].get("message"), str)


def test_malformed_content_types_on_every_operation_never_500(settings, superuser, user):
    settings.AIOPS_WEBHOOK_TOKEN = WEBHOOK_TOKEN
    # Counted failures are part of the test (the revoked token's); the lockout itself is test_lockout's.
    settings.LOCKOUT_FAILURE_LIMIT = settings.LOCKOUT_ANONYMOUS_FAILURE_LIMIT = 10**6
    run = make_recorded_run(superuser)
    waiting, call_id = make_waiting_approval(superuser)
    token = issue_token(superuser)
    revoked = issue_token(user)
    ApiToken.objects.filter(prefix=revoked[:8]).update(revoked_at="2026-01-01T00:00:00Z")
    revocable = ApiToken.objects.get(prefix=issue_token(superuser)[:8])
    session = Client(enforce_csrf_checks=True)
    session.force_login(superuser)
    csrf = get_random_string(32)
    session.cookies["csrftoken"] = csrf

    schema = Client().get("/api/schema/?format=json", HTTP_AUTHORIZATION=f"Token {token}").json()
    ids = {
        "{sessionId}": run.session_id,
        "{runId}": run.run_id,
        "{tokenId}": str(revocable.pk),
        "{treeSize}": "1",
        "{holdId}": "1",
        "{toolCallId}": call_id,
    }
    callers = {
        "token": (Client(), {"HTTP_AUTHORIZATION": f"Token {token}"}),
        "unknown token": (Client(), {"HTTP_AUTHORIZATION": "Token deadbeef.not-a-token"}),
        "revoked token": (Client(), {"HTTP_AUTHORIZATION": f"Token {revoked}"}),
        "session": (session, {"HTTP_X_CSRFTOKEN": csrf}),
        "webhook": (Client(), {"HTTP_AUTHORIZATION": f"Bearer {WEBHOOK_TOKEN}"}),
    }
    statuses: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    operations = 0
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            if method not in ("get", "post", "put", "patch", "delete") or path.endswith("/events"):
                continue  # the SSE stream: its malformed requests are tests/surfaces/chat/test_sse.py's
            operations += 1
            url = path
            for name, value in ids.items():
                if "/approvals/" in path and name in ("{sessionId}", "{runId}"):
                    value = waiting.session_id if name == "{sessionId}" else waiting.run_id
                url = url.replace(name, value)
            reads_body = "requestBody" in operation
            for content_type, body, must_refuse in MALFORMED:
                for caller, (client, headers) in callers.items():
                    response = client.generic(method.upper(), url, body, content_type=content_type, **headers)
                    label = f"{method.upper()} {path} [{content_type!r}] as {caller}"
                    statuses[caller][response.status_code] += 1
                    assert response.status_code < 500, (label, response.content[:300])
                    if response.status_code >= 400:
                        _error_shape(response)
                    authenticated = caller in ("token", "session") or (caller == "webhook") == (
                        path == "/api/aiops/alertmanager"
                    )
                    if must_refuse and reads_body and authenticated and response.status_code < 400:
                        pytest.fail(f"{label}: accepted a malformed body ({response.status_code})")
    print({caller: dict(counter) for caller, counter in statuses.items()})
    assert operations >= 20
    assert statuses["revoked token"][401] > 0 and statuses["unknown token"][401] > 0
    assert statuses["token"][415] > 0 and statuses["token"][400] > 0
