"""An engine's replies read into dicts: a whole JSON object, or the chunk one stream event carries.

Shared by the chat route's rewriting relay, :mod:`proxy.engine.client` and
:mod:`proxy.engine.stream_usage`; a reply that is not what Chat Completions promises
is an :class:`~proxy.errors.UpstreamError` (502) naming the upstream.
"""

from __future__ import annotations

import aiohttp
import orjson

from proxy._types import Body
from proxy.engine.upstream import Upstream
from proxy.errors import UpstreamError

__all__ = ["decode_chunk", "read_json_object"]


async def read_json_object(upstream: Upstream, response: aiohttp.ClientResponse) -> tuple[bytes, Body]:
    """The whole body, as bytes and as the JSON object it must be; the response is closed after."""
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
    return raw, data


def decode_chunk(data: str, upstream: str) -> Body:
    """One stream event's data as a chunk dict (``[DONE]`` is the caller's business).

    >>> decode_chunk('{"choices": []}', "http://engine")
    {'choices': []}
    """
    try:
        chunk = orjson.loads(data)
    except orjson.JSONDecodeError:
        chunk = None
    if not isinstance(chunk, dict):
        raise UpstreamError(f"upstream {upstream} sent a malformed event")
    return chunk
