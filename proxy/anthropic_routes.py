"""The ``/v1/messages`` and ``/v1/messages/count_tokens`` handlers.

Thin: read the body, ask :mod:`proxy.anthropic` for a plan, call the engine,
relay. Two modes (``messages_mode``):

- ``native`` forwards the Anthropic body (ordered) to an engine that speaks
  Anthropic Messages, and relays its answer as the chat route does;
- ``translate`` sends a Chat Completions body through
  :mod:`proxy.chat_upstream` and turns the answer back into Anthropic form.

In translate mode the client's headers never reach the engine, so neither do
its Anthropic credentials (``x-api-key``, ``Authorization``) or
``anthropic-*`` headers. Every engine call is made inside the app's
``ADMISSION``, so the managed engine's queue applies.

Streams: the client's response is only started when there is something to
send, so an error before the first chunk is still a normal HTTP error. While
the engine reads a long prompt, a ``ping`` goes out every
``messages_ping_interval`` seconds (``message_start`` first); after that, a
failure ends the stream with ``event: error``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum

import aiohttp
import orjson
from aiohttp import web

from proxy._types import Body
from proxy.anthropic import (
    Event,
    MessageAccumulator,
    MessageEvents,
    TranslationPlan,
    context_overflow,
    frames,
    message_from_completion,
    native_error,
    plan_native,
    plan_translation,
)
from proxy.chat_upstream import chat_completion, chat_stream, prepare_chat_body
from proxy.config import ConfigError, Settings
from proxy.errors import (
    Dialect,
    ToolpairError,
    UpstreamError,
    UpstreamStatusError,
    UpstreamTimeoutError,
    error_event,
)
from proxy.privacy import log_message
from proxy.queueing import conversation_key
from proxy.server import ADMISSION, SETTINGS, UPSTREAM, error_response, read_body, relay
from proxy.token_count import ChatTemplate, TemplateError, estimate_tokens
from proxy.trace import trace_of
from proxy.upstream import Upstream, forwardable_headers

__all__ = [
    "ANTHROPIC",
    "COUNT_HEADER",
    "AnthropicState",
    "MessagesMode",
    "messages_mode",
    "register_anthropic_routes",
]

log = logging.getLogger("toolpair")

MESSAGES_PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
COUNT_HEADER = "X-Toolpair-Token-Count"
"""On every count_tokens answer: ``exact`` (rendered and tokenized by the engine,
or counted by a native engine) or ``estimate`` (see :func:`proxy.token_count.estimate_tokens`)."""

TOKENIZE_COUNT_PATH = "/extras/tokenize/count"
"""llama-cpp-python's tokenizer route: ``{"input": text}`` -> ``{"count": n}``."""

_JSON_HEADERS = {"Content-Type": "application/json"}
# Never forwarded to a native engine: the client's Anthropic credentials, and
# compression, since errors may be rewritten.
_NATIVE_DROP = ("accept-encoding", "x-api-key", "authorization")


class MessagesMode(StrEnum):
    """How ``/v1/messages`` reaches the engine."""

    NATIVE = "native"  # the engine speaks Anthropic Messages
    TRANSLATE = "translate"  # the engine speaks Chat Completions only


def messages_mode(settings: Settings) -> MessagesMode:
    """The mode for these settings: ``auto`` is native only for llama-server.

    >>> messages_mode(Settings(messages_mode="auto")).value
    'translate'
    """
    if settings.messages_mode == "auto":
        kind = settings.engine_kind
        return MessagesMode.NATIVE if kind == "llama-server" else MessagesMode.TRANSLATE
    try:
        return MessagesMode(settings.messages_mode)
    except ValueError:
        raise ConfigError(f"messages_mode must be auto, native or translate, not {settings.messages_mode!r}") from None


class EngineTokenizer:
    """Counts prompt tokens with the engine's tokenizer, when it has one.

    llama-cpp-python's tokenizer route adds the model's special tokens (BOS)
    to any text, while the chat prompt already carries them as text, so the
    count of an empty input is taken once and subtracted.
    """

    def __init__(self) -> None:
        self.available: bool | None = None  # None: not asked yet
        self._added: int | None = None

    async def count(self, upstream: Upstream, text: str) -> int | None:
        """Tokens in ``text`` as the engine reads a prompt, or None when the engine cannot say."""
        if self.available is False:
            return None
        if self._added is None:
            added = await self._count(upstream, "")
            if added is None:
                return None
            self._added = added
        total = await self._count(upstream, text)
        return None if total is None else max(0, total - self._added)

    async def _count(self, upstream: Upstream, text: str) -> int | None:
        try:
            response = await upstream.open("POST", TOKENIZE_COUNT_PATH, _JSON_HEADERS, orjson.dumps({"input": text}))
            try:
                raw = await response.read()
            finally:
                response.close()
        except (ToolpairError, aiohttp.ClientError) as exc:
            log.info("the engine could not tokenize: %s", getattr(exc, "message", exc))
            return None
        if response.status in (404, 405):
            self.available = False
            log.info("the engine has no %s: count_tokens answers estimates", TOKENIZE_COUNT_PATH)
            return None
        try:
            count = orjson.loads(raw).get("count") if response.status == 200 else None
        except (orjson.JSONDecodeError, AttributeError):
            count = None
        if not isinstance(count, int):
            log.info("the engine's tokenizer answered %d without a count", response.status)
            return None
        self.available = True
        return count


@dataclass
class AnthropicState:
    """Per-app state of the Anthropic routes."""

    mode: MessagesMode
    template: ChatTemplate | None
    tokenizer: EngineTokenizer


ANTHROPIC = web.AppKey("anthropic", AnthropicState)


def register_anthropic_routes(app: web.Application) -> None:
    """Add the Anthropic routes to ``app`` (call before the catch-all route).

    Raises :class:`~proxy.config.ConfigError` for a bad ``messages_mode``,
    ping interval or template file.
    """
    settings = app[SETTINGS]
    if settings.messages_ping_interval <= 0:
        raise ConfigError("messages_ping_interval must be more than 0 seconds")
    template = None
    if settings.count_tokens_template:
        try:
            template = ChatTemplate.from_file(settings.count_tokens_template)
        except TemplateError as exc:
            raise ConfigError(str(exc)) from None
    app[ANTHROPIC] = AnthropicState(messages_mode(settings), template, EngineTokenizer())
    app.router.add_post(MESSAGES_PATH, messages)
    app.router.add_post(COUNT_TOKENS_PATH, count_tokens)


def _anthropic_error(exc: ToolpairError) -> ToolpairError:
    """An engine's context overflow becomes Anthropic's ``prompt is too long`` error."""
    if isinstance(exc, UpstreamStatusError) and exc.status < 500:
        return context_overflow(exc.message) or exc
    return exc


# --- /v1/messages -------------------------------------------------------------------


async def messages(request: web.Request) -> web.StreamResponse:
    settings = request.app[SETTINGS]
    try:
        raw = await read_body(request, settings.max_body_bytes)
        if request.app[ANTHROPIC].mode is MessagesMode.NATIVE:
            return await _native(request, raw)
        plan = plan_translation(
            raw, engine_model=settings.messages_model, normalize_stamp=settings.normalize_billing_stamp
        )
        trace_of(request).order("anthropic", plan.report)
        if plan.stream:
            return await _stream(request, plan)
        async with request.app[ADMISSION](request, conversation_key(plan.chat.get("messages"))) as target:
            message = await _complete(request, plan, request.app[UPSTREAM].at(target))
        return web.Response(body=orjson.dumps(message), content_type="application/json")
    except ToolpairError as exc:
        return error_response(_anthropic_error(exc), Dialect.ANTHROPIC)


async def _native(request: web.Request, raw: bytes) -> web.StreamResponse:
    settings = request.app[SETTINGS]
    upstream = request.app[UPSTREAM]
    plan = plan_native(raw, engine_model=settings.messages_model, normalize_stamp=settings.normalize_billing_stamp)
    trace_of(request).order("anthropic", plan.report)
    headers = forwardable_headers(request.headers, _NATIVE_DROP)
    async with request.app[ADMISSION](request, None) as target:
        upstream = upstream.at(target)
        response = await upstream.open("POST", request.path_qs, headers, plan.body)
        if response.status >= 400 and response.content_type != "text/event-stream":
            try:
                answer = await response.read()
            except aiohttp.ClientError:
                answer = b""
            finally:
                response.close()
            error = native_error(response.status, answer)
            if error is not None:
                return error_response(error, Dialect.ANTHROPIC)
            return web.Response(status=response.status, body=answer, content_type="application/json")
        return await relay(request, upstream, response, Dialect.ANTHROPIC, raw=False)


async def _input_tokens(request: web.Request, chat: Body, upstream: Upstream) -> int:
    """Exact prompt tokens when a template and the engine's tokenizer allow it, else 0.

    Engines that stream no usage (llama-cpp-python) would otherwise leave a
    stream's ``input_tokens`` unknown, and Claude Code reads it to decide when to
    compact. Call inside the admission, before the generation: the engine
    tokenizes under the same lock as it generates.
    """
    state = request.app[ANTHROPIC]
    if state.template is None or state.tokenizer.available is False:
        return 0
    try:
        prompt = state.template.render(prepare_chat_body(chat)[0])
    except TemplateError as exc:
        log.info("no input token count: %s", exc)
        return 0
    return await state.tokenizer.count(upstream, prompt) or 0


async def _generate(
    upstream: Upstream, chat: Body, events: MessageEvents, emit: Callable[[list[Event]], Awaitable[None]]
) -> None:
    """Stream a generation through ``events``, handing each step's events to ``emit``.

    At a stop sequence the engine's response is closed, which ends the
    generation. An engine stream that ends before its first chunk is asked
    again without streaming, to learn its error: llama-cpp-python reports a
    prompt too long for its context only that way.
    """
    # chat_stream is an async generator; closing it closes the engine's response.
    chunks = chat_stream(upstream, {**chat, "stream_options": {"include_usage": True}})
    received = False
    try:
        async for chunk in chunks:
            received = True
            await emit(events.feed(chunk))
            if events.done:
                return
    except (UpstreamStatusError, UpstreamTimeoutError):
        raise  # the engine said what is wrong, or is not answering: asking it again would only wait again
    except UpstreamError:
        if received:
            raise
        await _diagnose(upstream, chat)
        raise
    finally:
        await chunks.aclose()
    if not received:
        await _diagnose(upstream, chat)
        raise UpstreamError("the engine ended the stream without answering")
    await emit(events.finish())


async def _diagnose(upstream: Upstream, chat: Body) -> None:
    """Raise the engine's own error for a request whose stream broke before it began, if it has one.

    Tried twice: llama-cpp-python closes the connection just after such a
    stream, while the client pool may already hold it for reuse, so the first
    try can meet a dead connection.
    """
    for _ in range(2):
        try:
            await chat_completion(upstream, {**chat, "max_tokens": 1})
            return
        except UpstreamStatusError as exc:
            raise _anthropic_error(exc) from None
        except UpstreamTimeoutError:
            return
        except UpstreamError as exc:
            log.info("diagnosing an empty stream: %s", exc.message)


async def _complete(request: web.Request, plan: TranslationPlan, upstream: Upstream) -> Body:
    """A non-stream message. With stop sequences, the engine is streamed, so it can be stopped at one."""
    if not plan.stop_sequences:
        completion = await chat_completion(upstream, plan.chat)
        return message_from_completion(completion, model=plan.model)
    events = MessageEvents(
        model=plan.model,
        input_tokens=await _input_tokens(request, plan.chat, upstream),
        stop_sequences=plan.stop_sequences,
    )
    accumulator = MessageAccumulator()

    async def collect(batch: list[Event]) -> None:
        for event in batch:
            accumulator.feed(event)

    await _generate(upstream, plan.chat, events, collect)
    assert accumulator.message is not None  # _generate ends the message or raises
    return accumulator.message


class _Pinger:
    """Sends a ping every ``interval`` seconds until stopped: the wait for the engine's first chunk."""

    def __init__(self, interval: float, send: Callable[[], Awaitable[None]]) -> None:
        self._interval = interval
        self._send = send
        self._stopped = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._stopped.wait(), self._interval)
                return
            except TimeoutError:
                await self._send()

    async def stop(self) -> None:
        """Stop pinging; a ping being written is finished first, so frames never interleave."""
        task, self._task = self._task, None
        if task is None:
            return
        self._stopped.set()
        # If the client left, the handler learns it on its next write.
        with contextlib.suppress(ConnectionResetError, aiohttp.ClientConnectionResetError):
            await task


async def _stream(request: web.Request, plan: TranslationPlan) -> web.StreamResponse:
    settings = request.app[SETTINGS]
    out = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream; charset=utf-8",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
    )
    events = MessageEvents(model=plan.model, stop_sequences=plan.stop_sequences)

    async def send(batch: list[bytes]) -> None:
        if not out.prepared:
            await out.prepare(request)
        if batch:
            await out.write(b"".join(batch))

    async def ping() -> None:
        await send(frames(events.ping()))

    pinger = _Pinger(settings.messages_ping_interval, ping)

    async def emit(batch: list[Event]) -> None:
        await pinger.stop()
        await send(frames(batch))

    pinger.start()
    try:
        async with request.app[ADMISSION](request, conversation_key(plan.chat.get("messages"))) as target:
            upstream = request.app[UPSTREAM].at(target)
            events.input_tokens = await _input_tokens(request, plan.chat, upstream)
            await _generate(upstream, plan.chat, events, emit)
    except ToolpairError as exc:
        await pinger.stop()
        error = _anthropic_error(exc)
        log.warning("%s %s: %s", request.method, request.path, log_message(error))
        if not out.prepared:
            return error_response(error, Dialect.ANTHROPIC)
        try:
            await out.write(error_event(error, Dialect.ANTHROPIC))
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            return out
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        log.info("%s %s: client went away", request.method, request.path)
        return out
    finally:
        await pinger.stop()
    await out.write_eof()
    return out


# --- /v1/messages/count_tokens --------------------------------------------------------


def _count_response(tokens: int, how: str) -> web.Response:
    return web.Response(
        body=orjson.dumps({"input_tokens": tokens}), content_type="application/json", headers={COUNT_HEADER: how}
    )


async def count_tokens(request: web.Request) -> web.StreamResponse:
    """Never an error status: Claude Code calls this often, and an estimate serves it better."""
    settings = request.app[SETTINGS]
    state = request.app[ANTHROPIC]
    try:
        raw = await read_body(request, settings.max_body_bytes)
    except ToolpairError:
        return _count_response(estimate_tokens(request.content_length or settings.max_body_bytes), "estimate")
    if state.mode is MessagesMode.NATIVE:
        return await _count_native(request, raw)
    try:
        plan = plan_translation(
            raw, engine_model=settings.messages_model, normalize_stamp=settings.normalize_billing_stamp
        )
    except ToolpairError as exc:
        log.info("count_tokens: estimating a request toolpair cannot translate: %s", exc.message)
        return _count_response(estimate_tokens(len(raw)), "estimate")
    chat = prepare_chat_body(plan.chat)[0]
    if state.template is None:
        return _count_response(estimate_tokens(len(orjson.dumps(chat))), "estimate")
    try:
        prompt = state.template.render(chat)
    except TemplateError as exc:
        log.info("count_tokens: %s", exc)
        return _count_response(estimate_tokens(len(orjson.dumps(chat))), "estimate")
    count: int | None = None
    try:
        async with request.app[ADMISSION](request, None) as target:
            count = await state.tokenizer.count(request.app[UPSTREAM].at(target), prompt)
    except ToolpairError as exc:
        log.info("count_tokens: the engine is not available: %s", exc.message)
    if count is None:
        return _count_response(estimate_tokens(len(prompt.encode())), "estimate")
    return _count_response(count, "exact")


async def _count_native(request: web.Request, raw: bytes) -> web.StreamResponse:
    settings = request.app[SETTINGS]
    upstream = request.app[UPSTREAM]
    try:
        plan = plan_native(raw, engine_model=settings.messages_model, normalize_stamp=settings.normalize_billing_stamp)
        headers = forwardable_headers(request.headers, _NATIVE_DROP)
        async with request.app[ADMISSION](request, None) as target:
            response = await upstream.at(target).open("POST", request.path_qs, headers, plan.body)
            try:
                answer = await response.read()
            finally:
                response.close()
        tokens = orjson.loads(answer).get("input_tokens") if response.status == 200 else None
    except (ToolpairError, aiohttp.ClientError, orjson.JSONDecodeError, AttributeError) as exc:
        log.info("count_tokens: the engine did not count: %s", getattr(exc, "message", exc))
        tokens = None
    if isinstance(tokens, int) and not isinstance(tokens, bool):
        return _count_response(tokens, "exact")
    return _count_response(estimate_tokens(len(raw)), "estimate")
