"""The Responses store shared in Redis, through the real HTTP path.

openai SDK -> toolpair (one or two apps, as replicas would be) -> mock chat engine, with a
real ``redis-server`` on a loopback port that each test starts and may kill. The limits and
the TTL are run against both stores, to show they behave the same.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
import redis.asyncio
from aiohttp import web

from proxy.config import Settings
from proxy.dialects.responses.store import RedisResponseStore, StoredResponse
from tests.dialects.responses.test_responses_http import client
from tests.mock_engine import MockEngine, Received, completion, stream_words
from tests.redis_server import RedisServer
from tests.support.proxies import MOCK_ENGINE_TIMEOUTS, ProxyFactory, proxy_app


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


@asynccontextmanager
async def toolpair(engine: MockEngine, store: str, **limits: Any) -> AsyncIterator[str]:
    """One toolpair app (one replica) using ``store``; yields its base URL."""
    async with ProxyFactory(engine.url, **MOCK_ENGINE_TIMEOUTS).running(responses_store=store, **limits) as (url, _):
        yield url


def sent_texts(received: Received) -> list[str]:
    return [str(m["content"]) for m in received.json()["messages"]]


async def raw(method: str, url: str, body: Any = None) -> tuple[int, Any, Any]:
    data = None if body is None else orjson.dumps(body)
    async with aiohttp.ClientSession() as session, session.request(method, url, data=data) as response:
        return response.status, orjson.loads(await response.read()), response.headers


# --- replicas sharing one Redis ------------------------------------------------------------------


async def test_a_conversation_continues_across_two_apps_sharing_redis(
    engine: MockEngine, redis_server: RedisServer
) -> None:
    async with (
        toolpair(engine, redis_server.url) as one,
        toolpair(engine, redis_server.url) as two,
        client(one) as sdk_one,
        client(two) as sdk_two,
    ):
        first = await sdk_one.responses.create(model="m", instructions="Sys.", input="turn one")
        async with sdk_two.responses.stream(model="m", previous_response_id=first.id, input="turn two") as stream:
            second = await stream.get_final_response()
        third = await sdk_one.responses.create(model="m", previous_response_id=second.id, input="turn three")
        assert sent_texts(engine.last) == ["turn one", "ok", "turn two", "w0 w1 w2 ", "turn three"]
        fetched = await sdk_two.responses.retrieve(third.id)
        assert fetched.id == third.id and fetched.output_text == "ok"
        await sdk_two.responses.delete(third.id)
        with pytest.raises(openai.NotFoundError):
            await sdk_one.responses.retrieve(third.id)
        assert (await sdk_one.responses.retrieve(second.id)).id == second.id


async def test_stored_responses_outlive_a_toolpair_restart(engine: MockEngine, redis_server: RedisServer) -> None:
    async with toolpair(engine, redis_server.url) as url, client(url) as sdk:
        first = await sdk.responses.create(model="m", input="before the restart")
    async with toolpair(engine, redis_server.url) as url, client(url) as sdk:
        await sdk.responses.create(model="m", previous_response_id=first.id, input="after it")
        assert (await sdk.responses.retrieve(first.id)).output_text == "ok"
    assert sent_texts(engine.last) == ["before the restart", "ok", "after it"]


async def test_a_continuation_stores_only_its_new_items(engine: MockEngine, redis_server: RedisServer) -> None:
    async with toolpair(engine, redis_server.url) as url, client(url) as sdk:
        first = await sdk.responses.create(model="m", input="x" * 5000)
        second = await sdk.responses.create(model="m", previous_response_id=first.id, input="short")
    db = redis.asyncio.Redis.from_url(redis_server.url)
    try:
        own = orjson.loads(await db.hget(f"toolpair:responses:e:{second.id}", "i"))
        parent = await db.hget(f"toolpair:responses:e:{second.id}", "p")
    finally:
        await db.aclose()
    assert parent == first.id.encode()
    assert [item.get("content") for item in own if item.get("role") == "user"] == ["short"]
    assert "x" * 5000 not in orjson.dumps(own).decode()


async def test_a_chain_longer_than_the_link_limit_reads_back_whole(
    engine: MockEngine, redis_server: RedisServer
) -> None:
    async with toolpair(engine, redis_server.url) as url, client(url) as sdk:
        previous = None
        for turn in range(70):  # past the 64 links a read may walk: the 65th is stored whole
            kwargs = {"previous_response_id": previous} if previous else {}
            previous = (await sdk.responses.create(model="m", input=f"t{turn}", **kwargs)).id
    users = [text for text in sent_texts(engine.last) if text != "ok"]
    assert users == [f"t{turn}" for turn in range(70)]


# --- the same limits and TTL in both stores ------------------------------------------------------


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "memory":
        yield "memory"
        return
    server = RedisServer(tmp_path / "redis").start()
    yield server.url
    server.stop()


async def test_oldest_go_first_but_a_kept_continuation_keeps_its_history(engine: MockEngine, store: str) -> None:
    async with toolpair(engine, store, responses_store_max_entries=2) as url, client(url) as sdk:
        first = await sdk.responses.create(model="m", input="one")
        second = await sdk.responses.create(model="m", previous_response_id=first.id, input="two")
        third = await sdk.responses.create(model="m", previous_response_id=second.id, input="three")
        with pytest.raises(openai.NotFoundError) as gone:
            await sdk.responses.retrieve(first.id)
        assert gone.value.body["code"] == "response_not_found"  # type: ignore[index]
        await sdk.responses.create(model="m", previous_response_id=third.id, input="four")
    assert sent_texts(engine.last) == ["one", "ok", "two", "ok", "three", "ok", "four"]


async def test_the_byte_budget_drops_the_oldest_and_refuses_what_cannot_fit(engine: MockEngine, store: str) -> None:
    # Each response counts its request and its answer: the input plus about 800 bytes here.
    async with toolpair(engine, store, responses_store_max_bytes=10_000) as url, client(url) as sdk:
        small = await sdk.responses.create(model="m", input="a" * 1000)
        medium = await sdk.responses.create(model="m", input="b" * 3000)
        huge = await sdk.responses.create(model="m", input="c" * 10_000)  # over the whole budget: not kept
        newer = await sdk.responses.create(model="m", input="d" * 4000)  # pushes the oldest out
        for missing in (small.id, huge.id):
            with pytest.raises(openai.NotFoundError):
                await sdk.responses.retrieve(missing)
        for kept in (medium.id, newer.id):
            assert (await sdk.responses.retrieve(kept)).id == kept


async def test_responses_expire_after_the_ttl(engine: MockEngine, store: str) -> None:
    async with toolpair(engine, store, responses_store_ttl=0.3) as url, client(url) as sdk:
        old = await sdk.responses.create(model="m", input="soon forgotten")
        await asyncio.sleep(0.5)
        with pytest.raises(openai.NotFoundError):
            await sdk.responses.create(model="m", previous_response_id=old.id, input="too late")
    async with toolpair(engine, store, responses_store_ttl=3600) as url, client(url) as sdk:
        kept = await sdk.responses.create(model="m", input="remembered")
        await asyncio.sleep(0.5)
        assert (await sdk.responses.retrieve(kept.id)).id == kept.id


async def test_dropping_a_chain_leaves_nothing_behind_in_redis(redis_server: RedisServer) -> None:
    store = RedisResponseStore(redis_server.url, max_entries=1, max_bytes=10_000)
    try:
        entries: list[StoredResponse] = []
        items: list[Any] = []
        for turn in range(4):
            items = [*items, {"role": "user", "content": f"t{turn}"}]
            previous = entries[-1] if entries else None
            await store.put(f"resp_{turn}", items, {"id": f"resp_{turn}"}, size=10, previous=previous)
            entries.append(await store.get(f"resp_{turn}"))
        assert entries[-1].items == items  # only resp_3 is kept, its whole history with it
        assert await store.delete("resp_3") and not await store.delete("resp_3")
        db = redis.asyncio.Redis.from_url(redis_server.url)
        try:
            assert sorted(await db.keys("*")) == [b"toolpair:responses:bytes", b"toolpair:responses:seq"]
            assert await db.get("toolpair:responses:bytes") == b"0"
        finally:
            await db.aclose()
    finally:
        await store.close()


# --- Redis down ------------------------------------------------------------------------------------


def assert_store_unavailable(status: int, body: Any, headers: Any) -> None:
    assert status == 503, body
    assert body["error"]["code"] == "store_unavailable" and body["error"]["source"] == "toolpair"
    assert body["error"]["type"] == "server_error" and headers["Retry-After"]
    assert "redis" not in body["error"]["message"].lower()  # the store's address stays in the log


async def test_with_redis_down_only_requests_that_need_the_store_fail(
    engine: MockEngine, redis_server: RedisServer
) -> None:
    async with toolpair(engine, redis_server.url) as url:
        async with client(url) as sdk:
            first = await sdk.responses.create(model="m", input="stored while Redis is up")
        redis_server.kill()
        asked = len(engine.received)
        responses = url + "/v1/responses"
        assert_store_unavailable(*await raw("POST", responses, {"input": "more", "previous_response_id": first.id}))
        assert_store_unavailable(*await raw("GET", f"{responses}/{first.id}"))
        assert_store_unavailable(*await raw("DELETE", f"{responses}/{first.id}"))
        assert_store_unavailable(*await raw("POST", responses, {"input": "store me"}))  # store defaults to true
        assert len(engine.received) == asked  # refused before the engine did any work
        status, body, _ = await raw("POST", responses, {"input": "no store", "store": False})
        assert status == 200 and body["output"][0]["content"][0]["text"] == "ok"
        chat = {"messages": [{"role": "user", "content": "hi"}]}
        status, body, _ = await raw("POST", url + "/v1/chat/completions", chat)
        assert status == 200 and body["choices"][0]["message"]["content"] == "ok"
        async with aiohttp.ClientSession() as session, session.get(url + "/health") as health:
            assert health.status == 200

        redis_server.start()  # back, empty (no persistence): the store works again
        async with client(url) as sdk:
            again = await sdk.responses.create(model="m", input="stored again")
            assert (await sdk.responses.retrieve(again.id)).id == again.id
            with pytest.raises(openai.NotFoundError):
                await sdk.responses.retrieve(first.id)


async def test_a_response_generated_while_redis_dies_is_delivered_and_flagged(
    engine: MockEngine, redis_server: RedisServer
) -> None:
    async def redis_dies_during_generation(request: web.Request, received: Received) -> web.StreamResponse:
        redis_server.kill()
        return web.json_response(completion("generated anyway"))

    engine.then(redis_dies_during_generation)
    async with toolpair(engine, redis_server.url) as url:
        status, body, headers = await raw("POST", url + "/v1/responses", {"input": "hi"})
        assert status == 200 and body["output"][0]["content"][0]["text"] == "generated anyway"
        assert headers["X-Toolpair-Store"] == "failed"
        status, body, headers = await raw("GET", f"{url}/v1/responses/{body['id']}")
        assert_store_unavailable(status, body, headers)


async def test_a_stream_whose_store_dies_still_completes(
    engine: MockEngine, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    async def redis_dies_mid_stream(request: web.Request, received: Received) -> web.StreamResponse:
        redis_server.kill()
        return await stream_words(request, ["streamed ", "anyway"])

    engine.then(redis_dies_mid_stream)
    async with (
        toolpair(engine, redis_server.url) as url,
        client(url) as sdk,
        sdk.responses.stream(model="m", input="hi") as stream,
    ):
        final = await stream.get_final_response()
    assert final.status == "completed" and final.output_text == "streamed anyway"
    assert any(final.id in r.getMessage() and "not stored" in r.getMessage() for r in caplog.records)


async def test_a_bad_store_setting_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="responses_store"):
        proxy_app(Settings(upstream="http://127.0.0.1:9", responses_store="mysql://db"))


def test_the_store_is_chosen_by_flag_environment_or_file(tmp_path: Path) -> None:
    from proxy.cli import build_parser
    from proxy.config import load_settings

    url = "redis://127.0.0.1:6399/2"
    args = build_parser().parse_args(["proxy", "--upstream", "http://e", "--responses-store", url])
    assert load_settings({"responses_store": args.responses_store}, {}).responses_store == url
    assert build_parser().parse_args(["serve", "--responses-store", url]).responses_store == url
    assert load_settings({}, {"TOOLPAIR_RESPONSES_STORE": url}).responses_store == url
    config = tmp_path / "toolpair.yaml"
    config.write_text(f"responses_store: {url}\nresponses_store_ttl: null\n")
    from_file = load_settings({}, {}, config)
    assert (from_file.responses_store, from_file.responses_store_ttl) == (url, None)
    assert load_settings({}, {}).responses_store == "memory"
