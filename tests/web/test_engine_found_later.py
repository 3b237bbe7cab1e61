"""A sidecar listens at once: its engine is found in the background, and found again when it comes back.

Through the real HTTP path: toolpair (``find_engine``, as ``toolpair proxy`` builds it) in front of a
port where nothing listens yet, then the mock engine started on that port.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import orjson
import pytest

from engine_launcher.supervise.launch import free_port
from tests.mock_engine import MockEngine
from tests.support.proxies import MakeProxy

pytestmark = pytest.mark.asyncio

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
MESSAGES = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
RESPONSES = {"model": "m", "input": "hi"}
APIS = [("/v1/chat/completions", CHAT), ("/v1/messages", MESSAGES), ("/v1/responses", RESPONSES)]


async def get(url: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.json()


async def post(url: str, body: Any) -> tuple[int, Any, Any]:
    async with aiohttp.ClientSession() as session, session.post(url, data=orjson.dumps(body)) as response:
        return response.status, response.headers, await response.json()


def _not_reachable(path: str, body: Any) -> str:
    """The message of a not-reachable refusal, read from the API's own error shape."""
    if path == "/v1/messages":
        assert body["type"] == "error" and body["error"]["type"] == "overloaded_error", body
        return str(body["error"]["message"])
    assert body["error"]["type"] == "engine_unavailable" and body["error"]["code"] == "engine_unavailable", body
    return str(body["error"]["message"])


async def test_with_nothing_at_the_upstream_toolpair_answers_at_once_then_picks_the_engine_up(
    make_proxy: MakeProxy,
) -> None:
    port = free_port()
    began = time.monotonic()
    url = await make_proxy(upstream=f"http://127.0.0.1:{port}", find_engine=True)
    status, _ = await get(url + "/health")
    assert status == 200 and time.monotonic() - began < 1.0
    status, ready = await get(url + "/ready")
    assert status == 503 and ready["engine"]["kind"] is None and "unreachable" in ready["engine"]["error"], ready
    for path, body in APIS:
        status, headers, answer = await post(url + path, body)
        assert status == 503 and headers["Retry-After"] == "1", (path, answer)
        assert "is not reachable yet" in _not_reachable(path, answer)

    engine = MockEngine()
    await engine.start(port=port)
    try:
        for path, body in APIS:  # the first request after the engine came up is served: it asks at once
            status, _, answer = await post(url + path, body)
            assert status == 200, (path, answer)
        status, ready = await get(url + "/ready")
        assert status == 200 and ready["engine"]["kind"] == "generic" and "found_at" in ready["engine"], ready
        assert [r.path for r in engine.received[:2]] == ["/health", "/props"]  # how it told what the engine is
    finally:
        await engine.stop()


async def test_an_engine_that_goes_away_is_refused_in_shape_and_found_again_when_it_returns(
    make_proxy: MakeProxy,
) -> None:
    port = free_port()
    engine = MockEngine()
    await engine.start(port=port)
    url = await make_proxy(upstream=f"http://127.0.0.1:{port}", find_engine=True)
    try:
        status, _, _ = await post(url + "/v1/chat/completions", CHAT)
        assert status == 200
    finally:
        await engine.stop()
    status, ready = await get(url + "/ready")  # the readiness probe sees it gone
    assert status == 503 and ready["engine"]["kind"] == "generic" and "error" in ready["engine"], ready
    for path, body in APIS:
        status, _, answer = await post(url + path, body)
        assert status == 503 and "is not reachable yet" in _not_reachable(path, answer), (path, answer)

    back = MockEngine()
    await back.start(port=port)
    try:
        for _ in range(50):  # the background watch asks once a second; /ready asks at once too
            status, ready = await get(url + "/ready")
            if status == 200:
                break
            await asyncio.sleep(0.1)
        assert status == 200 and "error" not in ready["engine"], ready
        assert [r.path for r in back.received[:2]] == ["/health", "/props"]  # detected afresh
        status, _, _ = await post(url + "/v1/responses", RESPONSES)
        assert status == 200
    finally:
        await back.stop()
