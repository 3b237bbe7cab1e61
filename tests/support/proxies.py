"""Starting toolpair for a test: one factory, used through the ``make_proxy`` and ``make_proxy_to`` fixtures.

Every toolpair app a test runs is built here (``create_app`` is called nowhere else in ``tests/``), so a
change to how the proxy is wired reaches every test at once and no test carries its own copy of it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, NamedTuple

from aiohttp import web

from proxy.app import create_app
from proxy.config import Settings
from proxy.engine.client import Admission, admit_all
from proxy.engine.upstream import Upstream

__all__ = ["MOCK_ENGINE_TIMEOUTS", "MakeProxy", "ProxyFactory", "RunningProxy", "proxy_app", "start_app"]

MOCK_ENGINE_TIMEOUTS: dict[str, Any] = {"connect_timeout": 2.0, "upstream_read_timeout": 5.0}
"""Short timeouts for an in-process mock engine, which answers at once or is meant to fail."""


async def start_app(app: web.Application) -> tuple[web.AppRunner, str]:
    """Run an aiohttp app on a free loopback port, cancelling handlers when clients leave."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def proxy_app(
    settings: Settings,
    *,
    admission: Admission = admit_all,
    upstream_client: Upstream | None = None,
    find_engine: bool = False,
) -> web.Application:
    """The toolpair app for ``settings``, not started: for tests of what building it refuses or routes.

    ``find_engine``: an ``auto`` engine kind is asked for, as ``toolpair proxy`` does (else it is generic).
    """
    return create_app(settings, upstream_client, admission, find_engine=find_engine)


class RunningProxy(NamedTuple):
    """A started toolpair: its URL, and the app for tests that look at its state (``as (url, app)``)."""

    url: str
    app: web.Application


class ProxyFactory:
    """toolpair apps, each with its own settings, in front of ``upstream`` unless told another; all stopped by
    :meth:`close`.

    ``defaults`` are settings every proxy of this factory gets unless a call names them.
    """

    def __init__(self, upstream: str | None = None, **defaults: Any) -> None:
        self.upstream = upstream
        self.defaults = defaults
        self._runners: list[web.AppRunner] = []

    async def __call__(self, **options: Any) -> str:
        """``url = await make_proxy(**settings)``: a started toolpair, stopped when the test ends."""
        return (await self.start(**options)).url

    async def start(self, **options: Any) -> RunningProxy:
        """Start a toolpair, stopped by :meth:`close`; ``options`` as for :meth:`build`."""
        app = self.build(**options)
        runner, url = await start_app(app)
        self._runners.append(runner)
        return RunningProxy(url, app)

    def running(self, **options: Any) -> AbstractAsyncContextManager[RunningProxy]:
        """``async with make_proxy.running(**settings) as (url, app)``: a toolpair stopped when the block ends
        (for tests that read what it wrote once stopped, or that start several in turn)."""

        @asynccontextmanager
        async def serve() -> AsyncIterator[RunningProxy]:
            app = self.build(**options)
            runner, url = await start_app(app)
            try:
                yield RunningProxy(url, app)
            finally:
                await runner.cleanup()

        return serve()

    def build(
        self,
        *,
        settings: Settings | None = None,
        admission: Admission = admit_all,
        upstream_client: Upstream | None = None,
        before_start: Callable[[web.Application], None] | None = None,
        find_engine: bool = False,
        **options: Any,
    ) -> web.Application:
        """The app, not started. ``options`` are settings over this factory's upstream and defaults;
        ``settings`` (already loaded, e.g. by ``load_settings``) replaces them. ``admission`` is the engine's
        gate (an ``EngineQueue``); ``upstream_client`` replaces the ``Upstream`` built from the settings;
        ``before_start`` may set app keys, which aiohttp freezes once the app runs.
        """
        if settings is None:
            merged: dict[str, Any] = {"upstream": self.upstream, **self.defaults, **options}
            settings = Settings(**merged)
        elif options:
            raise TypeError(f"settings and {sorted(options)} given together")
        app = proxy_app(settings, admission=admission, upstream_client=upstream_client, find_engine=find_engine)
        if before_start is not None:
            before_start(app)
        return app

    async def close(self) -> None:
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()


MakeProxy = ProxyFactory
"""The type of the ``make_proxy`` / ``make_proxy_to`` fixtures."""
