"""API fuzzing: schemathesis over the served `/api/schema/` against a real daphne process.

A daphne subprocess serves the product on the test database with the offline demo provider. The
schema is loaded from it over HTTP; for every operation schemathesis generates valid (positive) and
invalid (negative) requests — path and query parameters, bodies, including strings of any Unicode — sent
with a superuser's `Authorization: Token` header, so every endpoint (audits too) is reachable. The
examples are bounded per operation and derandomised (the same requests on every run), which keeps the
whole fuzz well under a minute.

Checks on every response: never a 5xx (schemathesis's `not_a_server_error`); every 4xx body is the
contract's error shape; the status code is one the schema documents for that operation; JSON bodies of
documented responses conform to the schema. Afterwards the server's log has no traceback.
"""

from __future__ import annotations

import collections
from io import StringIO

import pytest
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
from audit.retention import place_hold
from audit.transparency.log import checkpoint
from diagnosis.models import DiagnosisRun
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
def server(superuser, user):
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
            # Negative cases send invalid tokens by design; locking the fuzzer's address out would leave
            # every later case a 429 (lockout itself: tests/access/test_lockout.py).
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


def test_schemathesis_finds_no_server_error_on_any_operation(server, superuser, user):
    token = issue_token(superuser)
    auth = {"Authorization": f"Token {token}"}
    schema = schemathesis.openapi.from_url(f"{server.url}/api/schema/?format=json", headers=auth, timeout=10)
    statuses: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    unsatisfiable: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 9  # sessions, runs, trace, reasoning, audits, feedback, chat, events, cancel

    run = DiagnosisRun.objects.exclude(status="INTERRUPTED").get()
    waiting = DiagnosisRun.objects.get(status="INTERRUPTED")
    real = {
        "sessionId": run.session_id,
        "runId": run.run_id,
        "treeSize": Checkpoint.objects.order_by("-tree_size").values_list("tree_size", flat=True).first(),
        "holdId": LegalHold.objects.get().pk,
        # A token of `user` the revoke operation may revoke (its fuzzing authenticates as `user`, so no
        # generated id can revoke the superuser's token every other operation uses).
        "tokenId": ApiToken.objects.get(prefix=issue_token(user)[:8]).pk,
    }
    # Issuing a token needs a session (a token cannot mint tokens): that operation is fuzzed with the
    # superuser's session cookie and a CSRF token, as a browser sends them.
    session = Client()
    session.force_login(superuser)
    csrf = get_random_string(32)
    session_auth = {
        "Cookie": f"sessionid={session.cookies['sessionid'].value}; csrftoken={csrf}",
        "X-CSRFToken": csrf,
    }
    passes = [(mode, ids) for mode in EXAMPLES for ids in ("generated", "real")]

    for operation in operations:
        for mode, ids in passes:
            fixed_path = {k: v for k, v in real.items() if f"{{{k}}}" in operation.path}
            if "{toolCallId}" in operation.path:  # the decision: the run whose call waits
                fixed_path = {
                    "sessionId": waiting.session_id,
                    "runId": waiting.run_id,
                    "toolCallId": "call_silence",
                }
            fixed_query = {"runId": run.run_id} if operation.path.endswith(("/trace", "/reasoning")) else {}
            if operation.path.endswith("/consistency"):
                fixed_query = {"from": 1}
            if ids == "real" and not (fixed_path or fixed_query):
                continue
            # The webhook authenticates only with its bearer token, issuing a token with a session, revoking
            # one with a fresh token of `user` per pass, every other operation with the superuser's token.
            if operation.path == WEBHOOK_PATH:
                op_auth = {"Authorization": f"Bearer {WEBHOOK_TOKEN}"}
            elif operation.label == "POST /api/auth/tokens/":
                op_auth = session_auth
            elif operation.path.endswith("/revoke"):
                op_auth = {"Authorization": f"Token {issue_token(user)}"}
            else:
                op_auth = auth
            strategy = operation.as_strategy(
                generation_mode=mode,
                headers=op_auth,
                path_parameters=fixed_path if ids == "real" else {},
                query=fixed_query if ids == "real" else None,
            )
            checks = CHECKS if mode == schemathesis.GenerationMode.POSITIVE else [not_a_server_error]
            try:
                _fuzz(
                    strategy,
                    examples=EXAMPLES[mode],
                    counter=statuses[operation.label],
                    checks=checks,
                    base_url=server.url,
                    auth=op_auth,
                )
            except Unsatisfiable:
                # Nothing of this operation can be made invalid (e.g. no parameters, no body).
                assert mode == schemathesis.GenerationMode.NEGATIVE, operation.label
                unsatisfiable.append(operation.label)

    print({label: dict(counter) for label, counter in statuses.items()}, unsatisfiable)
    assert all(status < 500 for counter in statuses.values() for status in counter)
    assert sum(sum(counter.values()) for counter in statuses.values()) >= 300
    # Every operation was reached past validation at least once (a 2xx), not only refused.
    assert all(any(200 <= status < 300 for status in counter) for counter in statuses.values()), {
        label: dict(counter)
        for label, counter in statuses.items()
        if not any(200 <= s < 300 for s in counter)
    }
    assert "Traceback" not in server.output()
