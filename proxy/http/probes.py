"""``/health`` and ``/ready``: toolpair's own answers for probes, in every mode.

``GET /health`` is liveness: 200 while toolpair serves requests, whatever the
engine does. ``GET /ready`` is readiness: 200 only while requests can be
served. What "ready" means depends on who runs the engine, so the app holds a
:data:`READINESS` check:

- sidecar (the default here): the engine was found (:mod:`proxy.engine.watch`) and
  answers ``GET /health`` with a status below 500 (llama-server and vLLM answer 503 while they load; an engine without
  the route answers 404, which still shows it is up);
- ``toolpair serve`` replaces it with the managed engine's state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from proxy.engine.watch import EngineWatch
from proxy.errors import UpstreamError
from proxy.http.keys import ENGINE_WATCH, UPSTREAM
from proxy.ops.paths import HEALTH_PATH, READY_PATH

__all__ = ["HEALTH_PATH", "READINESS", "READY_PATH", "Readiness", "register_health_routes"]

Readiness = Callable[[], Awaitable[tuple[bool, dict[str, Any]]]]
"""Returns (ready, details for the response body)."""

READINESS: web.AppKey[Readiness] = web.AppKey("readiness")
_PROBE_TIMEOUT = 5.0


def _upstream_probe(app: web.Application) -> Readiness:
    async def upstream_ready() -> tuple[bool, dict[str, Any]]:
        upstream, watch = app[UPSTREAM], app[ENGINE_WATCH]
        if not watch.answering:  # not found yet, or gone: ask now rather than at the watch's next turn
            await watch.detect(upstream)
            if not watch.answering:
                return False, {"engine": watch.describe()}
        try:
            async with asyncio.timeout(_PROBE_TIMEOUT), upstream.open("GET", HEALTH_PATH, {}, None) as response:
                status = response.status
        except UpstreamError as exc:
            watch.lost(exc.message)
            return False, {"upstream": {"error": exc.message}, **_engine(watch)}
        except TimeoutError:
            return False, {"upstream": {"error": f"no answer within {_PROBE_TIMEOUT:g}s"}, **_engine(watch)}
        return status < 500, {"upstream": {"status": status}, **_engine(watch)}

    return upstream_ready


def _engine(watch: EngineWatch) -> dict[str, Any]:
    """What /ready says of the engine found: nothing for a named kind, which was not looked for."""
    return {} if watch.named else {"engine": watch.describe()}


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def ready(request: web.Request) -> web.Response:
    ok, details = await request.app[READINESS]()
    return web.json_response({"status": "ready" if ok else "not ready", **details}, status=200 if ok else 503)


def register_health_routes(app: web.Application) -> None:
    """Answer the probe paths here, never upstream; call before the catch-all route."""
    app[READINESS] = _upstream_probe(app)
    app.router.add_get(HEALTH_PATH, health)
    app.router.add_get(READY_PATH, ready)
