"""The ``/v1/messages`` and ``/v1/messages/count_tokens`` handlers.

Thin: read the body, ask :mod:`proxy.dialects.anthropic.request` for a plan, call the engine,
relay. Two modes (``messages_mode``):

- ``native`` forwards the Anthropic body (ordered) to an engine that speaks
  Anthropic Messages, and relays its answer as the chat route does;
- ``translate`` sends a Chat Completions body through
  :mod:`proxy.engine.client` and turns the answer back into Anthropic form.

In translate mode the client's headers never reach the engine, except its
credentials (``x-api-key``, ``Authorization``), which the engine checks as on
every path (unless toolpair checks keys of its own: see
:mod:`proxy.engine.upstream`); ``anthropic-*`` headers stay behind. Every engine call is made inside the app's
admission (:class:`~proxy.engine.client.EngineClient`), so the managed engine's queue applies.

Streams: the client's response is only started when there is something to
send, so an error before the first chunk is still a normal HTTP error. While
the engine reads a long prompt, a ``ping`` goes out every
``messages_ping_interval`` seconds (``message_start`` first); after that, a
failure ends the stream with ``event: error``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing
from dataclasses import dataclass

import orjson
from aiohttp import web

from proxy._types import Body
from proxy.config import ApiMode, ConfigError, Settings
from proxy.dialects.anthropic.accumulate import MessageAccumulator, message_from_completion
from proxy.dialects.anthropic.errors import native_error
from proxy.dialects.anthropic.events import MessageEvents, MessageFrames
from proxy.dialects.anthropic.request import TranslationPlan, plan_native, plan_translation
from proxy.engine.client import EngineCall, prepare_chat_body
from proxy.engine.route import plan_route
from proxy.engine.token_count import ChatTemplate, TemplateError, estimate_tokens
from proxy.engine.upstream import CREDENTIAL_HEADERS, forwardable_headers
from proxy.errors import Dialect, ToolpairError, UpstreamError
from proxy.http.body import read_body
from proxy.http.keys import ENGINE_CLIENT, ENGINE_WATCH, SETTINGS
from proxy.http.relay import relay
from proxy.http.routing import note_model, note_route
from proxy.http.streaming import stream_reply
from proxy.ops.trace import trace_of

__all__ = [
    "ANTHROPIC",
    "COUNT_HEADER",
    "MESSAGES_PATH",
    "AnthropicState",
    "messages_mode",
    "register_anthropic_routes",
]

log = logging.getLogger("toolpair")

MESSAGES_PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
COUNT_HEADER = "X-Toolpair-Token-Count"
"""On every count_tokens answer: ``exact`` (rendered and tokenized by the engine,
or counted by a native engine) or ``estimate`` (see :func:`proxy.engine.token_count.estimate_tokens`)."""

TOKENIZE_COUNT_PATH = "/extras/tokenize/count"
"""llama-cpp-python's tokenizer route: ``{"input": text}`` -> ``{"count": n}``."""

_JSON_HEADERS = {"Content-Type": "application/json"}
# Never forwarded to a native engine: compression, since errors may be rewritten. The client's
# credentials go as on every path, under the upstream's policy (proxy.engine.upstream): the
# engine checks them, unless toolpair checks keys of its own.
_NATIVE_DROP = ("accept-encoding",)
_ANSWER_DROP = ("content-length", "content-encoding")  # no longer true of the body once it was read


def messages_mode(settings: Settings) -> ApiMode:
    """The mode for these settings, ``native`` or ``translate``: ``auto`` is native only for llama-server.

    >>> messages_mode(Settings(messages_mode="auto")).value
    'translate'
    """
    return settings.messages_mode.resolve(settings.engine_kind)


class EngineTokenizer:
    """Counts prompt tokens with the engine's tokenizer, when it has one.

    llama-cpp-python's tokenizer route adds the model's special tokens (BOS)
    to any text, while the chat prompt already carries them as text, so the
    count of an empty input is taken once and subtracted.
    """

    def __init__(self) -> None:
        self.available: bool | None = None  # None: not asked yet
        self._added: int | None = None

    async def count(self, call: EngineCall, text: str, credentials: Mapping[str, str]) -> int | None:
        """Tokens in ``text`` as the engine reads a prompt, or None when the engine cannot say."""
        if self.available is False:
            return None
        if self._added is None:
            added = await self._count(call, "", credentials)
            if added is None:
                return None
            self._added = added
        total = await self._count(call, text, credentials)
        return None if total is None else max(0, total - self._added)

    async def _count(self, call: EngineCall, text: str, credentials: Mapping[str, str]) -> int | None:
        headers = {**credentials, **_JSON_HEADERS}
        try:
            async with call.open("POST", TOKENIZE_COUNT_PATH, headers, orjson.dumps({"input": text})) as response:
                status = response.status
                raw = await call.read(response)
        except ToolpairError as exc:
            log.info("the engine could not tokenize: %s", exc.message)
            return None
        if status in (404, 405):
            self.available = False
            log.info("the engine has no %s: count_tokens answers estimates", TOKENIZE_COUNT_PATH)
            return None
        try:
            count = orjson.loads(raw).get("count") if status == 200 else None
        except (orjson.JSONDecodeError, AttributeError):
            count = None
        if not isinstance(count, int):
            log.info("the engine's tokenizer answered %d without a count", status)
            return None
        self.available = True
        return count


@dataclass
class AnthropicState:
    """Per-app state of the Anthropic routes."""

    template: ChatTemplate | None
    tokenizer: EngineTokenizer


ANTHROPIC = web.AppKey("anthropic", AnthropicState)


def register_anthropic_routes(app: web.Application) -> None:
    """Add the Anthropic routes to ``app`` (call before the catch-all route).

    Raises :class:`~proxy.config.ConfigError` for a bad ping interval or template file.
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
    app[ANTHROPIC] = AnthropicState(template, EngineTokenizer())
    app.router.add_post(MESSAGES_PATH, messages)
    app.router.add_post(COUNT_TOKENS_PATH, count_tokens)


# --- /v1/messages -------------------------------------------------------------------


def _credentials(request: web.Request) -> dict[str, str]:
    """The client's credential headers, for an engine call toolpair makes on its behalf."""
    return {k: v for k, v in request.headers.items() if k.lower() in CREDENTIAL_HEADERS}


async def messages(request: web.Request) -> web.StreamResponse:
    settings = request.app[SETTINGS]
    raw = await read_body(request, settings.max_body_bytes)
    profile = request.app[ENGINE_CLIENT].setup.profile
    route = plan_route(MESSAGES_PATH, None, settings.messages_mode, ApiMode.AUTO.resolve(profile.kind), profile)
    note_route(request, "anthropic", route)
    if route.mode is ApiMode.NATIVE:
        return await _native(request, raw)
    plan = plan_translation(
        raw,
        engine_model=settings.messages_model,
        normalize_stamp=settings.normalize_billing_stamp,
        sees_images=request.app[ENGINE_CLIENT].setup.sees_images,
        names=request.app[ENGINE_CLIENT].model_names,
    )
    trace_of(request).order("anthropic", plan.report)
    note_model("anthropic", plan.model_plan)
    if plan.stream:
        events = MessageEvents(model=plan.model, stop_sequences=plan.stop_sequences)
        return await stream_reply(
            request,
            _chunks(request, plan, events),
            MessageFrames(events),
            ping_interval=settings.messages_ping_interval,
        )
    async with request.app[ENGINE_CLIENT].admitted(request, plan.chat, model=plan.model_plan) as call:
        if not plan.stop_sequences:
            completion = await call.completion(plan.chat, _credentials(request))
            message = message_from_completion(completion, model=plan.model)
        else:
            # With stop sequences the engine is streamed, so it can be stopped at one.
            events = MessageEvents(
                model=plan.model,
                input_tokens=await _input_tokens(request, call, plan.chat),
                stop_sequences=plan.stop_sequences,
            )
            message = await _collect(call, plan, events, _credentials(request))
    return web.Response(body=orjson.dumps(message), content_type="application/json")


async def _native(request: web.Request, raw: bytes) -> web.StreamResponse:
    settings = request.app[SETTINGS]
    plan = plan_native(
        raw,
        engine_model=settings.messages_model,
        normalize_stamp=settings.normalize_billing_stamp,
        thinking_switch=request.app[ENGINE_CLIENT].setup.profile.template_kwargs,
        names=request.app[ENGINE_CLIENT].model_names,
    )
    trace_of(request).order("anthropic", plan.report)
    note_model("anthropic", plan.model)
    headers = forwardable_headers(request.headers, _NATIVE_DROP)
    async with (
        request.app[ENGINE_CLIENT].admitted(request, model=plan.model) as call,
        call.open("POST", request.path_qs, headers, plan.body) as response,
    ):
        if response.status >= 400 and response.content_type != "text/event-stream":
            try:
                answer = await call.read(response)
            except UpstreamError:
                answer = b""
            error = call.name_refusal(response.status, answer) or native_error(response.status, answer)
            if error is not None:
                raise error
            out_headers = forwardable_headers(response.headers, _ANSWER_DROP)
            return web.Response(status=response.status, reason=response.reason, headers=out_headers, body=answer)
        return await relay(request, call, response, Dialect.ANTHROPIC, raw=False)


async def _input_tokens(request: web.Request, call: EngineCall, chat: Body) -> int:
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
    return await state.tokenizer.count(call, prompt, _credentials(request)) or 0


def _usage_asked(chat: Body) -> Body:
    return {**chat, "stream_options": {"include_usage": True}}


async def _chunks(
    request: web.Request, plan: TranslationPlan, events: MessageEvents
) -> AsyncGenerator[Body | None, None]:
    """The engine's chunks for a streamed message; admission is entered here, so pings cover a queue wait."""
    async with request.app[ENGINE_CLIENT].admitted(request, plan.chat, model=plan.model_plan) as call:
        events.input_tokens = await _input_tokens(request, call, plan.chat)
        async with aclosing(call.stream(_usage_asked(plan.chat), _credentials(request))) as chunks:
            async for chunk in chunks:
                yield chunk


async def _collect(
    call: EngineCall, plan: TranslationPlan, events: MessageEvents, credentials: Mapping[str, str]
) -> Body:
    """A whole message from a streamed generation, stopped at the first stop sequence."""
    accumulator = MessageAccumulator()
    async with aclosing(call.stream(_usage_asked(plan.chat), credentials)) as chunks:
        async for chunk in chunks:
            if chunk is None:
                continue
            for event in events.feed(chunk):
                accumulator.feed(event)
            if events.done:
                break
    for event in events.finish():
        accumulator.feed(event)
    assert accumulator.message is not None  # finish() ends the message or raises
    return accumulator.message


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
    if request.app[ENGINE_WATCH].mode(MESSAGES_PATH) is ApiMode.NATIVE:
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
        async with request.app[ENGINE_CLIENT].admitted(request) as call:
            count = await state.tokenizer.count(call, prompt, _credentials(request))
    except ToolpairError as exc:
        log.info("count_tokens: the engine is not available: %s", exc.message)
    if count is None:
        return _count_response(estimate_tokens(len(prompt.encode())), "estimate")
    return _count_response(count, "exact")


async def _count_native(request: web.Request, raw: bytes) -> web.StreamResponse:
    settings = request.app[SETTINGS]
    try:
        plan = plan_native(
            raw,
            engine_model=settings.messages_model,
            normalize_stamp=settings.normalize_billing_stamp,
            thinking_switch=request.app[ENGINE_CLIENT].setup.profile.template_kwargs,
            names=request.app[ENGINE_CLIENT].model_names,
        )
        headers = forwardable_headers(request.headers, _NATIVE_DROP)
        async with (
            request.app[ENGINE_CLIENT].admitted(request) as call,
            call.open("POST", request.path_qs, headers, plan.body) as response,
        ):
            status = response.status
            answer = await call.read(response)
        tokens = orjson.loads(answer).get("input_tokens") if status == 200 else None
    except (ToolpairError, orjson.JSONDecodeError, AttributeError) as exc:
        log.info("count_tokens: the engine did not count: %s", getattr(exc, "message", exc))
        tokens = None
    if isinstance(tokens, int) and not isinstance(tokens, bool):
        return _count_response(tokens, "exact")
    return _count_response(estimate_tokens(len(raw)), "estimate")
