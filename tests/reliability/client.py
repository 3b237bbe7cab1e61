"""A plain HTTP client for the suite: one request, the whole answer, and a deadline it must meet.

aiohttp's client raises if a body ends without its chunked terminator, so a
response read here ended cleanly; a hang fails the test at ``deadline`` instead of
stalling the suite.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from multidict import CIMultiDict, CIMultiDictProxy

from tests.reliability.workload import PATHS

__all__ = ["Answer", "post", "send"]

HEADERS = {"Content-Type": "application/json", "anthropic-version": "2023-06-01"}


@dataclass
class Answer:
    status: int
    headers: CIMultiDictProxy[str]
    body: bytes
    seconds: float

    def json(self) -> Any:
        return orjson.loads(self.body)

    @property
    def toolpairs(self) -> bool:
        """Whether toolpair produced this error itself (not the engine)."""
        return "X-Toolpair-Error" in self.headers


async def send(
    url: str,
    method: str = "POST",
    data: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    deadline: float = 20.0,
) -> Answer:
    """One request on a fresh connection; the whole answer must arrive within ``deadline`` seconds.

    ``headers`` replace the defaults of the same name; a multidict may repeat a name.
    """
    started = time.monotonic()
    sent = CIMultiDict(HEADERS)
    for name in headers or {}:
        sent.popall(name, None)
    sent.extend(headers or {})
    async with (
        asyncio.timeout(deadline),
        aiohttp.ClientSession() as session,
        session.request(method, url, data=data, headers=sent) as response,
    ):
        body = await response.read()
        return Answer(response.status, response.headers, body, time.monotonic() - started)


async def post(base: str, api: str, body: dict[str, Any] | bytes, **options: Any) -> Answer:
    """POST ``body`` to the route of ``api`` (``chat``, ``anthropic``, ``responses``) on ``base``."""
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    return await send(base + PATHS[api], data=data, **options)
