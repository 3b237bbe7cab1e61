"""Reading a request body: bounded in size and in time."""

from __future__ import annotations

import asyncio

from aiohttp import web

from proxy.errors import BodyTimeoutError, BodyTooLargeError
from proxy.http.keys import SETTINGS

__all__ = ["read_body"]


async def read_body(request: web.Request, limit: int) -> bytes:
    """Read the whole request body, refusing more than ``limit`` bytes up front where possible.

    A body that has not fully arrived after ``body_read_timeout`` seconds is a 408: a client that
    announces a body and stops sending must not hold a handler forever.
    """
    timeout = request.app[SETTINGS].body_read_timeout if SETTINGS in request.app else None
    if timeout is None or request.content.is_eof():
        return await _read_body(request, limit)  # nothing left to wait for: no timer needed
    try:
        async with asyncio.timeout(timeout):
            return await _read_body(request, limit)
    except TimeoutError:
        raise BodyTimeoutError(f"the request body did not arrive within {timeout:g} s") from None


async def _read_body(request: web.Request, limit: int) -> bytes:
    if request.content_length is not None:
        if request.content_length > limit:
            raise BodyTooLargeError(f"request body of {request.content_length} bytes is over the {limit}-byte limit")
        return await request.read()
    body = bytearray()
    async for chunk in request.content.iter_any():
        body += chunk
        if len(body) > limit:
            raise BodyTooLargeError(f"request body is over the {limit}-byte limit")
    return bytes(body)
