"""Chat Completions calls made on behalf of the translating front ends.

The Anthropic and Responses routes translate their request into a Chat
Completions body, then call the engine through :func:`chat_completion` or
:func:`chat_stream`, which return plain dicts: a ``chat.completion`` object, or
``chat.completion.chunk`` objects one by one. Whatever the engine needs
(ordering, engine adaptation, tool-call extraction from raw text) happens
inside, so every front end gets the same treatment as ``/v1/chat/completions``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from typing import Any

import aiohttp
import orjson

from proxy._types import Body
from proxy.errors import UpstreamError, UpstreamStatusError
from proxy.order import OrderReport, order_chat_results
from proxy.sse import EventDecoder
from proxy.upstream import Upstream

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


async def _open(upstream: Upstream, body: Body, headers: Mapping[str, str] | None) -> aiohttp.ClientResponse:
    response = await upstream.open("POST", CHAT_PATH, {**(headers or {}), **_JSON_HEADERS}, orjson.dumps(body))
    if response.status >= 400:
        try:
            raw = await response.read()
        except aiohttp.ClientError:
            raw = b""
        finally:
            response.close()
        raise UpstreamStatusError(_engine_message(raw), status=response.status)
    return response


async def chat_completion(upstream: Upstream, body: Body, headers: Mapping[str, str] | None = None) -> Body:
    """One non-streaming completion, as a dict.

    ``headers`` go to the engine too (e.g. the client's ``Authorization`` for an engine with a key).
    """
    response = await _open(upstream, {**body, "stream": False}, headers)
    try:
        raw = b"".join([chunk async for chunk in upstream.chunks(response)])
    finally:
        response.close()
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise UpstreamError(f"upstream {upstream.base_url} answered with invalid JSON") from None
    if not isinstance(data, dict):
        raise UpstreamError(f"upstream {upstream.base_url} answered with a non-object")
    return data


async def chat_stream(
    upstream: Upstream, body: Body, headers: Mapping[str, str] | None = None
) -> AsyncGenerator[Body, None]:
    """Stream a completion as chunk dicts; stops at ``[DONE]`` or end of stream.

    A broken stream, a malformed event or an error event raises an
    :class:`~proxy.errors.UpstreamError`, so the caller can end its own stream
    with an in-band error in its dialect.
    """
    response = await _open(upstream, {**body, "stream": True}, headers)
    decoder = EventDecoder()
    try:
        async for raw in upstream.chunks(response):
            for event in decoder.feed(raw):
                if event.data == "[DONE]":
                    return
                try:
                    data = orjson.loads(event.data)
                except orjson.JSONDecodeError:
                    raise UpstreamError(f"upstream {upstream.base_url} sent a malformed event") from None
                if not isinstance(data, dict):
                    raise UpstreamError(f"upstream {upstream.base_url} sent a malformed event")
                if "error" in data and "choices" not in data:
                    raise UpstreamError(f"upstream error: {_engine_message(event.data.encode())}")
                yield data
    finally:
        response.close()
