"""Chat Completions calls made on behalf of the translating front ends.

The Anthropic and Responses routes translate their request into a Chat
Completions body, then call the engine through :func:`chat_completion` or
:func:`chat_stream`, which return plain dicts: a ``chat.completion`` object, or
``chat.completion.chunk`` objects one by one. Whatever the engine needs
happens inside, so every front end gets the same treatment as
``/v1/chat/completions``: the request is adapted to the engine
(:mod:`proxy.engine.adapt`), and tool calls and reasoning are lifted out of the
reply's text, with usage counted when a stream asks for it and the engine
sends none. The engine is the one bound to ``upstream`` by the app
(``upstream.engine``), or ``engine=`` when given. Ordering is
:func:`prepare_chat_body`, which the front ends call first.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from typing import Any

import aiohttp
import orjson
from multidict import CIMultiDict

from proxy._types import Body
from proxy.engine.adapt import adapt_chat_request
from proxy.engine.plan import GENERIC, EngineSetup, reply_plan
from proxy.engine.replies import decode_chunk, read_json_object
from proxy.engine.stream_usage import count_usage, usage_chunk
from proxy.engine.toolcalls import ChunkExtractor, extract_completion
from proxy.engine.upstream import Upstream
from proxy.errors import UpstreamError, UpstreamStatusError
from proxy.ops.trace import note_toolcalls
from proxy.order import OrderReport, order_chat_results
from proxy.sse import EventDecoder

__all__ = ["CHAT_PATH", "chat_completion", "chat_stream", "prepare_chat_body"]

CHAT_PATH = "/v1/chat/completions"
_JSON_HEADERS = {"Content-Type": "application/json"}


def prepare_chat_body(body: Body) -> tuple[Body, OrderReport]:
    """Ordering for a translated body, which has no client bytes to preserve."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return body, OrderReport()
    ordered, report = order_chat_results(messages)
    return (body if ordered is messages else {**body, "messages": ordered}), report


def _engine_message(raw: bytes) -> str:
    try:
        data: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw.decode("utf-8", "replace")[:500] or "no body"
    if isinstance(data, dict):
        error = data.get("error", data.get("detail", data))
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
    return raw.decode("utf-8", "replace")[:500]


def _headers(extra: Mapping[str, str] | None) -> Mapping[str, str]:
    if not extra:
        return _JSON_HEADERS
    merged = CIMultiDict(extra)
    merged.update(_JSON_HEADERS)
    return merged


def _adapted(upstream: Upstream, body: Body, engine: EngineSetup | None, stream: bool) -> tuple[Body, EngineSetup]:
    setup = engine or upstream.engine or GENERIC
    adapted, _ = adapt_chat_request({**body, "stream": stream}, setup.profile)
    return adapted, setup


async def _open(upstream: Upstream, body: Body, headers: Mapping[str, str]) -> aiohttp.ClientResponse:
    response = await upstream.open("POST", CHAT_PATH, headers, orjson.dumps(body))
    if response.status >= 400:
        try:
            raw = await response.read()
        except aiohttp.ClientError:
            raw = b""
        finally:
            response.close()
        raise UpstreamStatusError(_engine_message(raw), status=response.status)
    return response


async def chat_completion(
    upstream: Upstream,
    body: Body,
    headers: Mapping[str, str] | None = None,
    *,
    engine: EngineSetup | None = None,
) -> Body:
    """One non-streaming completion, as a dict; ``headers`` are sent too (e.g. Authorization).

    Raises :class:`~proxy.errors.ClientInputError` for a request the engine
    cannot serve (see :mod:`proxy.engine.adapt`).
    """
    adapted, setup = _adapted(upstream, body, engine, stream=False)
    plan = reply_plan(adapted, setup)
    response = await _open(upstream, adapted, _headers(headers))
    _, data = await read_json_object(upstream, response)
    return data if plan is None else extract_completion(data, plan.extract, note=note_toolcalls)


async def chat_stream(
    upstream: Upstream,
    body: Body,
    headers: Mapping[str, str] | None = None,
    *,
    engine: EngineSetup | None = None,
) -> AsyncGenerator[Body, None]:
    """Stream a completion as chunk dicts; stops at ``[DONE]`` or end of stream.

    A broken stream, a malformed event or an error event raises an
    :class:`~proxy.errors.UpstreamError`, so the caller can end its own stream
    with an in-band error in its dialect. With ``stream_options.include_usage``
    the last chunk carries usage, counted by toolpair if the engine sends none.
    """
    adapted, setup = _adapted(upstream, body, engine, stream=True)
    plan = reply_plan(adapted, setup)
    extractor = ChunkExtractor(plan.extract, keep_text=plan.usage, note=note_toolcalls) if plan is not None else None
    sent = _headers(headers)
    response = await _open(upstream, adapted, sent)
    decoder = EventDecoder()
    done = False
    try:
        async for raw in upstream.chunks(response):
            for event in decoder.feed(raw):
                if event.data == "[DONE]":
                    done = True
                    break
                data = decode_chunk(event.data, upstream.base_url)
                if "error" in data and "choices" not in data:
                    message = f"upstream error: {_engine_message(event.data.encode())}"
                    raise UpstreamError(message, quotes_engine=True)
                for chunk in extractor.feed(data) if extractor is not None else (data,):
                    yield chunk
            if done:
                break
        if not done and decoder.pending:
            raise UpstreamError(f"upstream {upstream.base_url} ended its stream inside an event")
    finally:
        response.close()
    if extractor is None:
        return
    for chunk in extractor.finish():
        yield chunk
    count_path = setup.profile.token_count_path
    if plan is not None and plan.usage and done and not extractor.usage_seen and count_path is not None:
        usage = await count_usage(upstream, CHAT_PATH, count_path, sent, adapted, "".join(extractor.text))
        if usage is not None:
            yield usage_chunk(extractor.head, usage)
