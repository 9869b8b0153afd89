"""Streamed chunks as JSON views (agent/runtime/lean_chunks.py) fold into exactly what the SDK's own
models folded into: the same text, reasoning and its source key, tool calls, finish reason and usage,
for every shape the providers send (content, tool-call fragments, each reasoning field, structured
reasoning blocks, usage with and without details, a chunk without choices). And the runtime's client
really hands out views while the SDK still raises a stream's `error` object."""

from __future__ import annotations

import asyncio

import openai
import pytest
from openai._models import construct_type
from openai.types.chat import ChatCompletionChunk

from agent.runtime.lean_chunks import ChunkView, LeanChunkClient
from agent.runtime.llm import StreamAssembler, StreamProgress, usage_from
from tests.fakes.openai_server import FakeLLMServer, Stream, text_chunks


def _chunk(delta=None, *, finish=None, usage=None, choices=True, **extra):
    body = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", **extra}
    body["choices"] = [{"index": 0, "delta": delta or {}, "finish_reason": finish}] if choices else []
    if usage is not None:
        body["usage"] = usage
    return body


STREAMS = {
    "text": [
        _chunk({"role": "assistant", "content": "Check "}),
        _chunk({"content": "the replica."}, finish="stop"),
    ],
    "reasoning_content attribute": [
        _chunk({"reasoning_content": "First, "}),
        _chunk({"reasoning_content": "\n\n"}),
        _chunk({"reasoning_content": "the lag."}),
        _chunk({"content": "Lag."}, finish="stop"),
    ],
    "reasoning extra": [_chunk({"reasoning": "think"}), _chunk({"content": "ok"}, finish="stop")],
    "thinking blocks": [
        _chunk({"thinking": [{"type": "thinking", "thinking": "step one"}, {"text": " two"}]}),
        _chunk({"content": "done"}, finish="stop"),
    ],
    "tool calls": [
        _chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "call_a", "type": "function", "function": {"name": "lookup_"}}
                ]
            }
        ),
        _chunk({"tool_calls": [{"index": 0, "function": {"name": "lookup_knowledge", "arguments": '{"q'}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '": "lag"}'}}]}),
        _chunk({"tool_calls": [{"index": 1, "function": {"name": "query_metrics", "arguments": "{}"}}]}),
        _chunk({}, finish="tool_calls"),
    ],
    "usage with details, then no choices": [
        _chunk({"content": "x"}, finish="stop"),
        _chunk(
            choices=False,
            usage={
                "prompt_tokens": 10,
                "completion_tokens": 5,
                "total_tokens": 15,
                "completion_tokens_details": {"reasoning_tokens": 3},
                "prompt_tokens_details": {"cached_tokens": 4},
            },
        ),
    ],
    "usage without a total": [
        _chunk({"content": "x"}, finish="stop", usage={"prompt_tokens": 7, "completion_tokens": 2}),
    ],
    "a stray second choice and a non-text content": [
        {
            **_chunk({"content": "kept"}),
            "choices": [
                {"index": 0, "delta": {"content": "kept"}, "finish_reason": None},
                {"index": 1, "delta": {"content": "ignored"}, "finish_reason": "stop"},
            ],
        },
        _chunk({"content": ["not", "text"]}, finish="length"),
    ],
}


def _fold(chunks):
    progress = StreamProgress()
    assembler = StreamAssembler(progress)
    pieces = [assembler.feed(c) for c in chunks]
    return {
        "pieces": pieces,
        "text": progress.text_value,
        "reasoning": progress.reasoning_value,
        "reasoning_key": progress.reasoning_key,
        "tool_calls": assembler.tool_calls(),
        "finish": assembler.finish_reason,
        "usage": usage_from(assembler.usage_obj),
    }


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_views_fold_into_what_the_sdks_models_fold_into(name):
    raw = STREAMS[name]
    models = [construct_type(value=c, type_=ChatCompletionChunk) for c in raw]
    assert _fold([ChunkView(c) for c in raw]) == _fold(models)


def test_model_extra_holds_what_the_sdk_does_not_declare():
    delta = ChunkView(_chunk({"content": "a", "reasoning": "r", "role": "assistant"})).choices[0].delta
    sdk = construct_type(
        value=_chunk({"content": "a", "reasoning": "r", "role": "assistant"}), type_=ChatCompletionChunk
    )
    assert delta.model_extra == sdk.choices[0].delta.model_extra == {"reasoning": "r"}
    assert repr(delta) == "<ChunkView delta keys=['content', 'reasoning', 'role']>"  # keys, never values


def test_the_runtimes_client_hands_out_views_and_the_sdk_still_raises_a_streamed_error():
    ok = Stream(chunks=[*text_chunks("fine", 1)], usage={"prompt_tokens": 1, "completion_tokens": 1})
    failing = Stream(chunks=[{"error": {"message": "overloaded", "type": "server_error"}}])

    async def read(server):
        client = LeanChunkClient(base_url=server.base_url, api_key="k", max_retries=0)
        try:
            stream = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "q"}], stream=True
            )
            got = [chunk async for chunk in stream]
            with pytest.raises(openai.APIError, match="overloaded"):
                stream = await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "q"}], stream=True
                )
                async for _ in stream:
                    pass
            return got
        finally:
            await client.close()

    with FakeLLMServer() as server:
        server.enqueue(ok, failing)
        got = asyncio.run(read(server))
    assert got and all(isinstance(c, ChunkView) for c in got)
    assert "".join(c.choices[0].delta.content or "" for c in got if c.choices) == "fine"


# Headers that differ between any two requests whatever sent them.
_PER_REQUEST_HEADERS = {"content-length", "x-stainless-retry-count", "x-stainless-read-timeout"}


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("runtime_pools")
def test_the_runtime_posts_exactly_what_the_sdks_create_would_send(llm, corpus, user, settings):
    """`LeanChunkClient.stream_chat` skips the SDK's typed transform of the body: on every request of a
    real run (router, the agent's tool step and answer, the semantic guard) the transform would have
    returned the very body sent, and `create(**body)` sends the same path and headers."""
    from openai._utils import async_maybe_transform
    from openai.types.chat.completion_create_params import CompletionCreateParamsStreaming

    from tests.agent.runtime.support import AGENT, ask, script_reasoned_diagnosis

    script_reasoned_diagnosis(llm)
    _run, outcome, _ = ask(user, "Disk full on /var/log")
    assert outcome.release_decision == "PUBLISHED"
    sent = [r for requests in llm.requests.values() for r in requests]
    assert len(sent) == 4 and any(r.json.get("tools") for r in sent)  # the agent's calls offer tools
    for request in sent:
        assert (
            asyncio.run(async_maybe_transform(request.json, CompletionCreateParamsStreaming)) == request.json
        )

    tool_step = llm.requests[AGENT][0]

    async def through_create():
        client = LeanChunkClient(base_url=settings.LLM_BASE_URL, api_key=settings.LLM_API_KEY, max_retries=0)
        try:
            stream = await client.chat.completions.create(**tool_step.json)
            [_ async for _ in stream]
        finally:
            await client.close()

    llm.add(AGENT, Stream(chunks=[*text_chunks("again", 1)]))
    asyncio.run(through_create())
    again = llm.requests[AGENT][-1]
    assert again.path == tool_step.path and again.json == tool_step.json

    def headers(request):
        return {k: v for k, v in request.headers.items() if k not in _PER_REQUEST_HEADERS}

    assert headers(again) == headers(tool_step)
