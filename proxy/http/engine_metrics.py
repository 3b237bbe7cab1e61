"""``GET /metrics`` in front of an engine that serves its own: the engine's scrape, with toolpair's appended.

A user who puts toolpair in front of a monitored engine keeps every engine metric family and
header (llama-server's ``llamacpp:*`` families, its ``Process-Start-Time-Unix``): the engine's
answer goes out with its status and headers, and, when it is a Prometheus exposition (200, text
or OpenMetrics), with toolpair's ``toolpair_*`` families after the engine's own. Any other answer
is the engine's, unchanged: a llama-server started without ``--metrics`` answers 501 through
toolpair as it does direct, and a key-protected one 401 to a wrong key. An engine without the
path (404 or 405: llama-cpp-python), or that answers it with something other than an exposition,
leaves ``/metrics`` to toolpair's own. toolpair's own are
always at ``/toolpair/metrics`` too.

The scrape goes straight to the engine, outside admission: it must never wait in a queue behind
generations. The client's credentials go with it as with any request (the upstream's policy).
"""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.typedefs import Handler

from proxy.engine.upstream import forwardable_headers
from proxy.errors import ToolpairError
from proxy.http.keys import UPSTREAM
from proxy.ops.metrics import Metrics, append_exposition

__all__ = ["engine_metrics_handler"]

log = logging.getLogger("toolpair")

_REQUEST_DROP = ("accept-encoding",)  # toolpair's families are appended to the body: it must be plain
_RESPONSE_DROP = ("content-length", "content-encoding")


def engine_metrics_handler(metrics: Metrics, own: Handler) -> Handler:
    """The ``/metrics`` handler of a sidecar; ``own`` serves toolpair's families alone."""

    async def scrape(request: web.Request) -> web.StreamResponse:
        upstream = request.app[UPSTREAM]
        headers = forwardable_headers(request.headers, _REQUEST_DROP)
        try:
            async with upstream.open("GET", request.path_qs, headers, None) as response:
                status, reason = response.status, response.reason
                out_headers = forwardable_headers(response.headers, _RESPONSE_DROP)
                content_type = response.headers.get("Content-Type", "")
                body = await upstream.read(response)
        except ToolpairError as exc:
            # The engine is away: toolpair's own still tell the operator something.
            log.info("metrics: the engine's could not be read: %s", exc.message)
            return await own(request)
        if status in (404, 405):
            return await own(request)
        if status == 200:
            merged = append_exposition(body, content_type, metrics.registry)
            if merged is None:  # a 200 that is no exposition: an engine that answers any path
                return await own(request)
            body = merged
        return web.Response(status=status, reason=reason, headers=out_headers, body=body)

    return scrape
