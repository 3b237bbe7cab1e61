"""One trace, one access line and one set of metric samples per request.

The outermost middleware, and the one that answers errors. It gives the request its id (the
client's valid ``X-Request-ID``, or a new one), opens a :class:`~proxy.ops.trace.Trace`, runs
everything else, turns a :class:`~proxy.errors.ToolpairError` raised by it into the error response
that the app's ``answer_error`` makes (one layer for both: each middleware layer is a call and a
frame more on every request), and when the response is finished (the last byte of a stream
included) writes the access line and records the metrics, except for reads of
toolpair's own state (scrapes, probes, status) and ``GET``/``HEAD`` reads of the engine's state that
toolpair forwards (``/props``, ``/slots``, ``/v1/models``...), which leave every metric as it was. The id goes back in
the response's ``X-Request-ID`` header, set just before headers are sent.

The access line holds the method, the path without its query string (where
clients sometimes put keys), the route, status, duration, what ordering did,
upstream time to first byte and token usage. Bodies appear only with
``log_bodies: true``, on their own ``toolpair.body`` lines.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from proxy.errors import ToolpairError
from proxy.ops.logs import accept_request_id
from proxy.ops.metrics import Metrics
from proxy.ops.paths import METRICS_PATH, PROBE_PATHS, STATUS_PATH, TOOLPAIR_METRICS_PATH
from proxy.ops.privacy import hide_bodies, show_bodies
from proxy.ops.trace import TRACE, Trace, bind, unbind
from proxy.ops.usage import Usage

__all__ = ["ErrorAnswer", "access_middleware", "route_label", "stamp_request_id"]

access_log = logging.getLogger("toolpair.access")
body_log = logging.getLogger("toolpair.body")

ErrorAnswer = Callable[[web.Request, ToolpairError], web.StreamResponse]
"""Turns an error a handler raised into the response for the route's dialect (:mod:`proxy.http.middleware`)."""

CLIENT_CLOSED = 499
"""Status recorded when the client left before an answer (nginx's convention)."""

_SUMMARIZED = ("method", "path", "status", "duration_ms")
"""Fields the access message already spells out; the text format leaves them out."""

_QUIET = PROBE_PATHS | {METRICS_PATH, TOOLPAIR_METRICS_PATH}
"""Polled every few seconds by machines: logged at debug level only."""

_READ_ONLY = _QUIET | {STATUS_PATH}
"""Reads of toolpair's own state: never counted in the metrics, so that reading changes nothing it reads
(two scrapes with nothing between them are the same bytes). They still get a request id and an access line."""

_ENGINE_STATUS = frozenset({"/props", "/slots", "/models", "/v1/models", "/v1/health", "/lora-adapters"})
"""Reads of the engine's state, forwarded as they are (llama-server serves them all; other engines some):
not counted either when read with ``GET`` or ``HEAD``. A ``POST`` to one (``/props``, ``/lora-adapters``
and llama-server's router ``/models`` change things) is counted like any request."""

_READS = frozenset({"GET", "HEAD"})


def _counted(request: web.Request) -> bool:
    """Whether ``request`` goes into the metrics: not when it only reads toolpair's or the engine's state."""
    path = request.path
    if path in _READ_ONLY:
        return False
    return not (path in _ENGINE_STATUS and request.method in _READS)


def route_label(request: web.Request) -> str:
    """A bounded name for the route that served ``request``: its name, else its path pattern."""
    info = request.match_info
    if info.http_exception is not None:
        return "unmatched"
    route = info.route
    if route.name:
        return route.name
    resource = route.resource
    return resource.canonical if resource is not None else "unknown"


def access_middleware(metrics: Metrics, log_bodies: bool, answer_error: ErrorAnswer) -> Middleware:
    """The middleware for one app: ``metrics`` is where its samples go, ``answer_error`` answers errors."""

    @web.middleware
    async def observe(request: web.Request, handler: Handler) -> web.StreamResponse:
        trace = Trace(accept_request_id(request.headers.get("X-Request-ID")), keep_bodies=log_bodies)
        request[TRACE] = trace
        token = bind(trace)
        # Bodies are hidden unless shown: with log_bodies off there is nothing to set, or to reset.
        shown = show_bodies(True) if log_bodies else None
        counted = _counted(request)
        if counted:
            metrics.in_flight += 1
        status = 500
        try:
            try:
                response = await handler(request)
            except ToolpairError as exc:
                response = answer_error(request, exc)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        except asyncio.CancelledError:
            status = CLIENT_CLOSED
            raise
        finally:
            unbind(token)
            if shown is not None:
                hide_bodies(shown)
            duration = time.monotonic() - trace.started
            route = route_label(request)
            usage = trace.usage()
            if counted:
                metrics.in_flight -= 1
                metrics.record(trace, route, status, duration, usage)
            _log_access(request, trace, route, status, duration, usage)

    return observe


async def stamp_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: return the request id, also on streams and on aiohttp's own errors."""
    try:  # noqa: SIM105 (contextlib.suppress costs an object and two calls on every response)
        response.headers["X-Request-ID"] = request[TRACE].request_id
    except KeyError:  # no access middleware ran (a request aiohttp refused before any handler)
        pass


def _log_access(
    request: web.Request, trace: Trace, route: str, status: int, duration: float, usage: Usage | None
) -> None:
    level = logging.DEBUG if request.path in _QUIET else logging.INFO
    if not access_log.isEnabledFor(level):
        _log_bodies(trace)
        return
    report = trace.report
    ttfb = trace.upstream_ttfb
    fields: dict[str, Any] = {
        "method": request.method,
        "path": request.path,
        "route": route,
        "status": status,
        "duration_ms": round(duration * 1000, 1),
        "runs_reordered": report.reordered,
        "runs_in_order": report.in_order,
        "runs_kept": dict(sorted(report.kept.items())),
        "upstream_ttfb_ms": round(ttfb * 1000, 1) if ttfb is not None else None,
        "queue_wait_ms": round(trace.queue_wait * 1000, 1) if trace.queue_wait is not None else None,
        "prompt_tokens": usage.prompt_tokens if usage else None,
        "completion_tokens": usage.completion_tokens if usage else None,
        "tool_calls_extracted": trace.toolcalls_extracted or None,
        "tool_call_failures": trace.toolcalls_failed or None,
    }
    access_log.log(
        level,
        "%s %s %d %.1fms",
        request.method,
        request.path,
        status,
        duration * 1000,
        extra={"fields": fields, "request_id": trace.request_id, "summarized": _SUMMARIZED},
    )
    _log_bodies(trace)


def _log_bodies(trace: Trace) -> None:
    if trace.keep_bodies:
        tag = {"request_id": trace.request_id}
        if trace.sent_body is not None:
            body_log.info("to engine: %s", trace.sent_body.decode("utf-8", "replace"), extra=tag)
        for watch in trace.watches:
            if watch.body is not None:
                body_log.info("from engine: %s", watch.body.decode("utf-8", "replace"), extra=tag)
