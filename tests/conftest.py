"""Shared fixtures: a mock engine and a toolpair proxy in front of it, both on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from engine_launcher.inside import engine_main
from proxy.config import Settings
from tests.mock_engine import MockEngine
from tests.real_engine import RealEngine, start_real_engine
from tests.support.proxies import MOCK_ENGINE_TIMEOUTS, MakeProxy, ProxyFactory, start_app
from tests.support.survey import survey

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
    factory = ProxyFactory(engine.url, **MOCK_ENGINE_TIMEOUTS)
    yield factory
    await factory.close()


@pytest.fixture
async def make_proxy_to() -> AsyncIterator[MakeProxy]:
    """The same factory with no engine of its own: ``url = await make_proxy_to(upstream=URL, **settings)``."""
    factory = ProxyFactory()
    yield factory
    await factory.close()


@pytest.fixture(scope="session")
def templates() -> Path:
    """llama.cpp's models/templates, fetched from the pinned sdist on first use and cached."""
    return Path(survey.fetch_templates())


@pytest.fixture(scope="session")
def real_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealEngine]:
    """The real llama-cpp-python server with the bundled model, shared by the whole session."""
    engine = start_real_engine(tmp_path_factory.mktemp("engine"))
    yield engine
    engine.stop()


@pytest.fixture
def engine_chat_format(monkeypatch: pytest.MonkeyPatch) -> Any:
    """llama-cpp-python's chat formatters as serve's engine process has them (engine_main), for one test.

    ``unpatched_template_file_formatter`` and ``unpatched_format`` (``Jinja2ChatFormatter.__call__``) are
    llama-cpp-python's own, for comparison.
    """
    chat_format = pytest.importorskip("llama_cpp.llama_chat_format")
    monkeypatch.setattr(chat_format.Jinja2ChatFormatter, "__call__", chat_format.Jinja2ChatFormatter.__call__)
    monkeypatch.setattr(chat_format, "unpatched_format", chat_format.Jinja2ChatFormatter.__call__, raising=False)
    original = chat_format.hf_tokenizer_config_to_chat_formatter
    monkeypatch.setattr(chat_format, "hf_tokenizer_config_to_chat_formatter", original)
    monkeypatch.setattr(chat_format, "_toolpair_templates", False, raising=False)
    monkeypatch.setattr(chat_format, "unpatched_template_file_formatter", original, raising=False)
    engine_main.render_chat_templates_as_models_expect()
    return chat_format
