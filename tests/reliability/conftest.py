"""Fixtures of the reliability suite, and the report of its figures at the end of the run."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web

from tests.mock_engine import MockEngine
from tests.reliability import figures
from tests.support.proxies import MakeProxy


@dataclass
class Proxy:
    """toolpair in this process (made by the one factory), in front of an in-process mock engine."""

    url: str
    engine: MockEngine
    app: web.Application


ProxyFactory = Callable[..., AbstractAsyncContextManager[Proxy]]


def serve_proxy(make_proxy: MakeProxy, engine: MockEngine, **settings: Any) -> AbstractAsyncContextManager[Proxy]:
    """``make_proxy.running`` with the engine beside the URL, as the reliability tests read both."""

    @asynccontextmanager
    async def serve() -> AsyncIterator[Proxy]:
        async with make_proxy.running(**settings) as running:
            yield Proxy(running.url, engine, running.app)

    return serve()


@pytest.fixture
async def proxy_factory(engine: MockEngine, make_proxy: MakeProxy) -> ProxyFactory:
    """``async with proxy_factory(engine_kind=..., ...) as proxy``: toolpair with these settings."""
    return lambda **settings: serve_proxy(make_proxy, engine, **settings)


@pytest.fixture
async def llama_proxy(engine: MockEngine, make_proxy: MakeProxy) -> AsyncIterator[Proxy]:
    """toolpair as ``toolpair serve`` runs it: engine kind llama-cpp-python (adapted, calls extracted)."""
    engine.tokenizer = True
    async with serve_proxy(make_proxy, engine, engine_kind="llama-cpp-python") as proxy:
        yield proxy


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not figures.FIGURES:
        return
    path = figures.write()
    terminalreporter.section("toolpair reliability figures")
    terminalreporter.write_line(json.dumps(figures.FIGURES, sort_keys=True))
    terminalreporter.write_line(f"written to {path}")
