"""The chat endpoints in the served OpenAPI schema.

`surfaces.chat.sse` are async Django views (DRF has no async views, and a stream is not a serializer),
so drf-spectacular cannot see them. This postprocessing hook (`SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"]`)
adds their paths as the API contract's *Chat* section states them: the request body, the
`text/event-stream` responses with each event's `data` object, the cancel answer, and the error
responses in the contract's shape. The WebSocket `ws/chat/` is not HTTP and is described in docs/chat.md.
"""

from __future__ import annotations

from typing import Any

from agent.runtime.events import FINISHED, STAGES, STARTED
from core.ids import MAX_ID_CHARS

ERROR_REF = {"$ref": "#/components/schemas/Error"}
_ERROR_SCHEMA = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
            "required": ["code", "message"],
        }
    },
    "required": ["error"],
}

_STRING = {"type": "string"}
_AT = {
    "type": "string",
    "format": "date-time",
    "description": "On a frame read from the timeline (a replay, a resume, the catch-up at the start of a "
    "stream): when its timeline event was recorded. Absent on a frame sent as it happened.",
}
_SCHEMAS: dict[str, Any] = {
    "ChatRequest": {
        "type": "object",
        "properties": {
            "query": {"type": "string", "minLength": 1, "maxLength": 8000},
            "sessionId": {
                "type": "string",
                "maxLength": MAX_ID_CHARS,
                "description": "Omit to start a new session.",
            },
        },
        "required": ["query"],
    },
    "ChatRunEvent": {
        "type": "object",
        "description": "`event: run` — always first.",
        "properties": {
            "sessionId": _STRING,
            "runId": _STRING,
            "demo": {"type": "boolean", "description": "The demo model answers the run: label it DEMO."},
            "query": {
                "type": "string",
                "description": "The question as stored: secrets in it were replaced by placeholders before "
                "the run was created (show this, not what was typed).",
            },
            "askedAt": {
                "type": "string",
                "format": "date-time",
                "nullable": True,
                "description": "When the question was asked (the run's creation): the origin of `at`.",
            },
        },
        "required": ["sessionId", "runId", "demo", "query", "askedAt"],
    },
    "ChatProgressEvent": {
        "type": "object",
        "description": (
            "`event: progress` — what the run is doing: a stage that STARTED (live only, `sequenceNo` "
            "null) or FINISHED (one timeline event, replayable). Only the facts that apply are sent; "
            "never answer text, reasons or reasoning."
        ),
        "properties": {
            "stage": {"type": "string", "enum": list(STAGES)},
            "status": {"type": "string", "enum": [STARTED, FINISHED]},
            "sequenceNo": {"type": "integer", "nullable": True},
            "intent": {"type": "string", "description": "ROUTING: the routed intent."},
            "stepIndex": {"type": "integer", "description": "MODEL_STEP: the step's index."},
            "agentName": {"type": "string", "description": "MODEL_STEP: the agent."},
            "verdict": {
                "type": "string",
                "description": (
                    "MODEL_STEP: TOOL_CALLS or ANSWER; guards: PASS, FAIL or ERROR; RELEASE: PUBLISHED "
                    "or BLOCKED; REDACTION: APPLIED."
                ),
            },
            "retry": {"type": "boolean", "description": "EVIDENCE_GUARD: the repair round's check."},
            "redacted": {
                "type": "object",
                "additionalProperties": {"type": "integer"},
                "description": (
                    "REDACTION (verdict APPLIED): per kind (`aws-access-key`, `private-key`, …), how many "
                    "values were replaced by placeholders before anything was sent or stored; never a value."
                ),
            },
            "at": _AT,
        },
        "required": ["stage", "status", "sequenceNo"],
    },
    "ChatDraftEvent": {
        "type": "object",
        "description": (
            "`event: draft` — only when the server runs with `CHAT_RELEASE=draft`: unverified answer "
            "text as the model writes it (never reasoning); not persisted, recorded as delivered."
        ),
        "properties": {"text": _STRING},
        "required": ["text"],
    },
    "ChatToolEvent": {
        "type": "object",
        "description": "`event: tool` — RUNNING (or AWAITING_APPROVAL for a call that waits for a "
        "person), then a terminal status; no input or output.",
        "properties": {
            "toolCallId": _STRING,
            "name": _STRING,
            "status": {
                "type": "string",
                "enum": ["AWAITING_APPROVAL", "RUNNING", "SUCCEEDED", "FAILED", "INTERRUPTED", "ABANDONED"],
            },
            "at": _AT,
        },
        "required": ["toolCallId", "name", "status"],
    },
    "ChatOutcomeEvent": {
        "type": "object",
        "description": "`event: outcome` — always last on a finished run; `content` is what was released.",
        "properties": {
            "runId": _STRING,
            "status": {"type": "string", "enum": ["SUCCESS", "FAILED", "CANCELLED"]},
            "releaseDecision": {"type": "string", "enum": ["PUBLISHED", "BLOCKED"], "nullable": True},
            "content": _STRING,
            "contentHtml": {
                "type": "string",
                "description": "`content` rendered as sanitised HTML (Markdown, no raw HTML) with each "
                "citation linked to the cited runbook chunk; for pages. `content` is what was released.",
            },
        },
        "required": ["runId", "status", "releaseDecision", "content", "contentHtml"],
    },
    "ChatErrorEvent": {
        "type": "object",
        "description": "`event: error` — a failed run sends this, then its outcome.",
        "properties": {"code": _STRING, "message": _STRING},
        "required": ["code", "message"],
    },
    "CancelAccepted": {
        "type": "object",
        "properties": {
            "runId": _STRING,
            "status": {
                "type": "string",
                "enum": ["PENDING", "RUNNING", "SUCCESS", "FAILED", "CANCELLED", "INTERRUPTED"],
                "description": "The run's status when the cancel was requested (CANCELLED at once for a "
                "run that waited for an approval).",
            },
        },
        "required": ["runId", "status"],
    },
}

_STREAM_DESCRIPTION = (
    "Server-Sent Events. `event:` is one of run, progress, draft, tool, outcome, error; `data:` is one "
    "JSON object (schemas `ChatRunEvent`, `ChatProgressEvent`, `ChatDraftEvent`, `ChatToolEvent`, "
    "`ChatOutcomeEvent`, `ChatErrorEvent`); `id:` is the timeline sequence number on run, finished "
    "progress, tool and outcome events. With the default `CHAT_RELEASE=verified` no answer text is sent "
    "before the outcome. A `: keep-alive` comment is sent while idle."
)


def _stream_response() -> dict[str, Any]:
    return {
        "description": _STREAM_DESCRIPTION,
        "content": {
            "text/event-stream": {
                "schema": {
                    "oneOf": [
                        {"$ref": f"#/components/schemas/{name}"}
                        for name in (
                            "ChatRunEvent",
                            "ChatProgressEvent",
                            "ChatDraftEvent",
                            "ChatToolEvent",
                            "ChatOutcomeEvent",
                            "ChatErrorEvent",
                        )
                    ]
                }
            }
        },
    }


def _errors(*codes: int) -> dict[str, Any]:
    text = {
        400: "Invalid request (`invalid_request`).",
        401: "Not authenticated (`not_authenticated`, `authentication_failed`).",
        403: "CSRF check failed for session authentication (`permission_denied`).",
        404: "No such session or run, or one the user may not see (`not_found`).",
        413: "The body is over 64 KiB (`request_too_large`).",
        429: "Too many active runs (`too_many_active_runs`), or too many chats started "
        "(`throttled`, with `Retry-After`; `CHAT_THROTTLE_RATE`).",
    }
    return {
        str(c): {"description": text[c], "content": {"application/json": {"schema": ERROR_REF}}}
        for c in codes
    }


def _path_param(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": {"type": "string", "maxLength": MAX_ID_CHARS},
    }


_SECURITY = [{"tokenAuth": []}, {"cookieAuth": []}]


def chat_paths() -> dict[str, Any]:
    return {
        "/api/chat": {
            "post": {
                "operationId": "chat_stream",
                "summary": "Ask a question and stream the run",
                "description": "Starts a run (in `sessionId`, or a new session) and streams it like an "
                "attach from 0: `run` first, `outcome` last. Closing the stream never stops the run.",
                "tags": ["chat"],
                "security": _SECURITY,
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ChatRequest"}}},
                },
                "responses": {"200": _stream_response(), **_errors(400, 401, 403, 404, 413, 429)},
            }
        },
        "/api/diagnosis/{sessionId}/runs/{runId}/events": {
            "get": {
                "operationId": "run_events",
                "summary": "Replay a run's events after N, then follow it live until its outcome",
                "tags": ["chat"],
                "security": _SECURITY,
                "parameters": [
                    _path_param("sessionId"),
                    _path_param("runId"),
                    {
                        "name": "after",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "integer", "minimum": 0, "default": 0},
                        "description": "Timeline sequence number already seen (`Last-Event-ID` counts too).",
                    },
                ],
                "responses": {"200": _stream_response(), **_errors(400, 401, 404)},
            }
        },
        "/api/diagnosis/{sessionId}/runs/{runId}/cancel": {
            "post": {
                "operationId": "run_cancel",
                "summary": "Ask a run to stop",
                "description": "The run stops at its next safe point or interrupts its running tool; its "
                "`outcome` (`CANCELLED`) reaches every stream following it. Cancelling a finished run "
                "changes nothing.",
                "tags": ["chat"],
                "security": _SECURITY,
                "parameters": [_path_param("sessionId"), _path_param("runId")],
                "responses": {
                    "202": {
                        "description": "Cancel requested.",
                        "content": {
                            "application/json": {"schema": {"$ref": "#/components/schemas/CancelAccepted"}}
                        },
                    },
                    **_errors(401, 403, 404),
                },
            }
        },
    }


def add_chat_paths(result: dict[str, Any], generator=None, request=None, public=None) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: add the chat paths and their component schemas."""
    components = result.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas.setdefault("Error", _ERROR_SCHEMA)
    for name, schema in _SCHEMAS.items():
        schemas.setdefault(name, schema)
    schemes = components.setdefault("securitySchemes", {})
    schemes.setdefault("tokenAuth", {"type": "apiKey", "in": "header", "name": "Authorization"})
    schemes.setdefault("cookieAuth", {"type": "apiKey", "in": "cookie", "name": "sessionid"})
    paths = result.setdefault("paths", {})
    for path, item in chat_paths().items():
        paths.setdefault(path, {}).update(item)
    return result
