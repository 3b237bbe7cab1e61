"""``GET /toolpair/status``: what this instance is and has done, as JSON.

Example (sidecar mode; the engine fields are filled in when toolpair runs the
engine itself and the serve path sets ``app[ENGINE_PROBE]``)::

    {"version": "0.1.0", "mode": "sidecar", "upstream": "http://127.0.0.1:8080",
     "engine": {"state": null, "backend": null, "model": null, "restarts": null, "queue_depth": null},
     "uptime_seconds": 12.5, "auth": {"keys_required": true},
     "counters": {"requests": 3, "runs_reordered": 1, ...}}
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler
from yarl import URL

from proxy import __version__
from proxy.ops.engine_probe import ENGINE_PROBE
from proxy.ops.metrics import METRICS

__all__ = ["STARTED_AT", "public_url", "status_handler"]

STARTED_AT = web.AppKey("started_at", float)


def public_url(url: str) -> str:
    """``url`` without any user name or password in it, safe to show and log.

    >>> public_url("http://user:secret@engine:8080/v1")
    'http://engine:8080/v1'
    """
    parsed = URL(url)
    return str(parsed.with_user(None)) if parsed.user is not None or parsed.password is not None else url


def status_handler(upstream_url: str, keys_required: bool) -> Handler:
    """The handler for one app; engine fields are read from ``app[ENGINE_PROBE]`` on each request."""
    upstream = public_url(upstream_url)

    async def status(request: web.Request) -> web.StreamResponse:
        app = request.app
        probe = app.get(ENGINE_PROBE)
        snapshot = probe() if probe is not None else None
        engine: dict[str, Any] = {
            "state": snapshot.state if snapshot else None,
            "backend": snapshot.backend if snapshot else None,
            "model": snapshot.model if snapshot else None,
            "restarts": snapshot.restarts if snapshot else None,
            "queue_depth": snapshot.queue_depth if snapshot else None,
        }
        if snapshot is not None and snapshot.engines:
            engine["engines"] = [reading.shown() for reading in snapshot.engines]
        body = {
            "version": __version__,
            "mode": "managed" if probe is not None else "sidecar",
            "upstream": upstream,
            "engine": engine,
            "uptime_seconds": round(time.monotonic() - app[STARTED_AT], 3),
            "auth": {"keys_required": keys_required},
            "counters": app[METRICS].totals(),
        }
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    return status
