"""The aiohttp application: thin handlers around the pure pipeline.

Each handler decodes, asks the core for a plan, and relays. Errors raised by
the core or the upstream client are :class:`~proxy.errors.ToolpairError`
values and become responses in one place, :func:`error_response`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import aiohttp
from aiohttp import web

from proxy.adapt import refuse_completion_logprobs
from proxy.auth import keys_required
from proxy.config import Settings
from proxy.engine_plan import EngineSetup, engine_setup, plan_engine_request
from proxy.engine_relay import relay_rewritten
from proxy.errors import (
    BodyTimeoutError,
    BodyTooLargeError,
    Dialect,
    ToolpairError,
    UpstreamError,
    error_body,
    error_event,
)
from proxy.health import register_health_routes
from proxy.operations import register_operations
from proxy.queueing import conversation_key
from proxy.sse import FrameSplitter
from proxy.trace import trace_of
from proxy.upstream import EngineTarget, Upstream, forwardable_headers

__all__ = [
    "ADMISSION",
    "ENGINE",
    "Admission",
    "create_app",
    "error_response",
    "read_body",
    "relay",
    "SETTINGS",
    "UPSTREAM",
]

log = logging.getLogger("toolpair")

SETTINGS = web.AppKey("settings", Settings)
UPSTREAM = web.AppKey("upstream", Upstream)
ENGINE = web.AppKey("engine", EngineSetup)

Admission = Callable[[web.Request, str | None], AbstractAsyncContextManager[EngineTarget | None]]
"""Held around each upstream call, response included: where a queue or an
engine-readiness wait goes. It raises a ToolpairError to refuse a request.
Called with the request's conversation key (:func:`~proxy.queueing.conversation_key`);
it gives the engine to send to, or None for the app's upstream."""


@asynccontextmanager
async def admit_all(request: web.Request, conversation: str | None = None) -> AsyncIterator[EngineTarget | None]:
    """The sidecar default: every request goes straight upstream."""
    yield None


ADMISSION: web.AppKey[Admission] = web.AppKey("admission")

# Request headers that never go upstream from an API route: we may rewrite the
# response, so it must come back uncompressed.
_API_DROP = ("accept-encoding",)
# Response headers that no longer describe the bytes we send once we relay them.
_RELAY_DROP = ("content-length", "content-encoding")
# A plain (not event-stream) response up to this size is read whole and sent in
# one write: fewer round trips through the event loop than a chunked relay.
_BUFFER_LIMIT = 1 << 20


def error_response(error: ToolpairError, dialect: Dialect) -> web.Response:
    """The one place a ToolpairError becomes an HTTP response."""
    return web.Response(
        status=error.status,
        body=error_body(error, dialect),
        content_type="application/json",
        headers={
            "X-Toolpair-Error": error.code,
            **({"Retry-After": str(error.retry_after)} if error.retry_after else {}),
        },
    )


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


async def relay(
    request: web.Request,
    upstream: Upstream,
    response: aiohttp.ClientResponse,
    dialect: Dialect,
    *,
    raw: bool,
) -> web.StreamResponse:
    """Relay an upstream response to the client chunk by chunk, never buffering it whole.

    ``raw`` relays bytes untouched (content encoding and length included).
    Otherwise an event stream is relayed whole frames at a time, so a failure
    can be reported in-band without a half-written frame before it.
    """
    headers = forwardable_headers(response.headers, () if raw else _RELAY_DROP)
    is_sse = response.content_type == "text/event-stream"
    length = response.content_length
    if not is_sse and length is not None and length <= _BUFFER_LIMIT and request.method != "HEAD":
        try:
            body = await upstream.read(response)
        except UpstreamError as exc:
            response.close()
            return error_response(exc, dialect)
        response.release()
        return web.Response(status=response.status, reason=response.reason, headers=headers, body=body)
    if raw and length is not None:
        headers["Content-Length"] = str(length)
    if is_sse:
        headers["Cache-Control"] = "no-cache"
        headers["X-Accel-Buffering"] = "no"
    out = web.StreamResponse(status=response.status, reason=response.reason, headers=headers)
    splitter = FrameSplitter() if is_sse and not raw else None
    complete = False
    try:
        await out.prepare(request)
        async for chunk in upstream.chunks(response):
            if splitter is None:
                await out.write(chunk)
            else:
                frames = splitter.feed(chunk)
                if frames:
                    await out.write(b"".join(frames))
        if splitter is not None and splitter.pending.strip():
            raise UpstreamError(f"upstream {upstream.base_url} ended its stream inside an event")
        complete = True
    except UpstreamError as exc:
        log.warning("%s %s: %s", request.method, request.path, exc.message)
        if splitter is None:
            # A plain body cannot carry an error any more: cut the connection so
            # the client sees a truncated response rather than a short valid one.
            if request.transport is not None:
                request.transport.close()
            return out
        await out.write(error_event(exc, dialect))
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        log.info("%s %s: client went away", request.method, request.path)
        return out
    finally:
        if complete:
            response.release()
        else:
            response.close()
    await out.write_eof()
    return out


async def chat_completions(request: web.Request) -> web.StreamResponse:
    settings = request.app[SETTINGS]
    upstream = request.app[UPSTREAM]
    try:
        engine = request.app[ENGINE]
        plan = plan_engine_request(await read_body(request, settings.max_body_bytes), engine)
        trace_of(request).order("chat", plan.order)
        if plan.adapted:
            log.debug("chat: adapted for %s: %s", engine.profile.kind, ", ".join(plan.adapted))
        headers = forwardable_headers(request.headers, _API_DROP)
        async with request.app[ADMISSION](request, conversation_key(plan.data.get("messages"))) as target:
            upstream = upstream.at(target)
            response = await upstream.open("POST", request.path_qs, headers, plan.body)
            if plan.reply is None or response.status >= 400:
                return await relay(request, upstream, response, Dialect.OPENAI, raw=False)
            return await relay_rewritten(request, upstream, response, plan, engine, headers)
    except ToolpairError as exc:
        return error_response(exc, Dialect.OPENAI)


async def passthrough(request: web.Request) -> web.StreamResponse:
    """Forward any other route transparently: method, path, query, headers, body, status."""
    settings = request.app[SETTINGS]
    upstream = request.app[UPSTREAM]
    try:
        body = await read_body(request, settings.max_body_bytes) if request.body_exists else None
        if request.method == "POST" and request.path in ("/v1/completions", "/completions"):
            refuse_completion_logprobs(body, request.app[ENGINE].profile)
        async with request.app[ADMISSION](request, None) as target:
            upstream = upstream.at(target)
            response = await upstream.open(request.method, request.path_qs, forwardable_headers(request.headers), body)
            return await relay(request, upstream, response, Dialect.OPENAI, raw=True)
    except ToolpairError as exc:
        return error_response(exc, Dialect.OPENAI)


async def _upstream_ctx(app: web.Application) -> AsyncIterator[None]:
    upstream = app[UPSTREAM]
    await upstream.start()
    yield
    await upstream.close()


def create_app(
    settings: Settings, upstream: Upstream | None = None, admission: Admission = admit_all
) -> web.Application:
    """Build the proxy application for ``settings`` (sidecar mode needs ``settings.upstream``)."""
    if upstream is None:
        if not settings.upstream:
            raise ValueError("an upstream URL is required")
        upstream = Upstream(
            settings.upstream,
            connect_timeout=settings.connect_timeout,
            read_timeout=settings.upstream_read_timeout,
            api_key=settings.upstream_api_key,
            forward_credentials=not keys_required(settings),
        )
    app = web.Application(client_max_size=settings.max_body_bytes)
    app[SETTINGS] = settings
    app[UPSTREAM] = upstream
    app[ENGINE] = upstream.engine = engine_setup(settings)
    app[ADMISSION] = admission
    app.cleanup_ctx.append(_upstream_ctx)
    register_operations(app, settings, upstream.base_url)
    for path in ("/v1/chat/completions", "/chat/completions"):
        app.router.add_post(path, chat_completions)
    from proxy.anthropic_routes import register_anthropic_routes  # they import this module
    from proxy.responses_routes import register_responses_routes

    register_anthropic_routes(app)
    register_responses_routes(app)
    register_health_routes(app)
    app.router.add_route("*", "/{tail:.*}", passthrough, name="passthrough")
    return app
