"""API fuzzing: schemathesis over the served `/api/schema/` against a real daphne process.

A daphne subprocess serves the product on the test database with the offline demo provider. The
schema is loaded from it over HTTP; for every operation schemathesis generates valid (positive) and
invalid (negative) requests — path and query parameters, bodies in each media type the operation
declares (JSON, form, multipart), including strings of any Unicode — and then every malformed
`Content-Type` of `test_content_types.MALFORMED` (multipart without a boundary, unknown charsets,
truncated JSON …) is sent over HTTP. The whole fuzz runs twice in this one test against one server, as
an auditor (staff, *Reasoning Auditors*) and then as a plain user, each with tokens and a session of its
own, so nothing the first run does to its credentials (a pass may revoke the very token it uses, and its
later cases are then counted failures) reaches the second: failures count per (user, address)
(`access.lockout`), and the second run is asserted never to meet a `locked_out` 429. The examples are
bounded per operation and derandomised (the same requests on every run).

Checks on every response: never a 5xx (schemathesis's `not_a_server_error`); every 4xx body is the
contract's error shape; the status code is one the schema documents for that operation; JSON bodies of
documented responses conform to the schema. Afterwards the server's log has no traceback.
"""

from __future__ import annotations

import collections
from io import StringIO

import pytest
import requests
import schemathesis
from django.core.management import call_command
from django.test import Client
from django.utils.crypto import get_random_string
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from access.models import ApiToken
from audit.models import Checkpoint, LegalHold
from audit.transparency.log import checkpoint
from audit.write.retention import place_hold
from diagnosis.models import DiagnosisRun
from tests.agent.reliability.test_content_types import MALFORMED
from tests.factories import issue_token, make_recorded_run, make_waiting_approval
from tests.surfaces.chat.support import DaphneServer

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLES = {schemathesis.GenerationMode.POSITIVE: 12, schemathesis.GenerationMode.NEGATIVE: 12}


def json_schema_conformance(ctx, response, case):
    """The schema check for JSON bodies (the chat's SSE frames are checked by
    tests/surfaces/chat/test_sse.py)."""
    if response.headers.get("content-type", [""])[0].startswith("application/json"):
        return response_schema_conformance(ctx, response, case)
    return None


def refused_by_daphne(response) -> bool:
    """Refused by daphne's HTTP parser before the application saw it (e.g. control characters in a
    generated header or the decoded path): an empty 400 without headers, no response of ours to check."""
    return response.status_code == 400 and not response.headers and not response.text


def declared_content_type(ctx, response, case):
    """Schemathesis' content-type check, for every response the application itself sent."""
    if refused_by_daphne(response):
        return None
    return content_type_conformance(ctx, response, case)


WEBHOOK_TOKEN = "fuzz-webhook-token"
WEBHOOK_PATH = "/api/aiops/alertmanager"
CHECKS = [not_a_server_error, status_code_conformance, declared_content_type, json_schema_conformance]


@pytest.fixture
def server(superuser, user, auditor):
    run = make_recorded_run(user)  # something to list, page through and address by its real ids
    make_waiting_approval(user)  # a tool call that waits for a decision (the approvals endpoints)
    # A checkpoint (consistency proofs: the run's leaf, and the governance chain's head the superuser's
    # creation started) and a hold to lift.
    checkpoint()
    place_hold(user=superuser, scope="RUN", target_id=run.run_id, reason="fuzz")
    call_command("load_knowledge", "runbooks", stdout=StringIO())
    daphne = DaphneServer(
        env={
            "LLM_PROVIDER": "demo",
            "RUN_SWEEP_INTERVAL_SECONDS": "0",
            "CHAT_SSE_HEARTBEAT_SECONDS": "1",
            # The webhook is fuzzed with its own bearer token; fuzzed analyses stay queued.
            "AIOPS_WEBHOOK_TOKEN": WEBHOOK_TOKEN,
            "AIOPS_WORKER_CONCURRENCY": "0",
            # A pass that revokes its own token sends its later cases with a revoked token: counted
            # failures of that role at this address, which must not lock the role out of the rest of its
            # own run (lockout itself: tests/access/test_lockout.py). The other role's run is never
            # affected by them whatever the limit: they count per (user, address).
            "AXES_FAILURE_LIMIT": "1000000",
        },
        name="fuzz",
    ).start()
    yield daphne
    daphne.stop()


def error_shape(ctx, response, case):
    """Every 4xx/5xx body is `{"error": {"code", "message"}}`."""
    if response.status_code >= 400:
        if refused_by_daphne(response):
            return
        body = response.json()
        assert isinstance(body, dict) and set(body) == {"error"}, body
        assert isinstance(body["error"].get("code"), str) and isinstance(body["error"].get("message"), str)


def _fuzz(strategy, *, examples: int, counter: collections.Counter, checks: list, base_url: str, auth: dict):
    """Send `examples` derandomised cases of `strategy`, count the statuses, run the checks on each."""

    @given(case=strategy)
    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def fuzz(case):
        response = case.call(base_url=base_url, headers=auth, timeout=20)
        counter[response.status_code] += 1
        case.validate_response(response, checks=[*checks, error_shape], headers=auth)

    fuzz()


def _malformed_content_types(operation, *, base_url: str, auth: dict, path: dict, counter) -> None:
    """Every malformed Content-Type over HTTP: never a 5xx, every refusal in the error shape."""
    url = operation.path
    for name, value in path.items():
        url = url.replace(f"{{{name}}}", str(value))
    for content_type, body, _refused in MALFORMED:
        headers = {**auth, "Content-Type": content_type} if content_type else dict(auth)
        response = requests.request(
            operation.method.upper(), base_url + url, data=body, headers=headers, timeout=20
        )
        counter[response.status_code] += 1
        assert response.status_code < 500, (operation.label, content_type, response.text[:300])
        if response.status_code >= 400 and not refused_by_daphne(response):
            body_json = response.json()
            assert set(body_json) == {"error"}, (operation.label, content_type, body_json)


def _real_path(operation, real: dict, waiting) -> dict:
    """The operation's path parameters with real ids (the decision: the run whose call waits)."""
    if "{toolCallId}" in operation.path:
        return {"sessionId": waiting.session_id, "runId": waiting.run_id, "toolCallId": "call_silence"}
    return {k: v for k, v in real.items() if f"{{{k}}}" in operation.path}


def _auth_for(operation, role_user, *, auth: dict, session_auth: dict) -> dict:
    """The webhook authenticates only with its bearer token, issuing a token with a session, revoking one
    with a fresh token of the role (per call), every other operation with the role's token."""
    if operation.path == WEBHOOK_PATH:
        return {"Authorization": f"Bearer {WEBHOOK_TOKEN}"}
    if operation.label == "POST /api/auth/tokens/":
        return session_auth
    if operation.path.endswith("/revoke"):
        return {"Authorization": f"Token {issue_token(role_user)}"}
    return auth


def _fuzz_as(role_user, *, server, operations, real: dict, waiting, run) -> dict[str, collections.Counter]:
    """One whole fuzz as `role_user`, with tokens of its own; the statuses per operation."""
    token = issue_token(role_user)
    auth = {"Authorization": f"Token {token}"}
    statuses: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    unsatisfiable: list[str] = []
    # Issuing a token needs a session (a token cannot mint tokens): that operation is fuzzed with the
    # role's session cookie and a CSRF token, as a browser sends them.
    session = Client()
    session.force_login(role_user)
    csrf = get_random_string(32)
    session_auth = {
        "Cookie": f"sessionid={session.cookies['sessionid'].value}; csrftoken={csrf}",
        "X-CSRFToken": csrf,
    }
    passes = [(mode, ids) for mode in EXAMPLES for ids in ("generated", "real")]
    own_real = {**real, "tokenId": ApiToken.objects.get(prefix=issue_token(role_user)[:8]).pk}

    for operation in operations:
        media_types = list(operation.get_request_payload_content_types()) or [None]
        for mode, ids in passes:
            fixed_path = _real_path(operation, own_real, waiting)
            fixed_query = {"runId": run.run_id} if operation.path.endswith(("/trace", "/reasoning")) else {}
            if operation.path.endswith("/consistency"):
                fixed_query = {"from": 1}
            if ids == "real" and not (fixed_path or fixed_query):
                continue
            op_auth = _auth_for(operation, role_user, auth=auth, session_auth=session_auth)
            checks = CHECKS if mode == schemathesis.GenerationMode.POSITIVE else [not_a_server_error]
            for media_type in media_types:
                strategy = operation.as_strategy(
                    generation_mode=mode,
                    headers=op_auth,
                    path_parameters=fixed_path if ids == "real" else {},
                    query=fixed_query if ids == "real" else None,
                    media_type=media_type,
                )
                try:
                    _fuzz(
                        strategy,
                        examples=EXAMPLES[mode] // len(media_types) + 1,
                        counter=statuses[operation.label],
                        checks=checks,
                        base_url=server.url,
                        auth=op_auth,
                    )
                except Unsatisfiable:
                    # Nothing of this operation can be made invalid (e.g. no parameters, no body).
                    assert mode == schemathesis.GenerationMode.NEGATIVE, operation.label
                    unsatisfiable.append(operation.label)
        if operation.path.endswith("/events"):
            continue  # an SSE stream stays open (its malformed requests: tests/surfaces/chat/test_sse.py)
        # Then every malformed Content-Type, on the real ids, as the same caller.
        _malformed_content_types(
            operation,
            base_url=server.url,
            auth=_auth_for(operation, role_user, auth=auth, session_auth=session_auth),
            path=_real_path(operation, own_real, waiting),
            counter=statuses[operation.label],
        )
    print(role_user.username, {label: dict(counter) for label, counter in statuses.items()}, unsatisfiable)
    return statuses


# Once, on the production database (its strictness on lengths and types is what a fuzzed input meets).
@pytest.mark.mariadb_half
def test_schemathesis_finds_no_server_error_on_any_operation_as_an_auditor_then_a_plain_user(
    server, superuser, user, auditor
):
    """Over 30 s (two to four minutes on 2 cores): every operation of the schema, in every declared
    media type, bounded and derandomised, twice (two roles in one server, so one role's counted failures
    are shown not to lock the other out), then every malformed content type; the module says why."""
    schema = schemathesis.openapi.from_url(
        f"{server.url}/api/schema/?format=json",
        headers={"Authorization": f"Token {issue_token(superuser)}"},
        timeout=10,
    )
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 9  # sessions, runs, trace, reasoning, audits, feedback, chat, events, cancel

    run = DiagnosisRun.objects.exclude(status="INTERRUPTED").get()
    waiting = DiagnosisRun.objects.get(status="INTERRUPTED")
    real = {
        "sessionId": run.session_id,
        "runId": run.run_id,
        "treeSize": Checkpoint.objects.order_by("-tree_size").values_list("tree_size", flat=True).first(),
        "holdId": LegalHold.objects.get().pk,
    }
    by_role = {}
    for role_user in (auditor, user):  # in this order: the auditor's failures come first
        by_role[role_user.username] = _fuzz_as(
            role_user, server=server, operations=operations, real=real, waiting=waiting, run=run
        )

    for role, statuses in by_role.items():
        assert all(status < 500 for counter in statuses.values() for status in counter), role
        assert sum(sum(counter.values()) for counter in statuses.values()) >= 300, role
        # Every operation was reached past validation (a 2xx) or refused for who the role is: never only
        # refused for the request's form.
        for label, counter in statuses.items():
            assert any(200 <= s < 300 for s in counter) or counter.keys() & {401, 403, 404}, (role, label)
    # The plain user, fuzzed second, was never locked out: the auditor's counted failures are the
    # auditor's (at this address) alone.
    assert not any(counter[429] for counter in by_role[user.username].values() if counter), by_role[
        user.username
    ]
    # The auditor reaches the reasoning and the trace; the plain user its own sessions and tokens.
    reached = {
        role: {label for label, c in st.items() if any(200 <= s < 300 for s in c)}
        for role, st in by_role.items()
    }
    assert {
        "GET /api/diagnosis/{sessionId}/trace/reasoning",
        "GET /api/diagnosis/{sessionId}/trace",
    } <= reached[auditor.username]
    assert {"GET /api/diagnosis/sessions/", "GET /api/auth/tokens/"} <= reached[user.username]
    assert "Traceback" not in server.output()
