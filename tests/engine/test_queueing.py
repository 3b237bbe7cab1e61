"""The engine queue: FIFO admission, limits, readiness waits; directly, then through the real HTTP path."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import aiohttp
import openai
import orjson
import pytest
from aiohttp import web
from openai import AsyncOpenAI

from proxy.engine.queueing import EngineQueue
from proxy.engine.upstream import Upstream
from proxy.errors import EngineUnavailableError, QueueFullError
from tests.mock_engine import MockEngine, Received, completion
from tests.support.proxies import MakeProxy

NO_REQUEST = cast(web.Request, None)


async def ready_now() -> None:
    return None


async def hold(queue: EngineQueue, entered: list[str], name: str, release: asyncio.Event) -> None:
    async with queue(NO_REQUEST):
        entered.append(name)
        await release.wait()


async def settle() -> None:
    """Let every task that can run, run (the queue is in-process: no I/O to wait for)."""
    for _ in range(10):
        await asyncio.sleep(0)


async def test_requests_enter_in_arrival_order_one_at_a_time() -> None:
    queue = EngineQueue(ready_now, max_concurrency=1, max_queue=5)
    entered: list[str] = []
    gates = {name: asyncio.Event() for name in "abc"}
    tasks = []
    for name in "abc":
        tasks.append(asyncio.create_task(hold(queue, entered, name, gates[name])))
        await settle()
    assert entered == ["a"] and queue.active == 1 and queue.waiting == 2
    gates["a"].set()
    await settle()
    assert entered == ["a", "b"] and queue.waiting == 1
    gates["b"].set()
    gates["c"].set()
    await asyncio.gather(*tasks)
    assert entered == ["a", "b", "c"] and queue.active == 0 and queue.waiting == 0


async def test_max_concurrency_lets_that_many_in_at_once() -> None:
    queue = EngineQueue(ready_now, max_concurrency=2, max_queue=5)
    entered: list[str] = []
    release = asyncio.Event()
    tasks = [asyncio.create_task(hold(queue, entered, name, release)) for name in "abc"]
    await settle()
    assert entered == ["a", "b"] and queue.active == 2 and queue.waiting == 1
    release.set()
    await asyncio.gather(*tasks)


async def test_past_the_queue_a_request_is_refused_with_retry_after() -> None:
    queue = EngineQueue(ready_now, max_concurrency=1, max_queue=1)
    release = asyncio.Event()
    tasks = [asyncio.create_task(hold(queue, [], name, release)) for name in "ab"]
    await settle()
    with pytest.raises(QueueFullError) as refused:
        async with queue(NO_REQUEST):
            pass
    assert refused.value.status == 429 and refused.value.retry_after is not None and refused.value.retry_after >= 1
    release.set()
    await asyncio.gather(*tasks)


async def test_a_waiter_that_leaves_frees_its_place() -> None:
    queue = EngineQueue(ready_now, max_concurrency=1, max_queue=1)
    entered: list[str] = []
    release = asyncio.Event()
    first = asyncio.create_task(hold(queue, entered, "a", release))
    await settle()
    leaver = asyncio.create_task(hold(queue, entered, "b", release))
    await settle()
    assert queue.waiting == 1
    leaver.cancel()
    await settle()
    assert queue.waiting == 0 and leaver.cancelled()
    third = asyncio.create_task(hold(queue, entered, "c", release))  # not refused: the place is free
    await settle()
    assert queue.waiting == 1
    release.set()
    await asyncio.gather(first, third)
    assert entered == ["a", "c"]


async def test_a_slot_granted_to_a_leaving_waiter_passes_to_the_next() -> None:
    queue = EngineQueue(ready_now, max_concurrency=1, max_queue=2)
    entered: list[str] = []
    release = asyncio.Event()
    gate_a = asyncio.Event()
    first = asyncio.create_task(hold(queue, entered, "a", gate_a))
    await settle()
    leaver = asyncio.create_task(hold(queue, entered, "b", release))
    third = asyncio.create_task(hold(queue, entered, "c", release))
    await settle()
    gate_a.set()
    await asyncio.sleep(0)  # a runs and releases: b's slot is granted, but b has not run yet
    leaver.cancel()
    release.set()
    await asyncio.wait_for(asyncio.gather(first, third), 5)
    assert leaver.cancelled() and entered == ["a", "c"]
    assert queue.active == 0 and queue.waiting == 0


async def test_a_request_waits_for_the_engine_then_gets_503() -> None:
    never = asyncio.Event()

    queue = EngineQueue(never.wait, ready_timeout=0.05)
    with pytest.raises(EngineUnavailableError, match=r"did not become ready within 0\.05s") as refused:
        async with queue(NO_REQUEST):
            pass
    assert refused.value.status == 503 and refused.value.retry_after
    assert queue.active == 0 and queue.waiting == 0


async def test_a_request_proceeds_once_the_engine_is_ready() -> None:
    ready = asyncio.Event()

    queue = EngineQueue(ready.wait, ready_timeout=10)
    entered: list[str] = []
    task = asyncio.create_task(hold(queue, entered, "a", ready))
    await settle()
    assert entered == [] and queue.waiting == 1
    ready.set()
    await task
    assert entered == ["a"]


# --- through the real HTTP path -------------------------------------------------------------


@pytest.fixture
async def queued(engine: MockEngine, make_proxy: MakeProxy) -> AsyncIterator[tuple[str, EngineQueue, MockEngine]]:
    queue = EngineQueue(ready_now, max_concurrency=1, max_queue=1)
    yield await make_proxy(connect_timeout=2.0, upstream_read_timeout=10.0, admission=queue), queue, engine


def blocking(engine: MockEngine) -> tuple[asyncio.Event, asyncio.Event]:
    """Make the engine's next reply wait; returns the event that releases it and the event set when it is reached."""
    release, reached = asyncio.Event(), asyncio.Event()

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        reached.set()
        await release.wait()
        return web.json_response(completion("slow"), dumps=lambda v: orjson.dumps(v).decode())

    engine.then(handler)
    return release, reached


async def until(condition: Any, within: float = 5.0) -> None:
    """Poll an in-process condition (the queue's counters have no event to wait on)."""
    async with asyncio.timeout(within):
        while True:
            if condition():
                return
            await asyncio.sleep(0.01)


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def test_queue_full_is_a_429_with_retry_after_in_the_openai_shape(
    queued: tuple[str, EngineQueue, MockEngine],
) -> None:
    url, queue, engine = queued
    release, reached = blocking(engine)
    async with AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as client:
        first = asyncio.create_task(client.chat.completions.create(**CHAT))  # type: ignore[call-overload]
        await reached.wait()
        second = asyncio.create_task(client.chat.completions.create(**CHAT))  # type: ignore[call-overload]
        await until(lambda: queue.waiting == 1)
        with pytest.raises(openai.RateLimitError) as refused:
            await client.chat.completions.create(**CHAT)  # type: ignore[call-overload]
        release.set()
        assert (await first).choices[0].message.content == "slow"
        assert (await second).choices[0].message.content == "ok"
    response = refused.value.response
    assert response.status_code == 429 and int(response.headers["retry-after"]) >= 1
    assert refused.value.body == {
        "message": "the engine is busy and its queue is full (1 waiting); retry later",
        "type": "rate_limit_error",
        "param": None,
        "code": "queue_full",
        "source": "toolpair",
    }
    assert len(engine.received) == 2  # the refused request never reached the engine


async def test_a_client_that_disconnects_while_queued_leaves_the_queue(
    queued: tuple[str, EngineQueue, MockEngine],
) -> None:
    url, queue, engine = queued
    release, reached = blocking(engine)
    async with aiohttp.ClientSession() as session:
        first = asyncio.create_task(session.post(url + "/v1/chat/completions", json=CHAT))
        await reached.wait()
        async with aiohttp.ClientSession() as leaving:
            waiting = asyncio.create_task(leaving.post(url + "/v1/chat/completions", json=CHAT))
            await until(lambda: queue.waiting == 1)
            waiting.cancel()
        await until(lambda: queue.waiting == 0)
        # Its place is free again: this one queues instead of getting 429.
        third = asyncio.create_task(session.post(url + "/v1/chat/completions", json=CHAT))
        await until(lambda: queue.waiting == 1)
        release.set()
        for task in (first, third):
            response = await task
            assert response.status == 200
            response.release()
    assert len(engine.received) == 2  # the client that left never reached the engine


async def test_an_engine_that_is_not_ready_gives_503(engine: MockEngine, make_proxy: MakeProxy) -> None:
    never = asyncio.Event()

    queue = EngineQueue(never.wait, ready_timeout=0.1)
    async with make_proxy.running(admission=queue) as (url, _):
        async with aiohttp.ClientSession() as session, session.post(url + "/v1/chat/completions", json=CHAT) as r:
            body = await r.json()
            assert (
                r.status == 503 and r.headers["Retry-After"] and r.headers["X-Toolpair-Error"] == "engine_unavailable"
            )
        assert body["error"]["type"] == "engine_unavailable" and body["error"]["source"] == "toolpair"
        assert engine.received == []


async def test_an_upstream_key_replaces_the_clients_credentials(engine: MockEngine, make_proxy: MakeProxy) -> None:
    upstream = Upstream(engine.url, api_key="engine-secret")
    async with make_proxy.running(upstream_client=upstream) as (url, _):
        headers = {"Authorization": "Bearer client-key", "x-api-key": "client-key", "X-Other": "kept"}
        async with aiohttp.ClientSession() as session:
            for path in ("/v1/chat/completions", "/v1/models"):
                async with session.post(url + path, json=CHAT, headers=headers) as response:
                    assert response.status == 200
                sent = engine.last.headers
                assert sent["Authorization"] == "Bearer engine-secret" and sent["X-Other"] == "kept"
                assert "x-api-key" not in {k.lower() for k in sent}
