"""Streamed chat chunks read as JSON views instead of pydantic models: the `openai` SDK's client with one
step of its chunk handling replaced.

The SDK sends the request, retries nothing (`max_retries=0`; the runtime retries), decodes the SSE
stream, stops at `[DONE]`, drains the body for connection reuse and raises `APIError` for an `error`
object in the stream, exactly as before. Only its last step per chunk changes: `construct_type` building
a `ChatCompletionChunk` with its nested choice, delta, tool-call and usage models, about half of the
SDK's CPU per chunk (docs/performance.md, B3 profile), and on the chat profile a run reads ≈ 1 200
chunks. `LeanChunkClient` hands the decoded JSON object to the runtime as a `ChunkView` instead.

`ChunkView` answers what the runtime's `StreamAssembler`, `usage_from` and
`reasoning.capture.extract_reasoning` read, the way the SDK's models answer it: an attribute is the
JSON value of that key (None when absent); the objects the SDK declares as models (`choices`,
`delta`, `tool_calls`, `function`, `usage` and its details) are views themselves, every other value is
the JSON value as it came (an extra reasoning block stays a dict, as pydantic keeps extras); and
`model_extra` is the keys the SDK's model does not declare, so a reasoning field is found under the
same source (`reasoning_content` as the attribute, other keys as extras) and recorded the same.
Everything but streamed chat chunks (errors, non-streamed responses) goes through the SDK unchanged.
"""

from __future__ import annotations

from typing import Any

import openai
from openai.types.chat import ChatCompletionChunk

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
