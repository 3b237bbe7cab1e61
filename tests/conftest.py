"""Shared fixtures: a mock engine and a toolpair proxy in front of it, both on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest
from aiohttp import web

from proxy.config import Settings
from proxy.http.app import create_app
from tests.mock_engine import MockEngine
from tests.real_engine import RealEngine, start_real_engine


async def start_app(app: web.Application) -> tuple[web.AppRunner, str]:
    """Run an aiohttp app on a free loopback port, cancelling handlers when clients leave."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


@dataclass
class Stack:
    engine: MockEngine
    url: str
    settings: Settings


@pytest.fixture
async def engine() -> AsyncIterator[MockEngine]:
    mock = MockEngine()
    await mock.start()
    yield mock
    await mock.stop()


@pytest.fixture
async def stack(engine: MockEngine) -> AsyncIterator[Stack]:
    settings = Settings(upstream=engine.url, connect_timeout=2.0, upstream_read_timeout=5.0)
    runner, url = await start_app(create_app(settings))
    yield Stack(engine, url, settings)
    await runner.cleanup()


@pytest.fixture(scope="session")
def real_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealEngine]:
    """The real llama-cpp-python server with the bundled model, shared by the whole session."""
    engine = start_real_engine(tmp_path_factory.mktemp("engine"))
    yield engine
    engine.stop()
