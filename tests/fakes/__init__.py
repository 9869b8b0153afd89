"""Test doubles that run real network servers (see ``openai_server``)."""

from .openai_server import (  # noqa: F401
    Completion,
    FakeLLMServer,
    HTTPError,
    Raw,
    RecordedRequest,
    Reset,
    Stall,
    Stream,
    finish_chunk,
    reasoning_chunks,
    stream_answer,
    stream_tool_calls,
    text_chunks,
    tool_call_chunks,
    usage,
    usage_chunk,
)
