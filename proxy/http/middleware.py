"""Errors answered in one place: a :class:`~proxy.errors.ToolpairError` becomes the route's error response.

Handlers raise; they never catch to answer. The access middleware (:mod:`proxy.ops.access`), the
one middleware around every request, calls :func:`error_answer`'s function with what a handler
raised, so that errors cost no middleware layer of their own. The route's dialect comes from its path
(:func:`proxy.errors.dialect_for_path`), and a dialect may map an error first: the app passes those
maps in (Anthropic turns an engine's context overflow into ``prompt is too long``,
:func:`proxy.dialects.anthropic.errors.anthropic_error`), so this layer knows no dialect's code.
A stream that already started reports failures in-band instead (:mod:`proxy.http.streaming`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from aiohttp import web

from proxy.errors import AuthenticationError, Dialect, ToolpairError, UpstreamError, dialect_for_path, error_body
from proxy.ops.privacy import log_message

__all__ = ["ErrorMaps", "error_answer", "error_response"]

log = logging.getLogger("toolpair")

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


def error_answer(maps: ErrorMaps | None = None) -> Callable[[web.Request, ToolpairError], web.Response]:
    """How a ToolpairError is answered, in the dialect of the path the client called."""

    def answer(request: web.Request, error: ToolpairError) -> web.Response:
        if isinstance(error, UpstreamError):
            log.warning("%s %s: %s", request.method, request.path, log_message(error))
        return error_response(error, dialect_for_path(request.path), maps)

    return answer
