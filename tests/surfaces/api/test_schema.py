"""The served OpenAPI schema describes every contract path of the trace API and every key of every
response, errors included; Swagger UI is served from the sidecar package (no CDN)."""

import json
import os
from pathlib import Path

import pytest
from django.core.management import call_command

from audit.events import EVENTS
from tests.surfaces.api.test_trace import (
    EVENT_KEYS,
    PROVIDER_KEYS,
    RUN_KEYS,
    STEP_KEYS,
    TIMING_KEYS,
    TOKEN_KEYS,
    TOOL_KEYS,
)

pytestmark = pytest.mark.django_db

ERROR = {"error": {"code": None, "message": None}}
PAGE = {"count": None, "next": None, "previous": None, "results": [None]}
# Sessions and runs: cursor pages (no count), see docs/api.md.
CURSOR_PAGE = {"next": None, "previous": None, "results": [None]}
TRACE = {
    "sessionId": None,
    "runResolution": None,
    "run": {
        **dict.fromkeys(RUN_KEYS - {"error", "provider", "timing", "tokens", "feedback"}),
        "error": {"code": None, "message": None},
        "provider": dict.fromkeys(PROVIDER_KEYS),
        "timing": dict.fromkeys(TIMING_KEYS),
        "tokens": {
            **dict.fromkeys(TOKEN_KEYS - {"callsWithoutUsage", "differences", "byAgent"}),
            "callsWithoutUsage": [None],
            "differences": [None],
            "byAgent": None,
        },
        "feedback": {"rating": None, "comment": None, "createdAt": None},
    },
    "timeline": [dict.fromkeys(EVENT_KEYS)],
    "steps": [dict.fromkeys(STEP_KEYS)],
    "tools": [dict.fromkeys(TOOL_KEYS)],
    "summary": {
        "persisted": dict.fromkeys(["events", "steps", "tools"]),
        "expected": dict.fromkeys(["events", "steps", "tools"]),
        "returned": dict.fromkeys(["events", "steps", "tools"]),
        "auditComplete": None,
        "auditWriteFailures": None,
        "fencedWrites": None,
        "chainValid": None,
        "rowsVerified": None,
        "rowsVerifiedCount": None,
        "anchor": dict.fromkeys(["checkpoint", "treeSize", "leafIndex", "signedAt"]),
        "gaps": [None],
    },
}
SIGNED = dict.fromkeys(["body", "signature"])
SIGNED_NOTES = dict.fromkeys(["body", "signature", "note", "link"])
CHECKPOINT = dict.fromkeys(
    [
        "treeSize",
        "rootHash",
        "signedAt",
        "previousHash",
        "keyId",
        "checkpointHash",
        "body",
        "signature",
        "link",
        "linkSignature",
    ]
)
EVIDENCE = {
    "format": None,
    "runId": None,
    "sessionId": None,
    "events": [
        dict.fromkeys(
            [
                "runId",
                "sessionId",
                "sequenceNo",
                "phase",
                "eventType",
                "status",
                "summary",
                "details",
                "createdAt",
                "prevHash",
                "hash",
            ]
        )
    ],
    "rows": {
        "steps": [dict.fromkeys(["digest", "form"])],
        "tools": [dict.fromkeys(["digest", "form"])],
        "reasoning": [dict.fromkeys(["stepIndex", "agentName", "digest"])],
        "run": dict.fromkeys(["digest", "form"]),
    },
    "anchor": {
        **dict.fromkeys(["leafIndex", "leafData", "leafHash", "treeSize", "inclusionProof"]),
        "checkpoint": SIGNED,
    },
}
REASONING = {
    "sessionId": None,
    "runId": None,
    "records": [
        dict.fromkeys(
            [
                "stepIndex",
                "agentName",
                "reasoningAvailable",
                "reasoningContent",
                "assistantText",
                "contentSource",
                "contentBytes",
                "purged",
                "createdAt",
            ]
        )
    ],
}

# path -> method -> status -> required key tree (None: any leaf)
CONTRACT = {
    "/api/diagnosis/sessions/": {"get": {200: CURSOR_PAGE, 401: ERROR}},
    "/api/diagnosis/{sessionId}/runs/": {"get": {200: CURSOR_PAGE, 400: ERROR, 401: ERROR, 404: ERROR}},
    "/api/diagnosis/{sessionId}/trace": {"get": {200: TRACE, 400: ERROR, 401: ERROR, 404: ERROR}},
    "/api/diagnosis/{sessionId}/trace/reasoning": {
        "get": {200: REASONING, 400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR, 429: ERROR}
    },
    "/api/diagnosis/{sessionId}/audits": {
        "get": {200: {"audits": [None], "truncated": None}, 401: ERROR, 403: ERROR, 404: ERROR}
    },
    "/api/diagnosis/{sessionId}/runs/{runId}/feedback": {
        "post": {201: dict.fromkeys(["rating", "comment", "createdAt"]), 400: ERROR, 401: ERROR, 404: ERROR}
    },
    "/api/diagnosis/{sessionId}/runs/{runId}/evidence": {
        "get": {200: EVIDENCE, 401: ERROR, 403: ERROR, 404: ERROR}
    },
    "/api/audit/checkpoints/": {
        "get": {
            200: {
                **PAGE,
                "results": [CHECKPOINT],
                "publicKeys": [
                    dict.fromkeys(["keyId", "vkey", "algorithm", "publicKey", "signing", "legacyKeyId"])
                ],
            },
            401: ERROR,
            403: ERROR,
        }
    },
    "/api/audit/checkpoints/{treeSize}/consistency": {
        "get": {
            200: {
                **dict.fromkeys(["fromTreeSize", "treeSize", "fromRootHash", "rootHash", "proof"]),
                "checkpoint": SIGNED_NOTES,
                "fromCheckpoint": SIGNED_NOTES,
            },
            400: ERROR,
            401: ERROR,
            403: ERROR,
            404: ERROR,
        }
    },
}
ENUMS = {
    ("TraceRun", "status"): {"PENDING", "RUNNING", "SUCCESS", "FAILED", "CANCELLED", "INTERRUPTED"},
    ("TraceRun", "intent"): {"DIAGNOSIS", "KNOWLEDGE", "CHITCHAT", "OUT_OF_SCOPE"},
    ("TraceRun", "releaseDecision"): {"PUBLISHED", "BLOCKED"},
    ("TimelineEvent", "phase"): {"RUN", "ROUTING", "AGENT", "TOOL", "GUARD", "RELEASE"},
    ("TraceTool", "status"): {
        "AWAITING_APPROVAL",
        "RUNNING",
        "SUCCEEDED",
        "FAILED",
        "INTERRUPTED",
        "ABANDONED",
    },
    ("TraceStep", "contentSource"): {
        "PROVIDER_REASONING+ASSISTANT_TEXT",
        "PROVIDER_REASONING",
        "ASSISTANT_TEXT",
        "TOOL_CALL_PLAN",
        "NONE",
    },
    ("Trace", "runResolution"): {"EXACT", "LATEST"},
    # The event types are declared once, in the registry (`audit.events`; tests/audit/test_event_registry.py).
    ("TimelineEvent", "eventType"): {spec.type for spec in EVENTS},
}


@pytest.fixture(scope="module")
def schema(django_db_blocker):
    from rest_framework.test import APIClient

    with django_db_blocker.unblock():
        response = APIClient().get("/api/schema/?format=json")
    assert response.status_code == 200
    return response.json()


def _resolve(schema, node):
    while "$ref" in node or "allOf" in node or ("oneOf" in node and len(node["oneOf"]) == 2):
        if "$ref" in node:
            node = schema["components"]["schemas"][node["$ref"].split("/")[-1]]
        elif "allOf" in node:
            node = node["allOf"][0]
        else:  # nullable enums: oneOf [Enum, NullEnum]
            node = next(n for n in node["oneOf"] if "NullEnum" not in n.get("$ref", ""))
    return node


def _missing(schema, node, tree, where):
    node = _resolve(schema, node)
    if tree is None:
        return []
    if isinstance(tree, list):
        assert node.get("type") == "array", where
        return _missing(schema, node["items"], tree[0], where + "[]")
    problems = []
    props = node.get("properties", {})
    for key, sub in tree.items():
        if key not in props:
            problems.append(f"{where}.{key}")
        else:
            problems += _missing(schema, props[key], sub, f"{where}.{key}")
    return problems


def test_every_contract_path_and_response_key_is_in_the_schema(schema):
    problems = []
    for path, methods in CONTRACT.items():
        assert path in schema["paths"], path
        for method, statuses in methods.items():
            operation = schema["paths"][path][method]
            for status, tree in statuses.items():
                response = operation["responses"].get(str(status))
                if response is None:
                    problems.append(f"{method.upper()} {path} {status}: not documented")
                    continue
                content = response["content"]["application/json"]["schema"]
                problems += _missing(schema, content, tree, f"{method.upper()} {path} {status}")
    assert problems == []


def test_query_parameters_are_documented(schema):
    runs = {p["name"] for p in schema["paths"]["/api/diagnosis/{sessionId}/runs/"]["get"]["parameters"]}
    assert {
        "sessionId",
        "cursor",
        "pageSize",
        "status",
        "releaseDecision",
        "intent",
        "createdAfter",
        "createdBefore",
    } <= runs
    reasoning = schema["paths"]["/api/diagnosis/{sessionId}/trace/reasoning"]["get"]["parameters"]
    assert any(p["name"] == "runId" and p["in"] == "query" and p["required"] for p in reasoning)
    trace = schema["paths"]["/api/diagnosis/{sessionId}/trace"]["get"]["parameters"]
    assert any(p["name"] == "runId" and not p.get("required", False) for p in trace)
    assert "requestBody" in schema["paths"]["/api/diagnosis/{sessionId}/runs/{runId}/feedback"]["post"]


def test_enumerations_match_the_contract(schema):
    for (component, field), values in ENUMS.items():
        prop = _resolve(schema, schema["components"]["schemas"][component]["properties"][field])
        assert set(prop["enum"]) - {None} == values, (component, field)


def test_schema_generation_has_no_warnings():
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", "/dev/null")


def test_swagger_ui_is_served_without_a_cdn(client):
    page = client.get("/api/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "swagger-ui" in html and "cdn." not in html and "unpkg" not in html and "jsdelivr" not in html
    assert "/static/drf_spectacular_sidecar/" in html


SCHEMA_SNAPSHOT = Path(__file__).parent / "data" / "openapi_schema.json"


def test_served_schema_is_identical_to_the_committed_copy(schema):
    """Moving code must not change the contract: the served schema equals the committed
    `tests/surfaces/api/data/openapi_schema.json`.

    After an intended contract change, regenerate the copy from `/api/schema/?format=json` (JSON, sorted keys,
    indent 2), e.g. with `UPDATE_SCHEMA_SNAPSHOT=1 pytest -k committed_copy`, and review its diff with the
    change."""
    served = json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    if os.environ.get("UPDATE_SCHEMA_SNAPSHOT") == "1":
        SCHEMA_SNAPSHOT.write_text(served, encoding="utf-8")
    assert served == SCHEMA_SNAPSHOT.read_text(encoding="utf-8")
