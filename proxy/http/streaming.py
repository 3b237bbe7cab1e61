"""The one streaming handler: engine chunk dicts in, any dialect's server-sent events out.

Each dialect provides a :class:`DialectStream` (a sync transducer from chunk dicts to SSE bytes);
:func:`stream_reply` drives it and owns everything around it:

- headers: an event stream that proxies must not buffer;
- the start: the client's response begins only when there is something to send, so an engine
  that refuses the request before its first chunk still gets the client a plain HTTP error
  (raised from here, and answered by the error middleware in the route's dialect);
- pings: every ``ping_interval`` seconds while the first chunk is awaited (Anthropic), or each
  time the engine sends bytes that complete no chunk (Chat: the engine's own keep-alive);
- errors after the start: the dialect's error event ends the stream;
- a client that goes away: logged, and the engine's stream is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Protocol

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from proxy._types import Body
from proxy.errors import ToolpairError
from proxy.ops.privacy import log_message

__all__ = ["SSE_HEADERS", "DialectStream", "stream_reply"]

log = logging.getLogger("toolpair")

SSE_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


class DialectStream(Protocol):
    """One dialect's stream: chunk dicts in, SSE bytes out. No I/O."""

    @property
    def done(self) -> bool:
        """True once the dialect ended the answer itself (a stop sequence): the engine is stopped."""
        ...

    def start(self) -> bytes:
        """What opens the stream (e.g. ``response.created``)."""
        ...

    def feed(self, chunk: Body) -> bytes: ...

    def ping(self) -> bytes:
        """A keep-alive; empty when the dialect has none."""
        ...

    def finish(self) -> bytes:
        """The end of a complete answer; raises an UpstreamError when the answer is not complete."""
        ...

    def fail(self, error: ToolpairError) -> bytes:
        """The dialect's in-band error, ending the stream."""
        ...


async def stream_reply(
    request: web.Request,
    chunks: AsyncGenerator[Body | None, None],
    stream: DialectStream,
    *,
    headers: Mapping[str, str] | None = None,
    ping_interval: float | None = None,
    engine_pings: bool = False,
    before_finish: Callable[[], Awaitable[None]] | None = None,
) -> web.StreamResponse:
    """Answer ``request`` with ``stream`` fed from ``chunks`` (``None``: the engine is alive, no chunk yet).

    ``before_finish`` runs once the answer is complete and before its last events are sent (the
    Responses store keeps the answer there, so a client that reads ``response.completed`` finds it).
    Closes ``chunks`` before returning, which closes the engine's response.
    """
    merged = CIMultiDict(SSE_HEADERS)
    merged.update(headers or {})
    out = web.StreamResponse(headers=merged)

    async def begin() -> None:
        if not out.prepared:
            await out.prepare(request)
            head = stream.start()
            if head:
                await out.write(head)

    async def send(data: bytes) -> None:
        if data:
            await begin()
            await out.write(data)

    try:
        try:
            first = await _first_chunk(chunks, stream, send, ping_interval, engine_pings)
            if first is not None:
                await begin()
                await send(stream.feed(first))
            if not stream.done:
                async for chunk in chunks:
                    if chunk is None:
                        if engine_pings:
                            await send(stream.ping())
                        continue
                    data = stream.feed(chunk)
                    if data:
                        await send(data)
                    if stream.done:
                        break
            end = stream.finish()
            if before_finish is not None:
                await before_finish()
            await begin()
            await send(end)
        except ToolpairError as exc:
            if not out.prepared:
                raise  # nothing sent yet: a plain HTTP error, from the error middleware
            log.warning("%s %s: %s", request.method, request.path, log_message(exc))
            await out.write(stream.fail(exc))
        finally:
            await chunks.aclose()
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        log.info("%s %s: client went away", request.method, request.path)
        return out
    await out.write_eof()
    return out


async def _first_chunk(
    chunks: AsyncGenerator[Body | None, None],
    stream: DialectStream,
    send: Callable[[bytes], Awaitable[None]],
    ping_interval: float | None,
    engine_pings: bool,
) -> Body | None:
    """Wait for the engine's first chunk, pinging as the dialect wants; None when the stream has none."""
    while True:
        if ping_interval is None:
            item = await anext(chunks, _END)
        else:
            item = await _with_pings(chunks, stream, send, ping_interval)
        if item is _END:
            return None
        if isinstance(item, dict):
            return item
        if engine_pings:
            await send(stream.ping())


_END = object()


async def _with_pings(
    chunks: AsyncGenerator[Body | None, None],
    stream: DialectStream,
    send: Callable[[bytes], Awaitable[None]],
    interval: float,
) -> object:
    """The next item of ``chunks`` (or :data:`_END`), with a ping every ``interval`` seconds meanwhile."""
    task = asyncio.ensure_future(anext(chunks, _END))
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=interval)
            if done:
                return task.result()
            await send(stream.ping())
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
