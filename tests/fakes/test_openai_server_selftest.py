"""Self-test of the fake OpenAI-compatible server, driven by the real ``openai`` SDK.

Nothing is patched: ``OpenAI`` / ``AsyncOpenAI`` talk HTTP to ``FakeLLMServer``
on 127.0.0.1.  Run with (``-s`` shows the measured timings)::

    .venv/bin/python -m pytest tests/fakes -p no:django -q -s

(add ``--noconftest`` while ``tests/conftest.py`` needs Django, or run it with
pytest-django and ``DJANGO_SETTINGS_MODULE`` set -- these tests need neither).
Fixtures are named ``llm_server`` / ``sdk_client`` so they do not shadow
pytest-django's ``client``.  Timing bounds are loose on purpose: the suite may
run on a busy CI machine.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import openai
import pytest

from .openai_server import (
    Completion,
    FakeLLMServer,
    HTTPError,
    Raw,
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
)

FAST_RETRY = {"retry-after-ms": "1"}  # see module docstring: retry-after: 0 is NOT immediate
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture
def llm_server():
    with FakeLLMServer() as srv:
        yield srv
        assert srv.errors == [], srv.errors


@pytest.fixture
def sdk_client(llm_server):
    with openai.OpenAI(base_url=llm_server.base_url, api_key="sk-test", max_retries=0) as c:
        yield c


def _text(chunks) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


# --------------------------------------------------------------------------- streaming basics


def test_stream_text_sync(llm_server, sdk_client):
    llm_server.enqueue(stream_answer("Hello, 世界! How are you?", usage=None))
    chunks = list(sdk_client.chat.completions.create(model="gpt-test", messages=USER, stream=True))
    assert _text(chunks) == "Hello, 世界! How are you?"
    assert all(c.model == "gpt-test" for c in chunks)  # model echoes the request
    assert len({c.id for c in chunks}) == 1  # one id per response
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.choices[0].delta.role is None for c in chunks[1:])
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(c.usage is None for c in chunks)
    req = llm_server.requests[0]
    assert (req.method, req.path, req.stream, req.model) == ("POST", "/v1/chat/completions", True, "gpt-test")
    assert req.headers["authorization"] == "Bearer sk-test"
    assert req.headers["content-type"] == "application/json"
    assert req.messages == USER


@pytest.mark.asyncio
async def test_reasoning_async(llm_server):
    llm_server.enqueue(
        stream_answer("The answer is 4.", reasoning="2+2 means adding two and two."),
        Stream(reasoning_chunks("thinking...", 2, field="reasoning") + text_chunks("ok", role=False)),
    )
    async with openai.AsyncOpenAI(base_url=llm_server.base_url, api_key="k", max_retries=0) as ac:
        stream = await ac.chat.completions.create(model="deepseek-reasoner", messages=USER, stream=True)
        reasoning, text = "", ""
        async for chunk in stream:
            delta = chunk.choices[0].delta
            reasoning += getattr(delta, "reasoning_content", None) or ""
            text += delta.content or ""
            if getattr(delta, "reasoning_content", None):
                assert delta.content is None
                assert delta.model_extra["reasoning_content"] == delta.reasoning_content
        assert reasoning == "2+2 means adding two and two."
        assert text == "The answer is 4."

        # Another field name (OpenRouter/vLLM style "reasoning")
        stream = await ac.chat.completions.create(model="other", messages=USER, stream=True)
        chunks = [c async for c in stream]
        assert (
            "".join((c.choices[0].delta.model_extra or {}).get("reasoning") or "" for c in chunks)
            == "thinking..."
        )
        assert _text(chunks) == "ok"


def test_reasoning_sent_back_is_recorded(llm_server, sdk_client):
    """Tests can assert what the product sends back (e.g. DeepSeek reasoning_content)."""
    llm_server.handler = lambda req: Completion({"content": f"turns={len(req.messages)}"})
    history = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
        {"role": "user", "content": "q2"},
    ]
    out = sdk_client.chat.completions.create(model="deepseek-reasoner", messages=history)
    assert out.choices[0].message.content == "turns=3"
    sent = llm_server.requests[-1].messages
    assert sent[1]["reasoning_content"] == "r1"
    assert llm_server.requests[-1].json["model"] == "deepseek-reasoner"


# --------------------------------------------------------------------------- tool calls


def test_parallel_tool_calls_interleaved(llm_server, sdk_client):
    calls = [
        ("call_abc", "get_weather", json.dumps({"city": "Paris", "unit": "celsius"})),
        ("call_xyz", "get_time", json.dumps({"timezone": "Europe/Paris"})),
    ]
    llm_server.enqueue(stream_tool_calls(calls, reasoning="need two tools", usage=usage(20, 10)))
    tools = [
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
    ]
    stream = sdk_client.chat.completions.create(
        model="gpt-test", messages=USER, tools=tools, stream=True, stream_options={"include_usage": True}
    )
    assembled: dict[int, dict] = {}
    order, finish = [], None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        for tc in choice.delta.tool_calls or []:
            order.append(tc.index)
            slot = assembled.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
            if tc.id:
                assert slot["id"] is None, "id must only come with the first delta of a call"
                slot["id"] = tc.id
                assert tc.type == "function"
            if tc.function and tc.function.name:
                slot["name"] = tc.function.name
            if tc.function and tc.function.arguments:
                slot["arguments"] += tc.function.arguments
    assert order == [0, 1, 0, 1, 0, 1]  # interleaved fragments
    assert finish == "tool_calls"
    assert assembled[0] == {"id": "call_abc", "name": "get_weather", "arguments": calls[0][2]}
    assert assembled[1] == {"id": "call_xyz", "name": "get_time", "arguments": calls[1][2]}
    assert json.loads(assembled[0]["arguments"]) == {"city": "Paris", "unit": "celsius"}
    assert llm_server.requests[0].tools == tools


def test_tool_call_chunk_shape():
    chunks = tool_call_chunks([("a", "f", '{"x": 1}'), ("b", "g", '{"y": 2}')], fragments=2, interleave=False)
    tcs = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks]
    assert [t["index"] for t in tcs] == [0, 0, 1, 1]
    assert tcs[0] == {
        "index": 0,
        "id": "a",
        "type": "function",
        "function": {"name": "f", "arguments": '{"x"'},
    }
    assert tcs[1] == {"index": 0, "function": {"arguments": ": 1}"}}
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    for c in chunks:
        assert set(c) == {"id", "object", "created", "model", "choices"}
        assert set(c["choices"][0]) == {"index", "delta", "finish_reason", "logprobs"}
    assert finish_chunk("length")["choices"][0] == {
        "index": 0,
        "delta": {},
        "finish_reason": "length",
        "logprobs": None,
    }


# --------------------------------------------------------------------------- usage


def test_usage_only_final_chunk(llm_server, sdk_client):
    u = usage(100, 40, reasoning=30, cached=64, style="deepseek")
    assert u == {
        "prompt_tokens": 100,
        "completion_tokens": 40,
        "total_tokens": 140,
        "prompt_tokens_details": {"cached_tokens": 64},
        "prompt_cache_hit_tokens": 64,
        "prompt_cache_miss_tokens": 36,
        "completion_tokens_details": {"reasoning_tokens": 30},
    }
    llm_server.enqueue(stream_answer("hi there", reasoning="hmm", usage=u))
    chunks = list(
        sdk_client.chat.completions.create(
            model="deepseek-chat", messages=USER, stream=True, stream_options={"include_usage": True}
        )
    )
    assert llm_server.requests[0].include_usage is True
    assert llm_server.requests[0].json["stream_options"] == {"include_usage": True}
    last = chunks[-1]
    assert last.choices == []
    assert last.usage.prompt_tokens == 100 and last.usage.total_tokens == 140
    assert last.usage.completion_tokens_details.reasoning_tokens == 30
    assert last.usage.prompt_tokens_details.cached_tokens == 64
    assert last.usage.model_extra["prompt_cache_hit_tokens"] == 64
    assert all(c.usage is None for c in chunks[:-1])
    assert usage(10, 5, reasoning=2, cached=3) == {
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "total_tokens": 15,
        "prompt_tokens_details": {"cached_tokens": 3},
        "completion_tokens_details": {"reasoning_tokens": 2},
    }


def test_no_usage(llm_server, sdk_client):
    llm_server.enqueue(
        stream_answer("no usage here"),
        # usage_if_requested mimics the real API: not sent because not asked for
        Stream([*text_chunks("x"), finish_chunk("stop")], usage=usage(1, 1), usage_if_requested=True),
    )
    for _ in range(2):
        chunks = list(sdk_client.chat.completions.create(model="m", messages=USER, stream=True))
        assert all(c.usage is None for c in chunks)
        assert all(c.choices for c in chunks)
        assert llm_server.requests[-1].include_usage is False


# --------------------------------------------------------------------------- errors & retries


def test_429_then_success_with_sdk_retries(llm_server):
    llm_server.enqueue(HTTPError(429, headers=FAST_RETRY), stream_answer("after retry"))
    with openai.OpenAI(base_url=llm_server.base_url, api_key="k", max_retries=2) as c:
        chunks = list(c.chat.completions.create(model="m", messages=USER, stream=True))
    assert _text(chunks) == "after retry"
    assert len(llm_server.requests) == 2
    assert [r.headers.get("x-stainless-retry-count") for r in llm_server.requests] == ["0", "1"]


def test_429_without_retries_raises_rate_limit(llm_server, sdk_client):
    llm_server.enqueue(HTTPError(429, headers={"retry-after": "0"}))
    with pytest.raises(openai.RateLimitError) as info:
        sdk_client.chat.completions.create(model="m", messages=USER)
    assert info.value.status_code == 429
    assert info.value.body["type"] == "rate_limit_exceeded"  # OpenAI error shape
    assert info.value.response.headers["retry-after"] == "0"


@pytest.mark.asyncio
async def test_retry_after_zero_is_not_immediate(llm_server):
    """SDK behaviour: retry-after: 0 falls back to exponential backoff (~0.375-0.5 s)."""
    llm_server.enqueue(HTTPError(503, headers={"retry-after": "0"}), Completion({"content": "ok"}))
    async with openai.AsyncOpenAI(base_url=llm_server.base_url, api_key="k", max_retries=1) as ac:
        t0 = time.perf_counter()
        out = await ac.chat.completions.create(model="m", messages=USER)
        elapsed = time.perf_counter() - t0
    assert out.choices[0].message.content == "ok"
    assert elapsed > 0.3, elapsed


def test_500_until_retries_exhausted(llm_server):
    llm_server.enqueue(*[HTTPError(500, headers=FAST_RETRY) for _ in range(3)])
    with (
        openai.OpenAI(base_url=llm_server.base_url, api_key="k", max_retries=2) as c,
        pytest.raises(openai.InternalServerError) as info,
    ):
        c.chat.completions.create(model="m", messages=USER, stream=True)
    assert info.value.status_code == 500
    assert len(llm_server.requests) == 3
    assert llm_server.pending == 0


def test_http_error_custom_bodies(llm_server, sdk_client):
    llm_server.enqueue(
        HTTPError(
            400,
            {
                "error": {
                    "message": "bad tools",
                    "type": "invalid_request_error",
                    "param": "tools",
                    "code": None,
                }
            },
        ),
        HTTPError(502, "<html>bad gateway</html>", headers={"x-should-retry": "false"}),
    )
    with pytest.raises(openai.BadRequestError, match="bad tools"):
        sdk_client.chat.completions.create(model="m", messages=USER)
    with pytest.raises(openai.InternalServerError) as info:
        sdk_client.chat.completions.create(model="m", messages=USER)
    assert info.value.response.text == "<html>bad gateway</html>"


# --------------------------------------------------------------------------- broken streams


def test_malformed_chunk_sync(llm_server, sdk_client):
    llm_server.enqueue(Stream([*text_chunks("ok", 1), '{"id": "x", "choices": [ BROKEN']))
    got = []
    with pytest.raises(json.JSONDecodeError):
        for chunk in sdk_client.chat.completions.create(model="m", messages=USER, stream=True):
            got.append(chunk)
    assert _text(got) == "ok"  # chunks before the bad one are delivered


@pytest.mark.asyncio
async def test_malformed_chunk_async(llm_server):
    llm_server.enqueue(Stream([*text_chunks("ok", 1), b"not json at all"]))
    async with openai.AsyncOpenAI(base_url=llm_server.base_url, api_key="k", max_retries=0) as ac:
        got = []
        with pytest.raises(json.JSONDecodeError):
            async for chunk in await ac.chat.completions.create(model="m", messages=USER, stream=True):
                got.append(chunk)
    assert _text(got) == "ok"


def test_error_event_in_stream_raises_api_error(llm_server, sdk_client):
    llm_server.enqueue(
        Stream(
            [*text_chunks("par", 1), {"error": {"message": "overloaded mid-stream", "type": "server_error"}}]
        )
    )
    with pytest.raises(openai.APIError, match="overloaded mid-stream") as info:
        list(sdk_client.chat.completions.create(model="m", messages=USER, stream=True))
    assert type(info.value) is openai.APIError


def test_stream_without_done_and_raw_comment(llm_server, sdk_client):
    llm_server.enqueue(Stream([Raw(b": keep-alive\n\n"), *text_chunks("abc")], done=False))
    chunks = list(sdk_client.chat.completions.create(model="m", messages=USER, stream=True))
    assert _text(chunks) == "abc"  # the SDK ends quietly when the body ends without [DONE]


def test_stall_raises_timeout_sync(llm_server, sdk_client):
    llm_server.enqueue(Stall(5.0, after_chunks=text_chunks("partial", 2)))
    got = []
    t0 = time.perf_counter()
    with pytest.raises(openai.APITimeoutError):
        for chunk in sdk_client.chat.completions.create(model="m", messages=USER, stream=True, timeout=0.5):
            got.append(chunk)
    elapsed = time.perf_counter() - t0
    print(f"\nstall: APITimeoutError after {elapsed:.3f}s")
    assert 0.4 < elapsed < 3.0  # stall is 5 s
    assert _text(got) == "partial"
    assert len(llm_server.requests) == 1  # errors while iterating are never retried


@pytest.mark.asyncio
async def test_stall_raises_timeout_async(llm_server):
    llm_server.enqueue(Stall(5.0))
    async with openai.AsyncOpenAI(
        base_url=llm_server.base_url, api_key="k", max_retries=0, timeout=0.5
    ) as ac:
        t0 = time.perf_counter()
        stream = await ac.chat.completions.create(model="m", messages=USER, stream=True)
        with pytest.raises(openai.APITimeoutError) as info:
            async for _ in stream:
                pass
        assert time.perf_counter() - t0 < 3.0  # stall is 5 s
    assert type(info.value.__cause__).__name__ == "ReadTimeout"


def test_stall_before_headers_is_retried(llm_server):
    llm_server.enqueue(Stall(5.0, send_headers=False), stream_answer("second try"))
    with openai.OpenAI(base_url=llm_server.base_url, api_key="k", max_retries=1, timeout=0.3) as c:
        chunks = list(c.chat.completions.create(model="m", messages=USER, stream=True))
    assert _text(chunks) == "second try"
    assert len(llm_server.requests) == 2


def test_reset_mid_stream_sync(llm_server, sdk_client):
    llm_server.enqueue(Reset(after_chunks=text_chunks("half an ans", 3)))
    got = []
    with pytest.raises(openai.APIConnectionError) as info:
        for chunk in sdk_client.chat.completions.create(model="m", messages=USER, stream=True):
            got.append(chunk)
    assert type(info.value) is openai.APIConnectionError  # not the APITimeoutError subclass
    assert type(info.value.__cause__).__name__ == "ReadError"
    assert "reset" in str(info.value.__cause__).lower()
    assert _text(got) == "half an ans"
    assert len(llm_server.requests) == 1


@pytest.mark.asyncio
async def test_reset_mid_stream_async(llm_server):
    llm_server.enqueue(Reset(after_chunks=text_chunks("abc")))
    async with openai.AsyncOpenAI(base_url=llm_server.base_url, api_key="k", max_retries=0) as ac:
        got = []
        with pytest.raises(openai.APIConnectionError) as info:
            async for chunk in await ac.chat.completions.create(model="m", messages=USER, stream=True):
                got.append(chunk)
    assert type(info.value) is openai.APIConnectionError
    assert _text(got) == "abc"


def test_reset_before_headers_is_retried(llm_server):
    llm_server.enqueue(Reset(send_headers=False), Completion({"content": "fine"}))
    with openai.OpenAI(base_url=llm_server.base_url, api_key="k", max_retries=1) as c:
        out = c.chat.completions.create(model="m", messages=USER)
    assert out.choices[0].message.content == "fine"
    assert len(llm_server.requests) == 2


# --------------------------------------------------------------------------- scripting


def test_fifo_then_handler_then_500(llm_server, sdk_client):
    seen = []

    def handler(req):
        seen.append((req.model, req.stream, req.tools, req.messages[-1]["content"]))
        return Completion({"content": "from handler", "reasoning_content": "why"}, usage=usage(3, 2))

    llm_server.enqueue(Completion({"content": "q1"}), Completion({"content": "q2"}))
    llm_server.handler = handler
    answers = [
        sdk_client.chat.completions.create(model="m", messages=USER).choices[0].message for _ in range(3)
    ]
    assert [a.content for a in answers] == ["q1", "q2", "from handler"]
    assert answers[2].reasoning_content == "why"
    assert seen == [("m", False, None, "hi")]

    llm_server.handler = None
    with (
        openai.OpenAI(base_url=llm_server.base_url, api_key="k", max_retries=2) as c,
        pytest.raises(openai.InternalServerError, match="no scripted response"),
    ):
        c.chat.completions.create(model="m", messages=USER)
    assert len(llm_server.requests) == 4  # x-should-retry: false -> the SDK did not retry


@pytest.mark.asyncio
async def test_async_handler_and_handler_errors(llm_server):
    async def handler(req):
        await asyncio.sleep(0.01)
        if req.messages[-1]["content"] == "boom":
            raise RuntimeError("handler bug")
        return stream_answer(f"echo {req.messages[-1]['content']}")

    llm_server.handler = handler
    async with openai.AsyncOpenAI(base_url=llm_server.base_url, api_key="k", max_retries=2) as ac:
        stream = await ac.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "ping"}], stream=True
        )
        assert _text([c async for c in stream]) == "echo ping"
        with pytest.raises(openai.InternalServerError, match="handler bug"):
            await ac.chat.completions.create(model="m", messages=[{"role": "user", "content": "boom"}])
    assert len(llm_server.errors) == 1 and "RuntimeError: handler bug" in llm_server.errors[0]
    llm_server.errors.clear()


def test_enqueue_validates():
    srv = FakeLLMServer()
    with pytest.raises(TypeError):
        srv.enqueue({"not": "a response"})
    with pytest.raises(TypeError):
        Stream(chunks=text_chunks("x")[0])  # a single dict, not a list
    with pytest.raises(ValueError):
        Stall(1, after_chunks=["x"], send_headers=False)


def test_models_and_unknown_routes(llm_server, sdk_client):
    llm_server.models = ["deepseek-chat", "deepseek-reasoner"]
    assert [m.id for m in sdk_client.models.list()] == ["deepseek-chat", "deepseek-reasoner"]
    assert sdk_client.models.retrieve("deepseek-chat").id == "deepseek-chat"
    with pytest.raises(openai.NotFoundError):
        sdk_client.models.retrieve("nope")
    with pytest.raises(openai.NotFoundError):
        sdk_client.embeddings.create(model="m", input="x")
    assert [r.method for r in llm_server.requests] == ["GET", "GET", "GET", "POST"]


# --------------------------------------------------------------------------- connection behaviour


def test_keep_alive_reuses_connections(llm_server, sdk_client):
    llm_server.enqueue(*[Completion({"content": str(i)}) for i in range(3)])
    for _ in range(3):
        sdk_client.chat.completions.create(model="m", messages=USER)
    assert len({r.connection_id for r in llm_server.requests}) == 1


@pytest.mark.asyncio
async def test_keep_alive_async_streams(llm_server):
    llm_server.enqueue(*[stream_answer(f"s{i}", usage=usage(1, 1)) for i in range(3)])
    async with openai.AsyncOpenAI(base_url=llm_server.base_url, api_key="k", max_retries=0) as ac:
        for i in range(3):
            stream = await ac.chat.completions.create(
                model="m", messages=USER, stream=True, stream_options={"include_usage": True}
            )
            assert _text([c async for c in stream]) == f"s{i}"
    # the async SDK drains the body after [DONE], so the pooled connection is reused
    assert len({r.connection_id for r in llm_server.requests}) == 1


@pytest.mark.asyncio
async def test_client_disconnect_is_recorded(llm_server):
    llm_server.enqueue(Stream(text_chunks("x" * 40, 40), delay=0.02))
    async with openai.AsyncOpenAI(base_url=llm_server.base_url, api_key="k", max_retries=0) as ac:
        stream = await ac.chat.completions.create(model="m", messages=USER, stream=True)
        n = 0
        async for _ in stream:
            n += 1
            if n == 3:
                break
        await stream.close()
    req = llm_server.requests[0]
    assert await asyncio.to_thread(req.wait_finished, 2.0)
    assert req.client_disconnected is True


@pytest.mark.asyncio
async def test_200_concurrent_streams(llm_server):
    """200 concurrent streams, 10 chunks each, one chunk every 20 ms.

    The same batch is first run with no delay at all: that baseline is the
    SDK's own cost (building 200 requests, parsing 2,400 chunks with pydantic,
    sharing one GIL with the server thread).  The 20 ms pacing must add about
    0.2 s on top of it, not 200 x 0.2 s.
    """
    n_streams, n_chunks, delay = 200, 10, 0.02
    pacing = {"delay": 0.0}
    llm_server.handler = lambda req: Stream(
        text_chunks(f"<{req.messages[0]['content']}>" + "." * 20, n_chunks),
        delay=pacing["delay"],
        first_delay=pacing["delay"],
        usage=usage(5, n_chunks),
    )

    async def one(ac, i):
        stream = await ac.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": str(i)}],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
        assert chunks[-1].usage.completion_tokens == n_chunks
        return _text(chunks)

    async def batch(ac):
        llm_server.requests.clear()
        t0 = time.perf_counter()
        texts = await asyncio.gather(*(one(ac, i) for i in range(n_streams)))
        wall = time.perf_counter() - t0
        assert texts == [f"<{i}>" + "." * 20 for i in range(n_streams)]
        assert len(llm_server.requests) == n_streams
        return wall

    async with openai.AsyncOpenAI(base_url=llm_server.base_url, api_key="k", max_retries=0) as ac:
        baseline = await batch(ac)
        pacing["delay"] = delay
        wall = await batch(ac)
    assert len({r.connection_id for r in llm_server.requests}) == n_streams  # really concurrent
    per_stream = [r.finished_at - r.received_at for r in llm_server.requests]
    print(
        f"\n{n_streams} concurrent streams x {n_chunks} chunks @ {delay * 1000:.0f} ms: wall {wall:.3f}s"
        f" (same batch without delays: {baseline:.3f}s -> pacing cost {wall - baseline:.3f}s,"
        f" ideal {n_chunks * delay:.2f}s);"
        f" server-side time per stream min/max {min(per_stream):.3f}/{max(per_stream):.3f}s"
    )
    serial = n_streams * n_chunks * delay
    # generous bounds (busy CI, asyncio debug mode); serial would be 40 s
    assert wall - baseline < n_chunks * delay + 3.0, (wall, baseline)
    assert wall < 15.0, f"{wall:.2f}s (serial would be {serial:.0f}s)"


# --------------------------------------------------------------------------- lifecycle


def _port_accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_start_stop_clean_even_during_stall():
    before = {t for t in threading.enumerate() if t.name == "FakeLLMServer"}
    srv = FakeLLMServer().start()
    port = srv.port
    assert srv.base_url == f"http://127.0.0.1:{port}/v1"
    assert _port_accepts(port)
    srv.enqueue(Stall(30.0))
    c = openai.OpenAI(base_url=srv.base_url, api_key="k", max_retries=0, timeout=10)
    errors = []

    def consume():
        try:
            list(c.chat.completions.create(model="m", messages=USER, stream=True))
        except Exception as e:  # the stop() closes the stalled connection
            errors.append(e)

    t = threading.Thread(target=consume)
    t.start()
    srv.wait_for_requests(1)
    time.sleep(0.1)
    t0 = time.perf_counter()
    srv.stop()
    assert time.perf_counter() - t0 < 3.0
    t.join(5)
    assert not t.is_alive()
    c.close()
    assert errors and isinstance(errors[0], openai.APIConnectionError)
    assert {t for t in threading.enumerate() if t.name == "FakeLLMServer"} == before
    assert not _port_accepts(port)
    # the port can be bound again
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
    srv.stop()  # idempotent
    with FakeLLMServer() as again:  # context manager
        assert _port_accepts(again.port)


# --------------------------------------------------------------------------- raw HTTP/1.1


def _recv_until_closed(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_raw_http11_pipelining_chunked_body_and_bad_request(llm_server):
    llm_server.enqueue(Completion({"content": "one"}), stream_answer("two", pieces=1))
    body = json.dumps({"model": "raw", "messages": USER}).encode()
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    with socket.create_connection(("127.0.0.1", llm_server.port), timeout=5) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s"
            % (len(body), body)
            + b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
            b"Connection: close\r\n\r\n" + chunked
        )
        raw = _recv_until_closed(s)
    first, _, rest = raw.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 200 OK") and b"connection: keep-alive" in first
    length = int(next(h for h in first.split(b"\r\n") if h.startswith(b"content-length")).split(b":")[1])
    assert json.loads(rest[:length])["choices"][0]["message"]["content"] == "one"
    second = rest[length:]
    assert second.startswith(b"HTTP/1.1 200 OK")
    assert b"transfer-encoding: chunked" in second and b"connection: close" in second
    assert b'"content": "two"' in second and second.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
    assert [r.connection_id for r in llm_server.requests] == [1, 1]
    assert llm_server.requests[1].json == json.loads(body)

    with socket.create_connection(("127.0.0.1", llm_server.port), timeout=5) as s:
        s.sendall(b"NONSENSE\r\n\r\n")
        assert _recv_until_closed(s).startswith(b"HTTP/1.1 400 Bad Request")
