"""One request to a toolpair under test, from a fresh client, read back whole.

The HTTP tests assert on the status, the body and the headers of one answer; an answer that is not JSON
(a stream, a plain-text error from outside toolpair) comes back as its bytes so the test can say so.
"""

from __future__ import annotations

from collections.abc import AsyncIterable
from typing import Any

import aiohttp
import orjson
from multidict import CIMultiDictProxy

__all__ = ["leave_mid_stream", "send_and_read"]


async def send_and_read(
    url: str, body: Any, path: str, *, method: str = "POST", **kw: Any
) -> tuple[int, Any, CIMultiDictProxy[str]]:
    """``method`` ``url + path`` with ``body`` (bytes, or an async stream of them, as they are; None for none; else
    as JSON): the answer's status, its JSON (its bytes when it is not JSON) and its headers."""
    data = body if body is None or isinstance(body, (bytes, AsyncIterable)) else orjson.dumps(body)
    async with aiohttp.ClientSession() as session, session.request(method, url + path, data=data, **kw) as response:
        raw = await response.read()
        try:
            return response.status, orjson.loads(raw), response.headers
        except orjson.JSONDecodeError:
            return response.status, raw, response.headers


async def leave_mid_stream(url: str, path: str, until: bytes, **kw: Any) -> None:
    """POST to ``url + path`` (``kw`` as aiohttp takes them), read the streamed answer up to ``until``, then close the
    connection: a client that goes away while the engine is still writing."""
    session = aiohttp.ClientSession()
    response = await session.post(url + path, **kw)
    await response.content.readuntil(until)
    response.close()
    await session.close()
