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

__all__ = ["send_and_read"]


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
