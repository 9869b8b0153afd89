"""A local, scriptable OpenAI-compatible HTTP server for tests.

Tests drive the *real* ``openai`` SDK (``OpenAI`` / ``AsyncOpenAI``) against
this server instead of patching the SDK.  The server runs an asyncio event
loop in its own daemon thread, listens on ``127.0.0.1`` on an OS-chosen port,
speaks HTTP/1.1 with keep-alive (the SDK pools connections through httpx) and
streams Server-Sent Events with chunked transfer encoding.  It uses the
standard library only.

Endpoints
    ``POST <anything>/chat/completions``  scripted, streaming or not
    ``GET  <anything>/models``            lists :attr:`FakeLLMServer.models`
    ``GET  <anything>/models/<id>``       one model, or 404
    anything else                         404 in OpenAI's error shape

Every request (all endpoints) is recorded in :attr:`FakeLLMServer.requests`
as a :class:`RecordedRequest`.

Scripting chat completions (both can be used together):

* ``server.enqueue(*responses)`` -- a FIFO queue, one response per request;
* ``server.handler = fn`` -- ``fn(request) -> response`` (may also be an
  ``async def``), consulted only when the queue is empty.

If neither yields a response the server answers HTTP 500 with an explanatory
JSON error and ``x-should-retry: false`` (so the SDK does not retry it).

Response kinds: :class:`Stream`, :class:`Completion`, :class:`HTTPError`,
:class:`Stall`, :class:`Reset`.  Chunk builders: :func:`text_chunks`,
:func:`reasoning_chunks`, :func:`tool_call_chunks`, :func:`finish_chunk`,
:func:`usage`, and the shortcuts :func:`stream_answer` /
:func:`stream_tool_calls`.

Example::

    from openai import OpenAI
    from tests.fakes.openai_server import (
        FakeLLMServer, HTTPError, stream_answer, usage,
    )

    with FakeLLMServer() as server:
        server.enqueue(
            HTTPError(429, headers={"retry-after-ms": "1"}),
            stream_answer("Hello!", reasoning="Greet.", usage=usage(5, 7, reasoning=3)),
        )
        client = OpenAI(base_url=server.base_url, api_key="test", max_retries=2)
        stream = client.chat.completions.create(
            model="deepseek-reasoner",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text == "Hello!"
        assert len(server.requests) == 2                      # 429 + success
        assert server.requests[-1].include_usage is True

A pytest fixture is a three-liner (name it ``llm_server`` or similar, not
``client``/``server``, to avoid clashing with pytest-django fixtures)::

    @pytest.fixture
    def llm_server():
        with FakeLLMServer() as server:
            yield server
            assert server.errors == []   # handler crashes / server bugs

SDK behaviour worth knowing (openai-python, httpx transport):

* ``retry-after: 0`` does **not** make the SDK retry immediately: it only
  honours positive values and otherwise backs off 0.5 s, 1 s, ...  Use
  ``headers={"retry-after-ms": "1"}`` (or ``retry-after: 0.001``) for fast
  retries in tests.  The SDK retries 408/409/429/5xx and connection errors,
  and always obeys ``x-should-retry: true|false``.
* A client timeout or a reset *before* the response headers is retried by the
  SDK (use ``Stall(..., send_headers=False)`` / ``Reset(send_headers=False)``);
  once headers were received the stream object is returned and errors while
  iterating are raised from the iteration without any retry:
  a stall raises ``openai.APITimeoutError`` (cause ``httpx2.ReadTimeout``),
  a reset raises ``openai.APIConnectionError`` (cause ``httpx2.ReadError``;
  note ``APITimeoutError`` is a subclass of ``APIConnectionError``).
* A chunk that is not valid JSON makes the iteration raise a bare
  ``json.JSONDecodeError`` (not an ``openai`` exception); the chunks before it
  are delivered.  A chunk ``{"error": {...}}`` raises ``openai.APIError``.
  A body that ends without ``data: [DONE]`` ends the iteration silently.
* The async client drains the body after ``[DONE]`` and reuses the pooled
  connection; the sync client closes the connection after a stream (it does
  not read the terminating chunk), non-stream calls reuse it.  Check with
  :attr:`RecordedRequest.connection_id`.
* This openai version sends ``x-stainless-retry-count`` (``"0"``, ``"1"``...)
  on every attempt, handy to assert retries from ``server.requests``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import email.utils
import inspect
import itertools
import json
import socket
import struct
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Completion",
    "FakeLLMServer",
    "HTTPError",
    "Handler",
    "Raw",
    "RecordedRequest",
    "Reset",
    "Response",
    "Stall",
    "Stream",
    "finish_chunk",
    "reasoning_chunks",
    "serving",
    "stream_answer",
    "stream_tool_calls",
    "text_chunks",
    "tool_call_chunks",
    "usage",
    "usage_chunk",
]


# --------------------------------------------------------------------------
# Response kinds
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Raw:
    """A stream item written to the socket verbatim, without SSE framing.

    Use it for SSE comments (``Raw(b": keep-alive\\n\\n")``), ``event:`` lines
    or deliberately broken framing.  The bytes are sent as one HTTP chunk.
    """

    data: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.data, (bytes, bytearray)):
            raise TypeError("Raw.data must be bytes")


# A stream item: a chunk dict (JSON-encoded), str/bytes (sent verbatim as the
# SSE data payload), or Raw (sent verbatim without framing).
Chunk = dict | str | bytes | Raw


def _check_chunks(chunks: Any, owner: str) -> list:
    if isinstance(chunks, (dict, str, bytes, Raw)):
        raise TypeError(f"{owner}: chunks must be a list, got a single {type(chunks).__name__}")
    chunks = list(chunks)
    for item in chunks:
        if not isinstance(item, (dict, str, bytes, bytearray, Raw)):
            raise TypeError(f"{owner}: unsupported chunk type {type(item).__name__}: {item!r}")
    return chunks


@dataclass
class Stream:
    """A streamed (SSE) chat completion.

    Contract: the server answers ``200`` with ``content-type:
    text/event-stream`` right away (chunked transfer encoding, keep-alive),
    waits ``first_delay`` seconds, then sends each item of ``chunks`` as one
    SSE event, waiting ``delay`` seconds before every following event:

    * ``dict`` -> ``data: <json>\\n\\n``.  Top-level ``id``, ``model`` and
      ``created`` keys whose value is ``None`` are filled in at send time with
      a per-response id (shared by all chunks of the response), the request's
      ``model`` and the current time.  All builders in this module produce
      ``id=None`` and ``model=None``, so chunks carry the request's model.
    * ``str`` / ``bytes`` -> ``data: <payload>\\n\\n`` verbatim (to send
      malformed JSON, for example).
    * :class:`Raw` -> written verbatim without any framing.

    With ``paced_events`` set, only the first ``paced_events`` events wait
    (``first_delay``, then ``delay``); every later one (the rest of ``chunks``,
    the usage chunk) follows the one before at once, as a real provider sends
    its finish reason and usage right after the last token.

    Then, if ``usage`` is given, a final ``chat.completion.chunk`` with
    ``"choices": []`` and that usage (as OpenAI does when
    ``stream_options.include_usage`` is set).  With
    ``usage_if_requested=True`` that usage chunk is only sent when the
    request actually asked for it (``stream_options.include_usage``), which
    mimics the real API.  Finally ``data: [DONE]`` unless ``done=False``.
    The HTTP body is then terminated properly, so the connection is reused.

    ``headers`` adds response headers.  If the client disconnects, the
    stream stops and :attr:`RecordedRequest.client_disconnected` is set.
    """

    chunks: list = field(default_factory=list)
    delay: float = 0.0
    first_delay: float = 0.0
    usage: dict | None = None
    done: bool = True
    usage_if_requested: bool = False
    headers: dict | None = None
    paced_events: int | None = None

    def __post_init__(self) -> None:
        self.chunks = _check_chunks(self.chunks, "Stream")


@dataclass
class Completion:
    """A non-streamed ``chat.completion`` JSON response (HTTP 200).

    ``message`` is the assistant message (``role`` defaults to
    ``"assistant"``; add ``reasoning_content`` / ``tool_calls`` as needed).
    The body is ``{"id", "object": "chat.completion", "created", "model",
    "choices": [{"index": 0, "message", "finish_reason", "logprobs": None}],
    "usage"}`` where ``model`` is the request's model.  ``usage`` is omitted
    from the body when ``None``.  ``delay`` waits before answering (the
    whole response, headers included, is sent after the delay).
    """

    message: dict
    finish_reason: str | None = "stop"
    usage: dict | None = None
    delay: float = 0.0
    headers: dict | None = None


_ERROR_TYPES = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("permission_error", None),
    404: ("invalid_request_error", "not_found"),
    408: ("timeout", None),
    409: ("conflict", None),
    422: ("invalid_request_error", None),
    429: ("rate_limit_exceeded", "rate_limit_exceeded"),
    500: ("server_error", None),
    502: ("server_error", "bad_gateway"),
    503: ("service_unavailable", "overloaded"),
    504: ("server_error", "gateway_timeout"),
}


def _error_body(status: int, message: str, type_: str | None = None, code: str | None = None) -> dict:
    default_type, default_code = _ERROR_TYPES.get(status, ("api_error", None))
    return {
        "error": {
            "message": message,
            "type": type_ or default_type,
            "param": None,
            "code": code if code is not None else default_code,
        }
    }


@dataclass
class HTTPError:
    """An HTTP error response (any status, e.g. 400, 401, 429, 500, 503).

    ``body`` defaults to OpenAI's error shape ``{"error": {"message", "type",
    "param", "code"}}``; a ``dict`` is sent as JSON, ``str``/``bytes`` are sent
    verbatim as ``text/plain`` (e.g. an HTML page from a proxy).  ``headers``
    are added to the response, e.g. ``{"retry-after-ms": "1"}`` or
    ``{"x-should-retry": "false"}``.  The SDK maps 400->BadRequestError,
    401->AuthenticationError, 429->RateLimitError, >=500->InternalServerError
    and retries 408/409/429/5xx (see module docstring about ``retry-after``).
    ``delay`` waits before answering.
    """

    status: int
    body: dict | str | bytes | None = None
    headers: dict | None = None
    delay: float = 0.0


@dataclass
class Stall:
    """Send ``after_chunks`` and then go silent for ``seconds``, then close.

    With ``send_headers=True`` (default) the ``200 text/event-stream``
    headers are sent first, so the SDK has already returned the stream object
    and a client read timeout surfaces while iterating
    (``openai.APITimeoutError``, not retried).  With ``send_headers=False``
    nothing at all is sent (time-to-first-byte timeout; the SDK *retries*
    those).  The connection is closed without terminating the body after the
    stall; the stall ends early if the client disconnects or the server
    stops.
    """

    seconds: float
    after_chunks: list = field(default_factory=list)
    send_headers: bool = True

    def __post_init__(self) -> None:
        self.after_chunks = _check_chunks(self.after_chunks, "Stall")
        if self.after_chunks and not self.send_headers:
            raise ValueError("Stall: after_chunks requires send_headers=True")


@dataclass
class Reset:
    """Send ``after_chunks`` and then abort the TCP connection with RST.

    The socket gets ``SO_LINGER`` (on, 0) and is closed, so the client sees
    a connection reset mid-stream instead of an orderly end of body.
    ``grace`` seconds are waited after the chunks were flushed, so that the
    client reads them before the reset arrives (an RST may make the peer
    drop data it has not read yet).  With ``send_headers=False`` the
    connection is reset before any response byte (the SDK retries that as a
    connection error).
    """

    after_chunks: list = field(default_factory=list)
    send_headers: bool = True
    grace: float = 0.05

    def __post_init__(self) -> None:
        self.after_chunks = _check_chunks(self.after_chunks, "Reset")
        if self.after_chunks and not self.send_headers:
            raise ValueError("Reset: after_chunks requires send_headers=True")


Response = Stream | Completion | HTTPError | Stall | Reset
_RESPONSE_TYPES = (Stream, Completion, HTTPError, Stall, Reset)


# --------------------------------------------------------------------------
# Recorded requests
# --------------------------------------------------------------------------


@dataclass
class RecordedRequest:
    """One HTTP request as received by the server.

    ``method`` (upper case), ``path`` (without query string), ``query`` (raw
    query string), ``headers`` (dict with lower-case keys; repeated headers
    joined with ``", "``), ``body`` (raw bytes), ``json`` (parsed body or
    ``None`` when empty / not JSON), ``index`` (0-based arrival order) and
    ``connection_id`` (which TCP connection carried it -- equal ids mean
    keep-alive reuse).  Convenience accessors for chat requests:
    ``messages``, ``model``, ``tools``, ``stream``, ``stream_options``,
    ``include_usage``.

    ``received_at`` / ``finished_at`` are ``time.time()`` stamps of when the
    request was fully read and when the server was done answering it.
    ``client_disconnected`` becomes True if the client went away before the
    scripted response was fully sent; ``finished`` (a ``threading.Event``) is
    set once the server is done with the request, whatever the outcome, see
    :meth:`wait_finished`.  This object is also what a handler receives.
    """

    method: str
    path: str
    query: str
    headers: dict
    body: bytes
    json: Any
    index: int
    connection_id: int
    http_version: str = "HTTP/1.1"
    received_at: float = 0.0
    finished_at: float | None = None
    client_disconnected: bool = False
    finished: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)

    @property
    def _obj(self) -> dict:
        return self.json if isinstance(self.json, dict) else {}

    @property
    def messages(self) -> list:
        """``messages`` of a chat request (empty list if absent)."""
        return self._obj.get("messages") or []

    @property
    def model(self) -> str | None:
        """``model`` of the request body."""
        return self._obj.get("model")

    @property
    def tools(self) -> list | None:
        """``tools`` of the request body (``None`` if not sent)."""
        return self._obj.get("tools")

    @property
    def stream(self) -> bool:
        """Whether the request asked for ``stream=True``."""
        return bool(self._obj.get("stream"))

    @property
    def stream_options(self) -> dict | None:
        return self._obj.get("stream_options")

    @property
    def include_usage(self) -> bool:
        """Whether ``stream_options.include_usage`` was true."""
        so = self.stream_options
        return bool(isinstance(so, dict) and so.get("include_usage"))

    def wait_finished(self, timeout: float = 5.0) -> bool:
        """Block until the server finished handling this request."""
        return self.finished.wait(timeout)


Handler = Callable[[RecordedRequest], Response | Awaitable[Response | None] | None]


# --------------------------------------------------------------------------
# Chunk builders
# --------------------------------------------------------------------------


def _split(text: str, pieces: int) -> list[str]:
    """Split ``text`` into at most ``pieces`` non-empty, near-equal parts."""
    if pieces < 1:
        raise ValueError("pieces must be >= 1")
    if not text:
        return [text]
    n = min(pieces, len(text))
    size, extra = divmod(len(text), n)
    out, pos = [], 0
    for i in range(n):
        step = size + (1 if i < extra else 0)
        out.append(text[pos : pos + step])
        pos += step
    return out


def _chunk(delta: dict, finish_reason: str | None = None) -> dict:
    return {
        "id": None,  # filled per response at send time
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": None,  # filled with the request's model at send time
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
    }


def text_chunks(text: str, pieces: int = 3, *, role: bool = True) -> list[dict]:
    """Visible content split into ``pieces`` deltas (``delta.content``).

    The first delta carries ``role: "assistant"`` unless ``role=False``
    (used when composing after reasoning chunks).
    """
    out = []
    for i, piece in enumerate(_split(text, pieces)):
        delta: dict = {"content": piece}
        if i == 0 and role:
            delta = {"role": "assistant", **delta}
        out.append(_chunk(delta))
    return out


def reasoning_chunks(
    text: str, pieces: int = 3, field: str = "reasoning_content", *, role: bool = True
) -> list[dict]:
    """Reasoning deltas as DeepSeek sends them: ``{"content": None, field: piece}``.

    ``field`` selects the key (``reasoning_content`` for DeepSeek,
    ``reasoning`` for OpenRouter/vLLM-style, ``thinking``, ...).  The first
    delta carries ``role: "assistant"`` unless ``role=False``.  The SDK
    exposes the key as ``getattr(delta, field)`` / ``delta.model_extra[field]``.
    """
    out = []
    for i, piece in enumerate(_split(text, pieces)):
        delta: dict = {"content": None, field: piece}
        if i == 0 and role:
            delta = {"role": "assistant", **delta}
        out.append(_chunk(delta))
    return out


def tool_call_chunks(
    calls: list[tuple[str, str, str]],
    fragments: int = 3,
    interleave: bool = True,
    *,
    role: bool = True,
) -> list[dict]:
    """OpenAI-style streamed tool calls.

    ``calls`` is a list of ``(id, name, arguments_json_str)``; call ``i`` gets
    ``index=i``.  Each call's arguments are split into ``fragments`` parts.
    The first delta of a call carries ``index``, ``id``, ``type:
    "function"``, ``function.name`` and the first arguments fragment; later
    deltas carry only ``index`` and ``function.arguments``.  Each chunk holds
    exactly one tool-call delta.  With ``interleave=True`` the fragments of
    parallel calls alternate (index 0, 1, 0, 1, ...), otherwise each call is
    sent completely before the next one.  The very first delta also carries
    ``role: "assistant", content: None`` unless ``role=False``.  Follow with
    ``finish_chunk("tool_calls")``.
    """
    per_call: list[list[dict]] = []
    for index, (call_id, name, arguments) in enumerate(calls):
        deltas = []
        for j, frag in enumerate(_split(arguments, fragments)):
            if j == 0:
                deltas.append(
                    {
                        "index": index,
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": frag},
                    }
                )
            else:
                deltas.append({"index": index, "function": {"arguments": frag}})
        per_call.append(deltas)

    if interleave:
        ordered = [d for group in itertools.zip_longest(*per_call) for d in group if d is not None]
    else:
        ordered = [d for deltas in per_call for d in deltas]

    out = []
    for i, tc in enumerate(ordered):
        delta: dict = {"tool_calls": [tc]}
        if i == 0 and role:
            delta = {"role": "assistant", "content": None, **delta}
        out.append(_chunk(delta))
    return out


def finish_chunk(reason: str = "stop") -> dict:
    """An empty delta with ``finish_reason`` (``stop``, ``tool_calls``, ``length``, ...)."""
    return _chunk({}, finish_reason=reason)


def usage_chunk(usage: dict) -> dict:
    """The usage-only final chunk (``"choices": []``) OpenAI sends with include_usage."""
    return {
        "id": None,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": None,
        "choices": [],
        "usage": usage,
    }


def usage(
    prompt: int,
    completion: int,
    reasoning: int | None = None,
    cached: int | None = None,
    style: str = "openai",
) -> dict:
    """Build a usage dict; ``total_tokens = prompt + completion``.

    ``style="openai"``: ``prompt_tokens_details.cached_tokens`` (only if
    ``cached`` is given) and ``completion_tokens_details.reasoning_tokens``
    (only if ``reasoning`` is given).

    ``style="deepseek"``: additionally ``prompt_cache_hit_tokens`` (``cached``
    or 0) and ``prompt_cache_miss_tokens`` (``prompt - hit``), and always
    ``prompt_tokens_details.cached_tokens`` as DeepSeek does.
    Reasoning tokens are part of ``completion`` (as with both providers).
    """
    if style not in ("openai", "deepseek"):
        raise ValueError("style must be 'openai' or 'deepseek'")
    u: dict = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if style == "deepseek":
        hit = cached or 0
        u["prompt_tokens_details"] = {"cached_tokens": hit}
        u["prompt_cache_hit_tokens"] = hit
        u["prompt_cache_miss_tokens"] = prompt - hit
    elif cached is not None:
        u["prompt_tokens_details"] = {"cached_tokens": cached}
    if reasoning is not None:
        u["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return u


def stream_answer(
    text: str,
    reasoning: str | None = None,
    usage: dict | None = None,
    delay: float = 0.0,
    *,
    pieces: int = 3,
    reasoning_field: str = "reasoning_content",
    finish_reason: str = "stop",
) -> Stream:
    """A complete streamed answer: [reasoning deltas] + text deltas + finish("stop") [+ usage] + [DONE]."""
    chunks: list = []
    if reasoning is not None:
        chunks += reasoning_chunks(reasoning, pieces, reasoning_field)
    chunks += text_chunks(text, pieces, role=reasoning is None)
    chunks.append(finish_chunk(finish_reason))
    return Stream(chunks=chunks, delay=delay, usage=usage)


def stream_tool_calls(
    calls: list[tuple[str, str, str]],
    reasoning: str | None = None,
    usage: dict | None = None,
    delay: float = 0.0,
    *,
    text: str | None = None,
    fragments: int = 3,
    interleave: bool = True,
    reasoning_field: str = "reasoning_content",
) -> Stream:
    """A streamed tool-call turn.

    [reasoning] + [text] + tool-call deltas + finish("tool_calls") [+ usage] + [DONE].
    """
    chunks: list = []
    if reasoning is not None:
        chunks += reasoning_chunks(reasoning, 3, reasoning_field)
    if text is not None:
        chunks += text_chunks(text, 3, role=not chunks)
    chunks += tool_call_chunks(calls, fragments, interleave, role=not chunks)
    chunks.append(finish_chunk("tool_calls"))
    return Stream(chunks=chunks, delay=delay, usage=usage)


# --------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    409: "Conflict",
    413: "Payload Too Large",
    422: "Unprocessable Entity",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}

_MAX_HEAD = 1 << 20  # 1 MiB of request line + headers
_MAX_BODY = 64 << 20  # 64 MiB


class FakeLLMServer:
    """An OpenAI-compatible HTTP/1.1 server on 127.0.0.1 for tests.

    Contract:

    * ``start()`` binds ``host`` (default ``127.0.0.1``) on ``port`` (default
      0 = OS-chosen), runs an asyncio loop in a daemon thread and returns
      ``self`` once the socket is listening; ``stop()`` closes the listener,
      aborts open connections (ending stalls), stops the loop and joins the
      thread, so the port is released and no thread is left.  Also a context
      manager (``with FakeLLMServer() as server:``).  ``start`` after
      ``stop`` starts afresh (possibly on another port).
    * ``base_url`` is ``http://127.0.0.1:<port>/v1`` -- pass it to
      ``OpenAI(base_url=...)``.
    * ``requests`` lists every request received (:class:`RecordedRequest`),
      in arrival order; ``chat_requests`` only the chat-completion ones.
    * Chat completions are answered from the ``enqueue`` FIFO queue first,
      then by ``handler(request)``; otherwise HTTP 500 with an explanation
      and ``x-should-retry: false``.  Exceptions raised by the handler are
      answered the same way and recorded in ``errors``; ``errors`` also
      collects unexpected server-side failures (it should stay empty).
    * Keep-alive: HTTP/1.1 connections are reused until the client closes
      them or sends ``Connection: close``; streams use chunked encoding.
      ``Stall`` and ``Reset`` close the connection.
    * Thread-safety: ``enqueue``/``clear``/``handler`` may be used from any
      thread.  A synchronous handler runs on the server's event loop, so it
      must not block; use an ``async def`` handler to wait.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        models: list[str] | None = None,
        handler: Handler | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.models: list[str] = list(models) if models is not None else ["fake-model"]
        self.handler: Handler | None = handler
        self.requests: list[RecordedRequest] = []
        self.errors: list[str] = []
        self._queue: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None
        self._conn_tasks: set = set()
        self._writers: set = set()
        self._conn_ids = itertools.count(1)
        self._req_ids = itertools.count(0)
        self._resp_ids = itertools.count(1)

    # ---- public API -------------------------------------------------------

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1`` (valid after ``start()``)."""
        if not self.port:
            raise RuntimeError("FakeLLMServer is not started")
        return f"http://{self.host}:{self.port}/v1"

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        """The recorded requests whose path ends with ``/chat/completions``."""
        return [r for r in list(self.requests) if r.path.endswith("/chat/completions")]

    @property
    def pending(self) -> int:
        """Number of queued responses not consumed yet."""
        with self._lock:
            return len(self._queue)

    def enqueue(self, *responses: Response) -> FakeLLMServer:
        """Append responses to the FIFO queue (one consumed per chat request)."""
        for r in responses:
            if not isinstance(r, _RESPONSE_TYPES):
                raise TypeError(
                    f"enqueue: expected one of Stream, Completion, HTTPError, Stall, Reset, got {r!r}"
                )
        with self._lock:
            self._queue.extend(responses)
        return self

    def clear(self) -> None:
        """Forget recorded requests and errors, empty the queue, drop the handler."""
        with self._lock:
            self._queue.clear()
        self.requests.clear()
        self.errors.clear()
        self.handler = None

    def wait_for_requests(self, n: int, timeout: float = 5.0) -> list[RecordedRequest]:
        """Block until at least ``n`` requests were recorded; return them.

        Raises ``TimeoutError`` otherwise.  (From async code, prefer polling
        with ``await asyncio.sleep`` -- this blocks the calling thread.)
        """
        deadline = time.monotonic() + timeout
        while len(self.requests) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"expected {n} requests, got {len(self.requests)}")
            time.sleep(0.005)
        return list(self.requests)

    def start(self) -> FakeLLMServer:
        if self._thread is not None:
            raise RuntimeError("FakeLLMServer already started")
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=self._run_loop, name="FakeLLMServer", daemon=True)
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._astart(), loop).result(timeout=10)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 5.0) -> None:
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            return
        try:
            if thread.is_alive() and not loop.is_closed():
                fut = asyncio.run_coroutine_threadsafe(self._ashutdown(), loop)
                try:
                    fut.result(timeout=timeout)
                except Exception:  # pragma: no cover - best effort
                    self.errors.append("stop: " + traceback.format_exc())
                loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout)
            if thread.is_alive():  # pragma: no cover
                raise RuntimeError("FakeLLMServer thread did not stop")
        finally:
            self._thread = None
            self._loop = None
            self._server = None

    def __enter__(self) -> FakeLLMServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"port={self.port}" if self._thread else "stopped"
        return f"<FakeLLMServer {state} requests={len(self.requests)} pending={self.pending}>"

    # ---- loop / lifecycle ------------------------------------------------

    def _run_loop(self) -> None:
        loop = self._loop
        assert loop is not None
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            try:
                pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
                for t in pending:
                    t.cancel()
                if pending:
                    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
                self._abort_all()
                loop.run_until_complete(asyncio.sleep(0))
            finally:
                asyncio.set_event_loop(None)
                loop.close()

    async def _astart(self) -> None:
        self._server = await asyncio.start_server(
            self._on_connect,
            self.host,
            self.port,
            backlog=1024,
            limit=_MAX_HEAD,
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def _ashutdown(self) -> None:
        loop = asyncio.get_running_loop()
        if self._server is not None:
            # Stop accepting first, then let already accepted sockets become
            # registered transports, and only then close the server: closing
            # it while an accepted socket is still being wrapped makes asyncio
            # (3.11) fail in Server._attach and leak that socket.
            for sock in self._server.sockets:
                loop.remove_reader(sock.fileno())
            for _ in range(3):
                await asyncio.sleep(0)
            self._server.close()
        tasks = [t for t in self._conn_tasks if not t.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)
        # a transport whose close() waits for unsent data (peer not reading),
        # or whose task never ran, is closed the hard way
        self._abort_all()
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
        # let transports run their connection_lost callbacks (socket close)
        for _ in range(3):
            await asyncio.sleep(0)

    def _abort_all(self) -> None:
        for writer in list(self._writers):
            if not writer.transport.is_closing() or writer.transport.get_write_buffer_size():
                writer.transport.abort()
        self._writers.clear()

    # ---- connection handling -------------------------------------------

    def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Synchronous callback (called from connection_made): the writer and
        # task are registered before anything can cancel them, so shutdown
        # always finds and closes every transport.
        self._writers.add(writer)
        task = asyncio.get_running_loop().create_task(self._handle_connection(reader, writer))
        self._conn_tasks.add(task)
        task.add_done_callback(self._conn_tasks.discard)

    async def _handle_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn_id = next(self._conn_ids)
        try:
            while True:
                try:
                    req = await self._read_request(reader, writer, conn_id)
                except _BadRequest as e:
                    await self._send_json(
                        writer,
                        e.status,
                        _error_body(e.status, e.message, "invalid_request_error"),
                        keep_alive=False,
                    )
                    break
                if req is None:
                    break
                try:
                    keep_alive = await self._dispatch(req, reader, writer)
                except ConnectionError:
                    req.client_disconnected = True
                    raise
                finally:
                    req.finished_at = time.time()
                    req.finished.set()
                if not keep_alive:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        except Exception:
            self.errors.append(traceback.format_exc())
        finally:
            self._writers.discard(writer)
            try:
                if writer.transport.get_write_buffer_size():
                    writer.transport.abort()  # peer is not reading; don't linger
                else:
                    writer.close()
            except Exception:  # pragma: no cover
                pass

    async def _read_request(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn_id: int
    ) -> RecordedRequest | None:
        # request line + headers
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return None  # client closed the (idle) connection
            except asyncio.LimitOverrunError:
                raise _BadRequest(431, "request head too large") from None
            head = head.lstrip(b"\r\n")  # tolerate stray CRLFs between requests
            if head:
                break
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise _BadRequest(400, f"malformed request line: {lines[0]!r}")
        method, target, version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if not line:
                continue
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise _BadRequest(400, f"malformed header line: {line!r}")
            key, value = name.lower(), value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value

        if headers.get("expect", "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")

        # body
        te = headers.get("transfer-encoding", "").lower()
        if te:
            if te.split(",")[-1].strip() != "chunked":
                raise _BadRequest(501, f"unsupported transfer-encoding {te!r}")
            body = await self._read_chunked(reader)
        elif "content-length" in headers:
            try:
                length = int(headers["content-length"])
            except ValueError:
                raise _BadRequest(400, "invalid content-length") from None
            if length < 0 or length > _MAX_BODY:
                raise _BadRequest(413 if length > 0 else 400, "invalid content-length")
            body = await reader.readexactly(length) if length else b""
        else:
            body = b""

        parsed: Any = None
        if body:
            try:
                parsed = json.loads(body)
            except ValueError:
                parsed = None

        path, _, query = target.partition("?")
        req = RecordedRequest(
            method=method.upper(),
            path=path,
            query=query,
            headers=headers,
            body=body,
            json=parsed,
            index=next(self._req_ids),
            connection_id=conn_id,
            http_version=version,
            received_at=time.time(),
        )
        self.requests.append(req)
        return req

    @staticmethod
    async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
        body = bytearray()
        while True:
            size_line = await reader.readuntil(b"\r\n")
            try:
                size = int(size_line.split(b";")[0].strip(), 16)
            except ValueError:
                raise _BadRequest(400, "malformed chunk size") from None
            if size == 0:
                # trailers until empty line
                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                    pass
                return bytes(body)
            body += await reader.readexactly(size)
            if await reader.readexactly(2) != b"\r\n":
                raise _BadRequest(400, "malformed chunk terminator")
            if len(body) > _MAX_BODY:
                raise _BadRequest(413, "body too large")

    # ---- routing -------------------------------------------------------

    async def _dispatch(
        self, req: RecordedRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Answer one request; return whether the connection may be reused."""
        conn_tokens = {t.strip().lower() for t in req.headers.get("connection", "").split(",")}
        if req.http_version == "HTTP/1.0":
            keep_alive = "keep-alive" in conn_tokens
        else:
            keep_alive = "close" not in conn_tokens

        path = req.path.rstrip("/")
        if path.endswith("/chat/completions"):
            if req.method != "POST":
                return await self._send_json(
                    writer, 405, _error_body(405, f"{req.method} not allowed on {req.path}"), keep_alive
                )
            if req.json is None or not isinstance(req.json, dict):
                return await self._send_json(
                    writer, 400, _error_body(400, "request body must be a JSON object"), keep_alive
                )
            response = await self._next_response(req)
            return await self._send_response(response, req, reader, writer, keep_alive)

        if path.endswith("/models") and req.method == "GET":
            data = [{"id": m, "object": "model", "created": 0, "owned_by": "fake"} for m in self.models]
            return await self._send_json(writer, 200, {"object": "list", "data": data}, keep_alive)

        _head, sep, model_id = path.rpartition("/models/")
        if sep and req.method == "GET" and model_id:
            if model_id in self.models:
                body = {"id": model_id, "object": "model", "created": 0, "owned_by": "fake"}
                return await self._send_json(writer, 200, body, keep_alive)
            return await self._send_json(
                writer,
                404,
                _error_body(404, f"The model '{model_id}' does not exist", code="model_not_found"),
                keep_alive,
            )

        return await self._send_json(
            writer, 404, _error_body(404, f"FakeLLMServer: no route for {req.method} {req.path}"), keep_alive
        )

    async def _next_response(self, req: RecordedRequest) -> Response:
        with self._lock:
            if self._queue:
                return self._queue.popleft()
        handler = self.handler
        where = f"request #{req.index} {req.method} {req.path} (model={req.model!r})"
        if handler is None:
            return self._internal_error(
                f"FakeLLMServer: no scripted response for {where}: queue empty and no handler set"
            )
        try:
            result = handler(req)
            if inspect.isawaitable(result):
                result = await result
        except Exception:
            tb = traceback.format_exc()
            self.errors.append(f"handler raised for {where}:\n{tb}")
            return self._internal_error(f"FakeLLMServer: handler raised for {where}:\n{tb}")
        if result is None:
            return self._internal_error(f"FakeLLMServer: handler returned None for {where}")
        if not isinstance(result, _RESPONSE_TYPES):
            msg = (
                f"FakeLLMServer: handler returned {type(result).__name__}, not a response object, for {where}"
            )
            self.errors.append(msg)
            return self._internal_error(msg)
        return result

    @staticmethod
    def _internal_error(message: str) -> HTTPError:
        return HTTPError(
            500,
            _error_body(500, message, "fake_server_error", "no_scripted_response"),
            headers={"x-should-retry": "false"},
        )

    # ---- writing -------------------------------------------------------

    @staticmethod
    def _head(status: int, headers: dict, keep_alive: bool) -> bytes:
        lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}"]
        base = {
            "date": email.utils.formatdate(usegmt=True),
            "server": "FakeLLMServer",
            "connection": "keep-alive" if keep_alive else "close",
        }
        base.update({k.lower(): str(v) for k, v in headers.items()})
        lines += [f"{k}: {v}" for k, v in base.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def _send_body(
        self,
        writer: asyncio.StreamWriter,
        status: int,
        body: bytes,
        content_type: str,
        keep_alive: bool,
        extra: dict | None = None,
    ) -> bool:
        headers = {"content-type": content_type, "content-length": str(len(body))}
        headers["x-request-id"] = f"req_fake_{next(self._resp_ids)}"
        headers.update({k.lower(): v for k, v in (extra or {}).items()})
        writer.write(self._head(status, headers, keep_alive) + body)
        await writer.drain()
        return keep_alive

    async def _send_json(
        self, writer: asyncio.StreamWriter, status: int, obj: Any, keep_alive: bool, extra=None
    ) -> bool:
        body = json.dumps(obj, ensure_ascii=False).encode("utf-8")
        return await self._send_body(writer, status, body, "application/json", keep_alive, extra)

    async def _send_response(
        self,
        resp: Response,
        req: RecordedRequest,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        keep_alive: bool,
    ) -> bool:
        ctx = {"id": f"chatcmpl-fake{next(self._resp_ids)}", "model": req.model or "fake-model"}

        if isinstance(resp, HTTPError):
            if await self._sleep(reader, resp.delay):
                req.client_disconnected = True
                return False
            body = resp.body
            if body is None:
                body = _error_body(resp.status, f"FakeLLMServer scripted HTTP {resp.status}")
            if isinstance(body, dict):
                return await self._send_json(writer, resp.status, body, keep_alive, resp.headers)
            raw = body.encode("utf-8") if isinstance(body, str) else bytes(body)
            return await self._send_body(
                writer, resp.status, raw, "text/plain; charset=utf-8", keep_alive, resp.headers
            )

        if isinstance(resp, Completion):
            if await self._sleep(reader, resp.delay):
                req.client_disconnected = True
                return False
            message = {"role": "assistant", **resp.message}
            obj: dict = {
                "id": ctx["id"],
                "object": "chat.completion",
                "created": int(time.time()),
                "model": ctx["model"],
                "choices": [
                    {"index": 0, "message": message, "finish_reason": resp.finish_reason, "logprobs": None}
                ],
            }
            if resp.usage is not None:
                obj["usage"] = resp.usage
            return await self._send_json(writer, 200, obj, keep_alive, resp.headers)

        if isinstance(resp, Stream):
            events: list = list(resp.chunks)
            if resp.usage is not None and (req.include_usage or not resp.usage_if_requested):
                events.append(usage_chunk(resp.usage))
            self._write_stream_head(writer, keep_alive, resp.headers)
            await writer.drain()
            for i, item in enumerate(events):
                paced = resp.paced_events is None or i < resp.paced_events
                if paced and await self._sleep(reader, resp.first_delay if i == 0 else resp.delay):
                    req.client_disconnected = True
                    return False
                await self._write_chunk(writer, self._encode_event(item, ctx))
            if resp.done:
                await self._write_chunk(writer, b"data: [DONE]\n\n")
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            return keep_alive

        if isinstance(resp, Stall):
            if resp.send_headers:
                self._write_stream_head(writer, False, None)
                for item in resp.after_chunks:
                    await self._write_chunk(writer, self._encode_event(item, ctx))
                await writer.drain()
            if await self._sleep(reader, resp.seconds):
                req.client_disconnected = True
            return False

        if isinstance(resp, Reset):
            if resp.send_headers:
                self._write_stream_head(writer, False, None)
                for item in resp.after_chunks:
                    await self._write_chunk(writer, self._encode_event(item, ctx))
                await writer.drain()
                if await self._sleep(reader, resp.grace):
                    req.client_disconnected = True
            self._abort(writer)
            return False

        raise TypeError(f"unknown response kind {resp!r}")  # pragma: no cover

    def _write_stream_head(self, writer: asyncio.StreamWriter, keep_alive: bool, extra: dict | None) -> None:
        headers = {
            "content-type": "text/event-stream; charset=utf-8",
            "cache-control": "no-cache",
            "transfer-encoding": "chunked",
            "x-request-id": f"req_fake_{next(self._resp_ids)}",
        }
        headers.update({k.lower(): v for k, v in (extra or {}).items()})
        writer.write(self._head(200, headers, keep_alive))

    @staticmethod
    async def _write_chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
        if not data:
            return  # a zero-length chunk would terminate the body
        writer.write(b"%X\r\n%s\r\n" % (len(data), data))
        await writer.drain()

    @staticmethod
    def _encode_event(item: Chunk, ctx: dict) -> bytes:
        if isinstance(item, Raw):
            return bytes(item.data)
        if isinstance(item, dict):
            obj = dict(item)
            for key, value in (("id", ctx["id"]), ("model", ctx["model"]), ("created", int(time.time()))):
                if key in obj and obj[key] is None:
                    obj[key] = value
            payload = json.dumps(obj, ensure_ascii=False).encode("utf-8")
        elif isinstance(item, str):
            payload = item.encode("utf-8")
        else:
            payload = bytes(item)
        return b"data: " + payload + b"\n\n"

    @staticmethod
    async def _sleep(reader: asyncio.StreamReader, seconds: float) -> bool:
        """Sleep; return True early if the client closed its side of the connection."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, seconds)
        while True:
            if reader.at_eof():
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            await asyncio.sleep(min(remaining, 0.05))

    @staticmethod
    def _abort(writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()


@contextlib.contextmanager
def serving(handler):
    """`handler` answering on a new local `FakeLLMServer`, its `base_url` set to the server's (for the
    processes a test points at it); the server stops when the block ends."""
    with FakeLLMServer() as server:
        server.handler = handler
        handler.base_url = server.base_url
        yield handler
