"""The model client against the local fake provider through the real `openai` SDK: stream assembly,
usage, retries with backoff and their visibility, and the run error codes (no database needed)."""

import asyncio
import json
import time

import pytest

from agent.runtime.agent import assistant_message
from agent.runtime.llm import (
    LLM_BAD_RESPONSE,
    LLM_RATE_LIMITED,
    LLM_REJECTED,
    LLM_TIMEOUT,
    LLM_UNAVAILABLE,
    LLMError,
    OpenAIModelClient,
    StreamProgress,
    aclose_clients,
    parse_json_object,
)
from tests.fakes.openai_server import (
    FakeLLMServer,
    HTTPError,
    Reset,
    Stall,
    Stream,
    finish_chunk,
    reasoning_chunks,
    stream_answer,
    text_chunks,
    tool_call_chunks,
    usage,
)

FAST = {"retry-after-ms": "1"}


@pytest.fixture(params=["aiohttp", "httpx"])
def server(request, settings):
    """The fake provider, reached through each HTTP client the SDK can send with (`LLM_HTTP_CLIENT`):
    every test below holds for both."""
    with FakeLLMServer() as srv:
        settings.LLM_HTTP_CLIENT = request.param
        settings.LLM_BASE_URL = srv.base_url
        settings.LLM_API_KEY = "sk-test"
        settings.LLM_TIMEOUT_SECONDS = 0.5
        yield srv
        assert not srv.errors


class Pieces:
    def __init__(self):
        self.pieces = []

    async def __call__(self, text):
        self.pieces.append(text)


async def complete(max_retries=2, **kwargs):
    client = OpenAIModelClient(max_retries=max_retries)
    try:
        return await client.complete(model="m", messages=[{"role": "user", "content": "q"}], **kwargs)
    finally:
        await aclose_clients()


@pytest.mark.asyncio
async def test_assembles_reasoning_text_parallel_tool_calls_finish_and_usage(server):
    reasoning = "First, check the disk.\n\n  Then   the logs."
    calls = [("call_a", "lookup_knowledge", '{"query": "disk full"}'), ("call_b", "other", '{"x": [1, 2]}')]
    server.enqueue(
        Stream(
            chunks=reasoning_chunks(reasoning, 20)  # includes whitespace-only deltas
            + text_chunks("Looking it up.", 4, role=False)
            + tool_call_chunks(calls, fragments=5, interleave=True, role=False)
            + [finish_chunk("tool_calls")],
            usage=usage(100, 40, reasoning=25, cached=64),
        )
    )
    on_text = Pieces()
    result = await complete(on_text=on_text)
    assert result.reasoning == reasoning and result.reasoning_key == "attribute"
    assert result.text == "Looking it up." == "".join(on_text.pieces) and len(on_text.pieces) == 4
    assert [(c.tool_call_id, c.name, json.loads(c.arguments)) for c in result.tool_calls] == [
        ("call_a", "lookup_knowledge", {"query": "disk full"}),
        ("call_b", "other", {"x": [1, 2]}),
    ]
    assert result.finish_reason == "tool_calls"
    u = result.usage
    assert (u.available, u.prompt_tokens, u.completion_tokens, u.total_tokens) == (True, 100, 40, 140)
    assert (u.reasoning_tokens, u.cached_tokens) == (25, 64)
    assert [(a["attempt"], a["status"]) for a in result.attempts] == [(1, 200)]
    assert server.requests[0].stream and server.requests[0].include_usage


@pytest.mark.asyncio
async def test_deepseek_cache_hits_and_other_reasoning_keys(server):
    deepseek = {
        "prompt_tokens": 50,
        "completion_tokens": 9,
        "total_tokens": 59,
        "prompt_cache_hit_tokens": 32,
    }
    server.enqueue(stream_answer("ok", reasoning="think", usage=deepseek, reasoning_field="reasoning"))
    result = await complete()
    assert result.usage.cached_tokens == 32 and result.usage.reasoning_tokens is None
    assert result.reasoning == "think" and result.reasoning_key == "reasoning"
    # Only DeepSeek's own field is sent back within a turn; other providers' keys are not invented.
    assert "reasoning_content" not in assistant_message(result)


@pytest.mark.asyncio
async def test_stream_without_usage_is_unavailable_never_zero(server):
    server.enqueue(stream_answer("fine"))
    result = await complete()
    assert result.usage.available is False and result.usage.total_tokens is None
    assert result.reasoning is None and result.reasoning_key is None


@pytest.mark.asyncio
async def test_rate_limit_then_success_is_retried_and_each_attempt_visible(server):
    server.enqueue(HTTPError(429, headers={"retry-after-ms": "20"}), stream_answer("ok", usage=usage(1, 1)))
    began = time.monotonic()
    result = await complete()
    assert result.text == "ok" and len(server.requests) == 2
    assert time.monotonic() - began >= 0.02  # the provider's retry-after-ms was honoured
    first, second = result.attempts
    assert first["status"] == 429 and first["error"] == "RateLimitError" and first["retryInMs"] == 20
    assert second == {"attempt": 2, "status": 200, "durationMs": second["durationMs"]}


@pytest.mark.asyncio
async def test_retry_after_seconds_header(server):
    server.enqueue(HTTPError(503, headers={"retry-after": "0.01"}), stream_answer("ok"))
    result = await complete()
    assert result.attempts[0]["retryInMs"] == 10 and result.attempts[0]["status"] == 503


@pytest.mark.asyncio
async def test_5xx_until_retries_run_out_is_llm_unavailable(server):
    server.enqueue(*[HTTPError(500, headers=FAST) for _ in range(3)])
    progress = StreamProgress()
    with pytest.raises(LLMError) as caught:
        await complete(max_retries=2, progress=progress)
    assert caught.value.code == LLM_UNAVAILABLE and len(server.requests) == 3
    assert "3 attempts" in caught.value.message and "FakeLLMServer" not in caught.value.message
    assert [a["status"] for a in caught.value.attempts] == [500, 500, 500]
    assert progress.attempts == caught.value.attempts


@pytest.mark.asyncio
async def test_rate_limited_until_retries_run_out(server):
    server.enqueue(*[HTTPError(429, headers=FAST) for _ in range(2)])
    with pytest.raises(LLMError) as caught:
        await complete(max_retries=1)
    assert caught.value.code == LLM_RATE_LIMITED and len(server.requests) == 2


@pytest.mark.asyncio
async def test_client_errors_are_not_retried(server):
    server.enqueue(HTTPError(401))
    with pytest.raises(LLMError) as caught:
        await complete()
    assert caught.value.code == LLM_REJECTED and len(server.requests) == 1


@pytest.mark.asyncio
async def test_provider_may_forbid_a_retry(server):
    server.enqueue(HTTPError(500, headers={"x-should-retry": "false"}))
    with pytest.raises(LLMError) as caught:
        await complete()
    assert caught.value.code == LLM_UNAVAILABLE and len(server.requests) == 1


@pytest.mark.asyncio
async def test_malformed_chunk_after_output_is_a_bad_response_and_not_retried(server):
    server.enqueue(Stream(chunks=[*text_chunks("Partial answer", 1), "{not json"]))
    on_text = Pieces()
    with pytest.raises(LLMError) as caught:
        await complete(on_text=on_text)
    assert caught.value.code == LLM_BAD_RESPONSE and len(server.requests) == 1
    assert on_text.pieces == ["Partial answer"]


@pytest.mark.asyncio
async def test_error_event_inside_the_stream_is_a_bad_response(server):
    server.enqueue(
        Stream(chunks=[*text_chunks("x", 1), {"error": {"message": "overloaded", "type": "server"}}])
    )
    with pytest.raises(LLMError) as caught:
        await complete()
    assert caught.value.code == LLM_BAD_RESPONSE and "overloaded" not in caught.value.message


@pytest.mark.asyncio
async def test_empty_stream_is_a_bad_response(server):
    server.enqueue(Stream(chunks=[]))
    with pytest.raises(LLMError) as caught:
        await complete()
    assert caught.value.code == LLM_BAD_RESPONSE


@pytest.mark.asyncio
async def test_stream_stalling_past_the_timeout_after_output_is_not_retried(server):
    server.enqueue(Stall(3, after_chunks=text_chunks("Half an ans", 1)))
    progress = StreamProgress()
    with pytest.raises(LLMError) as caught:
        await complete(progress=progress)
    assert caught.value.code == LLM_TIMEOUT and len(server.requests) == 1
    assert progress.text_value == "Half an ans"  # what arrived stays available for the step record
    assert caught.value.attempts[0]["error"] == "APITimeoutError"


@pytest.mark.asyncio
async def test_stall_before_any_data_is_retried_then_times_out(server):
    server.enqueue(Stall(3), Stall(3, send_headers=False))
    with pytest.raises(LLMError) as caught:
        await complete(max_retries=1)
    assert caught.value.code == LLM_TIMEOUT and len(server.requests) == 2
    assert [a["error"] for a in caught.value.attempts] == ["APITimeoutError", "APITimeoutError"]


@pytest.mark.asyncio
async def test_connection_reset_mid_stream_is_unavailable_and_not_retried(server):
    server.enqueue(Reset(after_chunks=text_chunks("abc", 1)))
    with pytest.raises(LLMError) as caught:
        await complete()
    assert caught.value.code == LLM_UNAVAILABLE and len(server.requests) == 1


@pytest.mark.asyncio
async def test_connection_reset_before_the_response_is_retried(server):
    server.enqueue(Reset(send_headers=False), stream_answer("recovered"))
    result = await complete()
    assert result.text == "recovered" and result.attempts[0]["error"] == "APIConnectionError"


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
@pytest.mark.asyncio
async def test_a_refused_connection_is_unavailable_not_a_timeout(settings, transport):
    """Nothing listens on the port: a connection error on every attempt (LLM_UNAVAILABLE), as the attempts
    record it. The SDK's aiohttp transport reports it as a connect timeout; `llm._unmasked` reads the
    aiohttp error underneath."""
    import socket

    with socket.socket() as probe:  # a port that was free a moment ago and has no listener
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings.LLM_HTTP_CLIENT = transport
    settings.LLM_BASE_URL = f"http://127.0.0.1:{port}/v1"
    settings.LLM_API_KEY = "sk-test"
    settings.LLM_TIMEOUT_SECONDS = 2
    with pytest.raises(LLMError) as caught:
        await complete(max_retries=1)
    assert caught.value.code == LLM_UNAVAILABLE
    assert [a["error"] for a in caught.value.attempts] == ["APIConnectionError", "APIConnectionError"]


def test_an_http_client_the_sdk_does_not_have_stops_the_server(settings):
    from agent.checks import check_llm_http_client

    for value in ("aiohttp", "httpx", " HTTPX "):
        settings.LLM_HTTP_CLIENT = value
        assert check_llm_http_client() == []
    settings.LLM_HTTP_CLIENT = "requests"
    [error] = check_llm_http_client()
    assert error.id == "diagnosis.E005" and "'requests'" in error.msg


def test_parse_json_object_finds_the_object_in_prose_and_fences():
    assert parse_json_object('```json\n{"a": 1}\n```') == {"a": 1}
    assert parse_json_object('Sure: {"intent": "KNOWLEDGE"} done') == {"intent": "KNOWLEDGE"}
    assert parse_json_object('{broken {"b": 2}') == {"b": 2}
    assert parse_json_object("no json") is None and parse_json_object(None) is None


@pytest.mark.asyncio
async def test_a_serving_process_builds_its_model_client_before_the_first_call(server, settings):
    """`warm_client` (called by `supervisor.start_serving`) builds the loop's SDK client, TLS context and
    all, before anything is served; the first model call then uses that client. The demo provider and a
    configuration the client cannot be built from build nothing and raise nothing."""
    from agent.runtime import llm

    def built_here() -> list:
        """This loop's clients (an entry of a closed loop that had the same id does not count)."""
        loop = asyncio.get_running_loop()
        entry = llm._sdk_clients.get(id(loop))
        return list(entry[1].values()) if entry is not None and entry[0] is loop else []

    transport = settings.LLM_HTTP_CLIENT
    settings.LLM_PROVIDER = "demo"
    llm.warm_client()
    assert not built_here()

    settings.LLM_PROVIDER = "openai"
    settings.LLM_HTTP_CLIENT = "no-such-client"
    llm.warm_client()  # logged by class, left to the first call
    assert not built_here()

    settings.LLM_HTTP_CLIENT = transport
    llm.warm_client()
    (built,) = built_here()
    server.enqueue(stream_answer("ok", usage=usage(3, 1)))
    try:
        await OpenAIModelClient(max_retries=0).complete(
            model="m", messages=[{"role": "user", "content": "q"}]
        )
        assert llm._sdk_client() is built
    finally:
        await aclose_clients()
