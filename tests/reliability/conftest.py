"""Fixtures of the reliability suite, and the report of its figures at the end of the run."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web

from proxy.app import create_app
from proxy.config import Settings
from tests.conftest import start_app
from tests.mock_engine import MockEngine
from tests.reliability import figures


@dataclass
class Proxy:
    """toolpair in this process, in front of an in-process mock engine."""

    url: str
    engine: MockEngine
    app: web.Application


def serve_proxy(engine: MockEngine, **settings: Any) -> AbstractAsyncContextManager[Proxy]:
    @asynccontextmanager
    async def serve() -> AsyncIterator[Proxy]:
        options: dict[str, Any] = {"connect_timeout": 2.0, "upstream_read_timeout": 5.0, **settings}
        app = create_app(Settings(upstream=engine.url, **options))
        runner, url = await start_app(app)
        try:
            yield Proxy(url, engine, app)
        finally:
            await runner.cleanup()

    return serve()


ProxyFactory = Callable[..., AbstractAsyncContextManager[Proxy]]


@pytest.fixture
async def proxy_factory(engine: MockEngine) -> ProxyFactory:
    """``async with proxy_factory(engine_kind=..., ...) as proxy``: toolpair with these settings."""
    return lambda **settings: serve_proxy(engine, **settings)


@pytest.fixture
async def llama_proxy(engine: MockEngine) -> AsyncIterator[Proxy]:
    """toolpair as ``toolpair serve`` runs it: engine kind llama-cpp-python (adapted, calls extracted)."""
    engine.tokenizer = True
    async with serve_proxy(engine, engine_kind="llama-cpp-python") as proxy:
        yield proxy


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not figures.FIGURES:
        return
    path = figures.write()
    terminalreporter.section("toolpair reliability figures")
    terminalreporter.write_line(json.dumps(figures.FIGURES, sort_keys=True))
    terminalreporter.write_line(f"written to {path}")
