"""Streamed chat chunks read as JSON views instead of pydantic models: the `openai` SDK's client with one
step of its chunk handling replaced.

`LeanChunkClient` leaves the SDK to send the request, decode the SSE stream, stop at `[DONE]` and raise
`APIError`, and hands each chunk's JSON to the runtime as a `ChunkView` (answering what the runtime reads
as the SDK's models would) instead of building models (about half its CPU per chunk). `stream_chat(body)`
sends what `chat.completions.create(**body)` sends (path, headers, options, stream class) without its typed
transform of the body (≈ 4 ms of CPU per run; `tests/agent/runtime/test_lean_chunks.py` checks the body is
identical on every request of real runs). Details: docs/runtime.md, *Model client and retry policy*.
"""

from __future__ import annotations

from typing import Any

import openai
from openai._base_client import make_request_options
from openai.types.chat import ChatCompletion, ChatCompletionChunk

# The keys whose values the SDK builds into models (here: views).
_MODELS = frozenset(
    {
        "choices",
        "delta",
        "tool_calls",
        "function",
        "usage",
        "completion_tokens_details",
        "prompt_tokens_details",
    }
)
# What the SDK's chunk models declare, by the key under which a view was reached (None: the chunk).
_DECLARED: dict[str | None, frozenset[str]] = {
    None: frozenset(
        {"id", "choices", "created", "model", "object", "service_tier", "system_fingerprint", "usage"}
    ),
    "choices": frozenset({"delta", "finish_reason", "index", "logprobs"}),
    "delta": frozenset({"content", "function_call", "refusal", "role", "tool_calls"}),
    "tool_calls": frozenset({"index", "id", "function", "type"}),
    "function": frozenset({"arguments", "name"}),
    "usage": frozenset(
        {
            "completion_tokens",
            "prompt_tokens",
            "total_tokens",
            "completion_tokens_details",
            "prompt_tokens_details",
        }
    ),
    "completion_tokens_details": frozenset(
        {"accepted_prediction_tokens", "audio_tokens", "reasoning_tokens", "rejected_prediction_tokens"}
    ),
    "prompt_tokens_details": frozenset({"audio_tokens", "cached_tokens"}),
}


class ChunkView:
    """A read-only attribute view of one JSON object of a streamed chat chunk (see the module text)."""

    __slots__ = ("_data", "_kind")

    def __init__(self, data: dict[str, Any], kind: str | None = None) -> None:
        self._data = data
        self._kind = kind

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = self._data.get(name)
        if name in _MODELS:
            if isinstance(value, dict):
                return ChunkView(value, name)
            if isinstance(value, list):
                return [ChunkView(v, name) if isinstance(v, dict) else v for v in value]
        return value

    @property
    def model_extra(self) -> dict[str, Any]:
        declared = _DECLARED.get(self._kind, frozenset())
        return {k: v for k, v in self._data.items() if k not in declared}

    def __repr__(self) -> str:  # never the content: a chunk may carry reasoning
        return f"<ChunkView {self._kind or 'chunk'} keys={sorted(self._data)}>"


class LeanChunkClient(openai.AsyncOpenAI):
    """`AsyncOpenAI` whose streamed chat-completion chunks are `ChunkView`s (see the module text)."""

    def _process_response_data(self, *, data: object, cast_to: Any, response: Any) -> Any:
        if cast_to is ChatCompletionChunk and isinstance(data, dict):
            return ChunkView(data)
        return super()._process_response_data(data=data, cast_to=cast_to, response=response)

    async def stream_chat(self, body: dict[str, Any]) -> openai.AsyncStream[ChatCompletionChunk]:
        """`chat.completions.create(**body)` with `body["stream"]` true, posted as built (see the module
        text)."""
        return await self.post(
            "/chat/completions",
            body=body,
            options=make_request_options(security={"bearer_auth": True}),
            cast_to=ChatCompletion,
            stream=True,
            stream_cls=openai.AsyncStream[ChatCompletionChunk],
        )
