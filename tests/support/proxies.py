"""Starting toolpair for a test: one factory, used through the ``make_proxy`` fixture."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from proxy.app import create_app
from proxy.config import Settings
from proxy.engine.client import Admission, admit_all

__all__ = ["MakeProxy", "ProxyFactory", "start_app"]


async def start_app(app: web.Application) -> tuple[web.AppRunner, str]:
    """Run an aiohttp app on a free loopback port, cancelling handlers when clients leave."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


MakeProxy = Callable[..., Awaitable[str]]
"""``await make_proxy(engine_kind="llama-cpp-python", ...)``: the URL of a fresh toolpair in front of the engine."""


class ProxyFactory:
    """toolpair apps in front of one upstream, each with its own settings; all stopped by :meth:`close`."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self._runners: list[web.AppRunner] = []

    async def __call__(self, *, admission: Admission = admit_all, find_engine: bool = False, **settings: Any) -> str:
        """``find_engine``: an ``auto`` engine kind is asked for, as ``toolpair proxy`` does (else it is generic)."""
        options: dict[str, Any] = {"upstream": self.upstream, "connect_timeout": 2.0, "upstream_read_timeout": 5.0}
        options.update(settings)
        app = create_app(Settings(**options), admission=admission, find_engine=find_engine)
        runner, url = await start_app(app)
        self._runners.append(runner)
        return url

    async def close(self) -> None:
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()
