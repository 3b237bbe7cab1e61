"""The aiohttp application: one route table, the middlewares, and the engine client.

The one module that wires every layer together (HTTP, the dialects, the engine
client, operations), so it sits above them all.

Handlers decode, ask their dialect for a plan, and reach the engine through the one
:class:`~proxy.engine.client.EngineClient`. Errors are raised, never caught to answer: the error
answer (:mod:`proxy.http.middleware`, called by the access middleware) turns them into responses in the route's dialect.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from proxy.config import Settings
from proxy.dialects.anthropic.errors import anthropic_error
from proxy.dialects.anthropic.routes import MESSAGES_PATH, register_anthropic_routes
from proxy.dialects.chat.routes import chat_completions
from proxy.dialects.responses.routes import RESPONSES_PATHS, register_responses_routes
from proxy.engine.client import Admission, EngineClient, admit_all
from proxy.engine.upstream import Upstream
from proxy.engine.watch import EngineWatch
from proxy.errors import Dialect
from proxy.http.engine_metrics import engine_metrics_handler
from proxy.http.keys import ADMISSION, ENGINE_CLIENT, ENGINE_WATCH, SETTINGS, UPSTREAM
from proxy.http.middleware import ErrorMaps, error_answer
from proxy.http.probes import register_health_routes
from proxy.http.relay import passthrough
from proxy.http.routing import stamp_route
from proxy.ops.auth import keys_required
from proxy.ops.metrics import METRICS, metrics_handler
from proxy.ops.operations import register_operations
from proxy.ops.paths import METRICS_PATH

__all__ = [
    "ADMISSION",
    "ENGINE_CLIENT",
    "ENGINE_WATCH",
    "Admission",
    "create_app",
    "SETTINGS",
    "UPSTREAM",
]

CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")

ERROR_MAPS: ErrorMaps = {Dialect.ANTHROPIC: anthropic_error}
"""How a dialect shows an error, where it differs (Anthropic's context overflow: ``prompt is too long``)."""


async def _upstream_ctx(app: web.Application) -> AsyncIterator[None]:
    upstream = app[UPSTREAM]
    await upstream.start()
    # Not awaited: the port is bound at once, whatever the engine does (proxy.engine.watch).
    watching = asyncio.create_task(app[ENGINE_WATCH].run(upstream), name="engine-watch")
    yield
    watching.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watching
    await upstream.close()


def _engine_gate(watch: EngineWatch, paths: frozenset[str]) -> Middleware:
    """API requests wait for the engine to be found: until it answers, a 503 in the API's shape says so."""

    async def wait_then(request: web.Request, handler: Handler) -> web.StreamResponse:
        await watch.known(request.app[UPSTREAM])
        return await handler(request)

    @web.middleware
    def gate(request: web.Request, handler: Handler) -> Awaitable[web.StreamResponse]:
        # A plain function, not a coroutine: once the engine is known it hands back the handler's own
        # coroutine, so the gate is no frame in the chain that every await of the request passes through.
        if watch.ready_now() or request.method != "POST" or request.path not in paths:
            return handler(request)
        return wait_then(request, handler)

    return gate


def create_app(
    settings: Settings,
    upstream: Upstream | None = None,
    admission: Admission = admit_all,
    *,
    engine_metrics: bool = True,
    find_engine: bool = False,
    chat_template: str | None = None,
) -> web.Application:
    """Build the proxy application for ``settings`` (sidecar mode needs ``settings.upstream``).

    ``engine_metrics`` serves the engine's ``/metrics`` with toolpair's appended (a sidecar); false
    serves toolpair's alone there (``toolpair serve``, whose engine has none). ``find_engine`` tells
    an ``engine_kind`` of ``auto`` by asking the upstream, in the background once the app runs
    (``toolpair proxy``); without it ``auto`` is ``generic``. ``chat_template``, the model's
    template text (``--chat-template-file``), is followed for an engine found to leave calls in its text.
    """
    watch = EngineWatch(settings, find=find_engine, chat_template=chat_template)
    if upstream is None:
        if not settings.upstream:
            raise ValueError("an upstream URL is required")
        upstream = Upstream(
            settings.upstream,
            connect_timeout=settings.connect_timeout,
            read_timeout=settings.upstream_read_timeout,
            api_key=settings.upstream_api_key,
            forward_credentials=not keys_required(settings),
            reuses_connections=watch.setup.profile.reuses_connections,
        )
    app = web.Application(client_max_size=settings.max_body_bytes)
    app[SETTINGS] = settings
    app[UPSTREAM] = upstream
    app[ENGINE_WATCH] = watch
    app[ADMISSION] = admission
    app[ENGINE_CLIENT] = EngineClient(upstream, watch, admission)
    app.cleanup_ctx.append(_upstream_ctx)
    register_operations(app, settings, upstream.base_url, error_answer(ERROR_MAPS), metrics_path=not engine_metrics)
    app.on_response_prepare.append(stamp_route)
    app.middlewares.append(_engine_gate(watch, frozenset((*CHAT_PATHS, MESSAGES_PATH, *RESPONSES_PATHS))))
    if engine_metrics:
        app.router.add_get(
            METRICS_PATH, engine_metrics_handler(app[METRICS], metrics_handler(app[METRICS])), name="metrics"
        )
    # The route table: toolpair's own paths, then everything else to the engine as it is.
    for path in CHAT_PATHS:
        app.router.add_post(path, chat_completions)
    register_anthropic_routes(app)
    register_responses_routes(app)
    register_health_routes(app)
    app.router.add_route("*", "/{tail:.*}", passthrough, name="passthrough")
    return app
