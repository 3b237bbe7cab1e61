"""Everything an operator needs around the proxy, installed on an app in one call.

:func:`register_operations` adds, in this order:

1. the access middleware (request id, trace, access line, metrics, and the answer to an error
   raised inside it), outermost, so that refused requests are logged and counted too;
2. the API-key middleware, when keys are configured;
3. ``GET /metrics`` (unless the app serves the engine's there, see
   :mod:`proxy.http.engine_metrics`), ``GET /toolpair/metrics`` and ``GET /toolpair/status``;
4. a start-up warning when the listener is reachable beyond loopback and asks
   for no key.

Call it from ``create_app`` after ``SETTINGS`` and ``UPSTREAM`` are set and
before the catch-all passthrough route is added.
"""

from __future__ import annotations

import logging
import time

from aiohttp import web

from proxy.config import Settings
from proxy.ops.access import ErrorAnswer, access_middleware, stamp_request_id
from proxy.ops.auth import auth_middleware, exposure_warning, keys_required, load_keys, open_paths
from proxy.ops.engine_probe import ENGINE_PROBE, EngineSnapshot
from proxy.ops.metrics import METRICS, Metrics, metrics_handler
from proxy.ops.paths import METRICS_PATH, STATUS_PATH, TOOLPAIR_METRICS_PATH
from proxy.ops.status import STARTED_AT, status_handler

__all__ = ["register_operations"]

log = logging.getLogger("toolpair")


def register_operations(
    app: web.Application,
    settings: Settings,
    upstream_url: str,
    answer_error: ErrorAnswer,
    *,
    metrics_path: bool = True,
) -> None:
    """Install keys, metrics, access logs and the status route on ``app``.

    ``metrics_path`` false leaves ``/metrics`` to the caller (a sidecar serves the engine's there).

    ``answer_error`` makes the response for an error any handler or the key check raises; the
    access middleware calls it, and records the status it answers.
    """
    keys = load_keys(settings) if keys_required(settings) else None

    def engine_snapshot() -> EngineSnapshot | None:
        probe = app.get(ENGINE_PROBE)
        return probe() if probe is not None else None

    metrics = Metrics(engine_snapshot)
    app[METRICS] = metrics
    app[STARTED_AT] = time.monotonic()
    app.middlewares.append(access_middleware(metrics, settings.log_bodies, answer_error))
    if keys is not None:
        app.middlewares.append(auth_middleware(keys, open_paths(settings)))
    app.on_response_prepare.append(stamp_request_id)
    if metrics_path:
        app.router.add_get(METRICS_PATH, metrics_handler(metrics), name="metrics")
    app.router.add_get(TOOLPAIR_METRICS_PATH, metrics_handler(metrics), name="toolpair_metrics")
    app.router.add_get(STATUS_PATH, status_handler(upstream_url, keys is not None), name="status")

    async def warn_if_exposed(app: web.Application) -> None:
        warning = exposure_warning(settings.host, keys is not None)
        if warning is not None:
            log.warning(warning)

    app.on_startup.append(warn_if_exposed)
