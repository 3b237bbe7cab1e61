"""Errors in one layer: a :class:`~proxy.errors.ToolpairError` from any handler becomes the route's error response.

Handlers raise; they never catch to answer. The route's dialect comes from its path
(:func:`proxy.errors.dialect_for_path`), and a dialect may map an error first: the app passes those
maps in (Anthropic turns an engine's context overflow into ``prompt is too long``,
:func:`proxy.dialects.anthropic.errors.anthropic_error`), so this layer knows no dialect's code.
A stream that already started reports failures in-band instead (:mod:`proxy.http.streaming`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web
from aiohttp.typedefs import Middleware

from proxy.errors import AuthenticationError, Dialect, ToolpairError, UpstreamError, dialect_for_path, error_body
from proxy.ops.privacy import log_message

__all__ = ["ErrorMaps", "error_middleware", "error_response"]

log = logging.getLogger("toolpair")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

ErrorMaps = Mapping[Dialect, Callable[[ToolpairError], ToolpairError]]
"""Per dialect, how an error is shown to its clients (the hook for Anthropic's context overflow)."""


def error_response(error: ToolpairError, dialect: Dialect, maps: ErrorMaps | None = None) -> web.Response:
    """The one place a ToolpairError becomes an HTTP response."""
    error = (maps or {}).get(dialect, _same)(error)
    response = web.Response(
        status=error.status,
        body=error_body(error, dialect),
        content_type="application/json",
        headers={
            "X-Toolpair-Error": error.code,
            **({"Retry-After": str(error.retry_after)} if error.retry_after else {}),
        },
    )
    if isinstance(error, AuthenticationError):
        response.headers["WWW-Authenticate"] = 'Bearer realm="toolpair"'
    return response


def _same(error: ToolpairError) -> ToolpairError:
    return error


def error_middleware(maps: ErrorMaps | None = None) -> Middleware:
    """The middleware answering a ToolpairError in the dialect of the path the client called."""

    @web.middleware
    async def answer_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except ToolpairError as exc:
            if isinstance(exc, UpstreamError):
                log.warning("%s %s: %s", request.method, request.path, log_message(exc))
            return error_response(exc, dialect_for_path(request.path), maps)

    return answer_errors
