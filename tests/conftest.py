"""Shared fixtures: a mock engine and a toolpair proxy in front of it, both on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest

from proxy.config import Settings
from tests.mock_engine import MockEngine
from tests.real_engine import RealEngine, start_real_engine
from tests.support.proxies import MakeProxy, ProxyFactory, start_app

__all__ = ["Stack", "start_app"]  # start_app: imported from here by older tests


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
async def stack(engine: MockEngine, make_proxy: MakeProxy) -> AsyncIterator[Stack]:
    settings = Settings(upstream=engine.url, connect_timeout=2.0, upstream_read_timeout=5.0)
    yield Stack(engine, await make_proxy(), settings)


@pytest.fixture
async def make_proxy(engine: MockEngine) -> AsyncIterator[MakeProxy]:
    """The one proxy factory: ``url = await make_proxy(**settings)`` in front of the mock engine."""
    factory = ProxyFactory(engine.url)
    yield factory
    await factory.close()


@pytest.fixture(scope="session")
def real_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealEngine]:
    """The real llama-cpp-python server with the bundled model, shared by the whole session."""
    engine = start_real_engine(tmp_path_factory.mktemp("engine"))
    yield engine
    engine.stop()
