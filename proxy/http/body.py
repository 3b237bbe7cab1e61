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
    settings = request.app.get(SETTINGS)
    timeout = settings.body_read_timeout if settings is not None else None
    if timeout is None or request.content.is_eof():  # nothing left to wait for: no timer needed
        length = request.content_length
        if length is None:
            return await _read_body(request, limit)
        if length > limit:
            raise BodyTooLargeError(f"request body of {length} bytes is over the {limit}-byte limit")
        return await request.read()
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
