"""Errors in one layer: a :class:`~proxy.errors.ToolpairError` from any handler becomes the route's error response.

Handlers raise; they never catch to answer. The route's dialect comes from its path
(:func:`proxy.errors.dialect_for_path`), and a dialect may map an error first: Anthropic turns an
engine's context overflow into ``prompt is too long`` (:func:`proxy.dialects.anthropic.errors.anthropic_error`).
A stream that already started reports failures in-band instead (:mod:`proxy.http.streaming`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from proxy.dialects.anthropic.errors import anthropic_error
from proxy.errors import AuthenticationError, Dialect, ToolpairError, UpstreamError, dialect_for_path, error_body
from proxy.ops.privacy import log_message

__all__ = ["error_middleware", "error_response"]

log = logging.getLogger("toolpair")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_DIALECT_ERRORS: dict[Dialect, Callable[[ToolpairError], ToolpairError]] = {Dialect.ANTHROPIC: anthropic_error}
"""Per dialect, how an error is shown to its clients (the hook for Anthropic's context overflow)."""


def error_response(error: ToolpairError, dialect: Dialect) -> web.Response:
    """The one place a ToolpairError becomes an HTTP response."""
    error = _DIALECT_ERRORS.get(dialect, _same)(error)
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


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Answer a ToolpairError raised by ``handler`` in the dialect of the path the client called."""
    try:
        return await handler(request)
    except ToolpairError as exc:
        if isinstance(exc, UpstreamError):
            log.warning("%s %s: %s", request.method, request.path, log_message(exc))
        return error_response(exc, dialect_for_path(request.path))
