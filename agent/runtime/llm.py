"""The model client: one streamed chat completion against an OpenAI-compatible API, with bounded retries.

`ModelClient` is the interface the router, the agent loop and the semantic guard call; `OpenAIModelClient`
(the `openai` SDK) and `agent.runtime.demo.DemoModelClient` implement it, picked by
`agent.runtime.providers.get_model_client()`. `complete()` streams one completion and assembles visible
text (to `on_text`), reasoning, fragmented parallel tool calls, the finish reason and the usage
(`Usage.unavailable()` when none was reported, never zeros). Retries are ours, each attempt recorded,
and only before any stream data arrived; a provider that keeps failing raises `LLMError` with the run's
error code. Details: docs/runtime.md, *Model client and retry policy* and *Run error codes*.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import aiohttp
import openai
from django.conf import settings
from django.utils import timezone

from agent.runtime.lean_chunks import LeanChunkClient
from audit.write import DeclaredToolCall, Usage
from reasoning.capture import REASONING_KEYS, extract_reasoning

logger = logging.getLogger(__name__)

LLM_RATE_LIMITED = "LLM_RATE_LIMITED"
LLM_UNAVAILABLE = "LLM_UNAVAILABLE"
LLM_TIMEOUT = "LLM_TIMEOUT"
LLM_BAD_RESPONSE = "LLM_BAD_RESPONSE"
LLM_REJECTED = "LLM_REJECTED"

BACKOFF_BASE_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 8.0
RETRY_AFTER_MAX_SECONDS = 60.0

TextCallback = Callable[[str], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class ModelRoles:
    """The model names a provider uses for each role (they appear in each step's `model`)."""

    router: str
    agent: str
    guard: str


@dataclass(slots=True)
class StreamProgress:
    """What one `complete()` call has received so far; the caller keeps it to record a step that was
    interrupted (cancel) or failed (LLMError) with what had arrived."""

    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    reasoning_key: str | None = None
    attempts: list[dict[str, Any]] = field(default_factory=list)
    started_at: datetime | None = None
    started_monotonic: float | None = None

    @property
    def text_value(self) -> str:
        return "".join(self.text)

    @property
    def reasoning_value(self) -> str | None:
        value = "".join(self.reasoning)
        return value if value.strip() else None

    def duration_ms(self) -> int | None:
        if self.started_monotonic is None:
            return None
        return int((time.monotonic() - self.started_monotonic) * 1000)


@dataclass(frozen=True, slots=True)
class ModelResult:
    """One completed model call."""

    model: str
    text: str
    reasoning: str | None
    reasoning_key: str | None
    tool_calls: tuple[DeclaredToolCall, ...]
    finish_reason: str
    usage: Usage
    attempts: tuple[dict[str, Any], ...]
    started_at: datetime
    finished_at: datetime
    duration_ms: int


class LLMError(Exception):
    """The provider could not produce a usable completion; `code` is the run's error code and `message`
    a safe sentence (status and attempt count, never the provider's body)."""

    def __init__(self, code: str, message: str, *, attempts: Sequence[dict[str, Any]] = ()) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.attempts = list(attempts)


class ModelClient(Protocol):
    """A chat model provider. `complete` streams one completion; `on_text` receives visible text pieces
    in order as they arrive; `progress` (optional) is filled while streaming."""

    provider: str
    roles: ModelRoles

    async def complete(
        self,
        *,
        model: str,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        tool_choice: str | None = None,
        on_text: TextCallback | None = None,
        progress: StreamProgress | None = None,
    ) -> ModelResult: ...


# ---------------------------------------------------------------------------------------------------
# Stream assembly
# ---------------------------------------------------------------------------------------------------
@dataclass(slots=True)
class _CallParts:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class StreamAssembler:
    """Folds `chat.completion.chunk`s (`lean_chunks.ChunkView`s, or the SDK's models) into text, reasoning,
    tool calls, finish and usage."""

    def __init__(self, progress: StreamProgress) -> None:
        self.progress = progress
        self.calls: dict[int, _CallParts] = {}
        self.finish_reason = ""
        self.usage_obj: Any = None
        self.chunks = 0

    def feed(self, chunk: Any) -> str:
        """Take one chunk; return its visible text piece ("" when none)."""
        self.chunks += 1
        usage = getattr(chunk, "usage", None)
        if usage is not None:
            self.usage_obj = usage
        choices = getattr(chunk, "choices", None) or []
        piece = ""
        for choice in choices:
            if getattr(choice, "index", 0) not in (0, None):
                continue  # n > 1 is never requested; ignore stray choices
            delta = getattr(choice, "delta", None)
            if delta is not None:
                piece += self._delta(delta)
            reason = getattr(choice, "finish_reason", None)
            if reason:
                self.finish_reason = str(reason)
        return piece

    def _delta(self, delta: Any) -> str:
        progress = self.progress
        text, key = extract_reasoning(delta)
        if text is not None:
            if progress.reasoning_key is None:
                progress.reasoning_key = key
            progress.reasoning.append(text)
        elif progress.reasoning_key is not None:
            # extract_reasoning skips whitespace-only values; keep them (newlines between paragraphs).
            raw = _raw_reasoning(delta, progress.reasoning_key)
            if raw:
                progress.reasoning.append(raw)
        for call in getattr(delta, "tool_calls", None) or []:
            index = getattr(call, "index", None)
            parts = self.calls.setdefault(int(index) if index is not None else len(self.calls), _CallParts())
            if getattr(call, "id", None) and not parts.id:
                parts.id = str(call.id)
            function = getattr(call, "function", None)
            if function is not None:
                name = getattr(function, "name", None)
                if name:
                    if not parts.name or name.startswith(parts.name):
                        parts.name = name
                    else:
                        parts.name += name
                arguments = getattr(function, "arguments", None)
                if arguments:
                    parts.arguments.append(arguments)
        content = getattr(delta, "content", None)
        if isinstance(content, str) and content:
            progress.text.append(content)
            return content
        return ""

    def tool_calls(self) -> tuple[DeclaredToolCall, ...]:
        calls = []
        for position, index in enumerate(sorted(self.calls)):
            parts = self.calls[index]
            if not parts.name:
                raise _BadStream("a streamed tool call has no function name")
            calls.append(
                DeclaredToolCall(
                    # Providers that omit ids still need one per call to pair the tool result with it.
                    tool_call_id=parts.id or f"call_{position}_{index}",
                    name=parts.name,
                    arguments="".join(parts.arguments),
                )
            )
        return tuple(calls)


def _raw_reasoning(delta: Any, key: str) -> str | None:
    if key == "attribute":
        value = getattr(delta, "reasoning_content", None)
    else:
        extra = getattr(delta, "model_extra", None) or {}
        value = extra.get(key) if key in REASONING_KEYS else None
    return value if isinstance(value, str) else None


class _BadStream(Exception):
    """The stream was well-formed JSON but not a usable completion."""


def usage_from(obj: Any) -> Usage:
    """The provider's usage object as `Usage`; `Usage.unavailable()` when it sent none. A count the
    provider did not send stays None (reasoning, cached input, and a total it sent neither itself nor
    both parts of); the ledger counts such a call as one without usage."""
    if obj is None:
        return Usage.unavailable()

    def num(value: Any) -> int | None:
        if isinstance(value, bool) or value is None:
            return None
        try:
            return int(value)
        except (TypeError, ValueError):
            return None

    prompt = num(getattr(obj, "prompt_tokens", None))
    completion = num(getattr(obj, "completion_tokens", None))
    total = num(getattr(obj, "total_tokens", None))
    if prompt is None and completion is None and total is None:
        return Usage.unavailable()
    if total is None and prompt is not None and completion is not None:
        total = prompt + completion  # derived only from two reported parts, never from a missing one
    details = getattr(obj, "completion_tokens_details", None)
    reasoning = num(getattr(details, "reasoning_tokens", None)) if details is not None else None
    prompt_details = getattr(obj, "prompt_tokens_details", None)
    cached = num(getattr(prompt_details, "cached_tokens", None)) if prompt_details is not None else None
    if cached is None:
        extra = getattr(obj, "model_extra", None) or {}
        cached = num(extra.get("prompt_cache_hit_tokens"))
    return Usage(
        available=True,
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=total,
        reasoning_tokens=reasoning,
        cached_tokens=cached,
    )


# ---------------------------------------------------------------------------------------------------
# Error classification and backoff
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Failure:
    code: str
    status: int | None
    retryable: bool
    retry_after: float | None
    label: str


def _header_delay(headers: Any) -> float | None:
    if headers is None:
        return None
    value = headers.get("retry-after-ms")
    if value is not None:
        try:
            seconds = float(value) / 1000
        except ValueError:
            seconds = None
        if seconds is not None and 0 <= seconds <= RETRY_AFTER_MAX_SECONDS:
            return seconds
    value = headers.get("retry-after")
    if value is not None:
        try:
            seconds = float(value)
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(value)
                seconds = (when - datetime.now(UTC)).total_seconds()
            except (TypeError, ValueError):
                seconds = None
        if seconds is not None and 0 <= seconds <= RETRY_AFTER_MAX_SECONDS:
            return seconds
    return None


def _unmasked(exc: BaseException) -> BaseException:
    """`exc`, or the connection error it hides. The SDK's aiohttp transport maps every
    `aiohttp.ClientConnectionError` to httpx's `ConnectTimeout`, so a refused or reset connection would
    surface as `APITimeoutError` and be recorded as LLM_TIMEOUT. The aiohttp error it wraps says which it
    was: a real timeout is a `TimeoutError` (aiohttp's connect and read timeouts are)."""
    if not isinstance(exc, openai.APITimeoutError):
        return exc
    link, hops = exc.__cause__, 0
    while link is not None and not isinstance(link, aiohttp.ClientError) and hops < 8:
        link, hops = link.__cause__, hops + 1
    if link is None or isinstance(link, TimeoutError):
        return exc
    error = openai.APIConnectionError(request=exc.request)
    error.__cause__ = link
    return error


def _classify(exc: BaseException) -> _Failure | None:
    """How a provider failure maps to a run error code and whether it may be retried; None for
    exceptions that are not provider failures (programming errors propagate as they are)."""
    if isinstance(exc, openai.APITimeoutError):
        return _Failure(LLM_TIMEOUT, None, True, None, "timeout")
    if isinstance(exc, openai.APIConnectionError):
        return _Failure(LLM_UNAVAILABLE, None, True, None, "connection error")
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        headers = getattr(exc.response, "headers", None)
        if status == 429:
            code, retryable = LLM_RATE_LIMITED, True
        elif status == 408:
            code, retryable = LLM_TIMEOUT, True
        elif status >= 500:
            code, retryable = LLM_UNAVAILABLE, True
        else:
            code, retryable = LLM_REJECTED, False
        should = (headers.get("x-should-retry") if headers is not None else None) or ""
        if should.lower() == "true":
            retryable = True
        elif should.lower() == "false":
            retryable = False
        return _Failure(code, status, retryable, _header_delay(headers), f"HTTP {status}")
    if isinstance(exc, openai.APIError):
        # An error event inside the stream.
        return _Failure(LLM_BAD_RESPONSE, None, False, None, "error event in the stream")
    if isinstance(exc, (ValueError, _BadStream)):
        # json.JSONDecodeError and pydantic's ValidationError are ValueErrors.
        return _Failure(LLM_BAD_RESPONSE, None, False, None, "malformed stream")
    return None


def backoff_seconds(attempt: int) -> float:
    """Full-jitter exponential backoff before retry number `attempt` (1-based)."""
    ceiling = min(BACKOFF_MAX_SECONDS, BACKOFF_BASE_SECONDS * (2 ** (attempt - 1)))
    return random.uniform(ceiling / 2, ceiling)


_MESSAGES = {
    LLM_RATE_LIMITED: "The model provider kept rate-limiting the request",
    LLM_UNAVAILABLE: "The model provider was unavailable",
    LLM_TIMEOUT: "The model provider did not answer in time",
    LLM_BAD_RESPONSE: "The model provider sent a response that could not be used",
    LLM_REJECTED: "The model provider rejected the request",
}


def _message(failure: _Failure, attempts: int) -> str:
    return f"{_MESSAGES[failure.code]} ({failure.label}, {attempts} attempt{'s' if attempts != 1 else ''})."


# ---------------------------------------------------------------------------------------------------
# The OpenAI-compatible client
# ---------------------------------------------------------------------------------------------------
# Event loop id -> (loop, {configuration: client}). Entries of closed loops are dropped on the next lookup.
_sdk_clients: dict[int, tuple[asyncio.AbstractEventLoop, dict[tuple, LeanChunkClient]]] = {}

# `LLM_HTTP_CLIENT` -> the SDK's HTTP client class: its aiohttp transport (the default: less CPU per
# streamed chunk than httpx's, B3's two floors in docs/performance.md) or its default httpx client. Both
# keep the SDK's defaults (connection limits, redirects) and map timeouts and connection errors to the
# same `openai` exceptions, which `_classify` reads.
HTTP_CLIENTS = {"aiohttp": openai.DefaultAioHttpClient, "httpx": openai.DefaultAsyncHttpxClient}


def _sdk_client() -> openai.AsyncOpenAI:
    """One `AsyncOpenAI` (and its connection pool) per event loop and configuration."""
    loop = asyncio.get_running_loop()
    for loop_id, (other, _clients) in list(_sdk_clients.items()):
        if other.is_closed():
            _sdk_clients.pop(loop_id, None)
    transport = str(settings.LLM_HTTP_CLIENT).strip().lower()
    key = (settings.LLM_BASE_URL, settings.LLM_API_KEY, float(settings.LLM_TIMEOUT_SECONDS), transport)
    per_loop = _sdk_clients.setdefault(id(loop), (loop, {}))[1]
    client = per_loop.get(key)
    if client is None:
        timeout = float(settings.LLM_TIMEOUT_SECONDS)
        client = LeanChunkClient(
            base_url=settings.LLM_BASE_URL,
            api_key=settings.LLM_API_KEY or "unset",
            timeout=timeout,
            max_retries=0,
            http_client=HTTP_CLIENTS[transport](timeout=timeout),
        )
        per_loop[key] = client
    return client


def warm_client() -> None:
    """Build this loop's SDK client for the configured provider now: its TLS context loads the CA bundle,
    ≈ 20–30 ms during which the loop runs nothing else. A serving process calls it at start, before it
    serves, so the first chat after a (re)start does not wait for it; a failure is logged by class and
    left to the first model call."""
    if (settings.LLM_PROVIDER or "").lower() != "openai":
        return
    try:
        _sdk_client()
    except Exception as exc:
        logger.warning("model client not built at start error=%s", type(exc).__name__)


class OpenAIModelClient:
    """`ModelClient` on the official `openai` SDK (OpenAI, DeepSeek, any OpenAI-compatible endpoint)."""

    provider = "openai"

    def __init__(self, *, roles: ModelRoles | None = None, max_retries: int | None = None) -> None:
        self.roles = roles or ModelRoles(
            router=settings.LLM_ROUTER_MODEL, agent=settings.LLM_MODEL, guard=settings.LLM_GUARD_MODEL
        )
        self.max_retries = settings.LLM_MAX_RETRIES if max_retries is None else max_retries

    async def complete(
        self,
        *,
        model: str,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        tool_choice: str | None = None,
        on_text: TextCallback | None = None,
        progress: StreamProgress | None = None,
    ) -> ModelResult:
        progress = progress if progress is not None else StreamProgress()
        progress.started_at = timezone.now()
        progress.started_monotonic = time.monotonic()
        params: dict[str, Any] = {
            "model": model,
            "messages": list(messages),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if tools:
            params["tools"] = list(tools)
            if tool_choice:
                params["tool_choice"] = tool_choice
        client = _sdk_client()
        max_attempts = 1 + max(0, int(self.max_retries))
        for attempt in range(1, max_attempts + 1):
            progress.text.clear()
            progress.reasoning.clear()
            progress.reasoning_key = None
            assembler = StreamAssembler(progress)
            began = time.monotonic()
            entry: dict[str, Any] = {"attempt": attempt}
            progress.attempts.append(entry)
            try:
                stream = await client.stream_chat(params)
                try:
                    async for chunk in stream:
                        piece = assembler.feed(chunk)
                        if piece and on_text is not None:
                            await on_text(piece)
                finally:
                    await stream.close()
                tool_calls = assembler.tool_calls()
                if not assembler.chunks or (
                    not assembler.finish_reason and not progress.text and not tool_calls
                ):
                    raise _BadStream("the stream carried no completion")
            except asyncio.CancelledError:
                entry.update(error="cancelled", durationMs=_ms_since(began))
                raise
            except Exception as caught:
                exc = _unmasked(caught)
                failure = _classify(exc)
                if failure is None:
                    raise
                entry.update(error=type(exc).__name__, durationMs=_ms_since(began))
                if failure.status is not None:
                    entry["status"] = failure.status
                if failure.retryable and assembler.chunks == 0 and attempt < max_attempts:
                    delay = failure.retry_after
                    if delay is None:
                        delay = backoff_seconds(attempt)
                    entry["retryInMs"] = int(delay * 1000)
                    logger.info(
                        "model call retry model=%s attempt=%d error=%s status=%s",
                        model,
                        attempt,
                        type(exc).__name__,
                        failure.status,
                    )
                    await asyncio.sleep(delay)
                    continue
                logger.warning(
                    "model call failed model=%s attempts=%d code=%s error=%s status=%s",
                    model,
                    attempt,
                    failure.code,
                    type(exc).__name__,
                    failure.status,
                )
                raise LLMError(failure.code, _message(failure, attempt), attempts=progress.attempts) from None
            entry.update(status=200, durationMs=_ms_since(began))
            return ModelResult(
                model=model,
                text=progress.text_value,
                reasoning=progress.reasoning_value,
                reasoning_key=progress.reasoning_key,
                tool_calls=tool_calls,
                finish_reason=assembler.finish_reason,
                usage=usage_from(assembler.usage_obj),
                attempts=tuple(progress.attempts),
                started_at=progress.started_at,
                finished_at=timezone.now(),
                duration_ms=progress.duration_ms() or 0,
            )
        raise AssertionError("unreachable")  # pragma: no cover


async def aclose_clients() -> None:
    """Close this event loop's SDK clients (their connection pools); call before a loop you own ends."""
    entry = _sdk_clients.pop(id(asyncio.get_running_loop()), None)
    for client in entry[1].values() if entry else ():
        await client.close()


def _ms_since(began: float) -> int:
    return int((time.monotonic() - began) * 1000)


def parse_json_object(text: str | None) -> dict[str, Any] | None:
    """The first JSON object in a model's text (bare, in a ``` fence, or surrounded by prose); None when
    there is none."""
    if not text:
        return None
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            value, _end = decoder.raw_decode(text, start)
        except ValueError:
            start = text.find("{", start + 1)
            continue
        if isinstance(value, dict):
            return value
        start = text.find("{", start + 1)
    return None
