"""The chat proxy through the real HTTP path: client -> toolpair -> mock engine."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from engine_launcher.supervise.launch import free_port
from tests.conftest import Stack
from tests.mock_engine import MockEngine, Received, breaks_off, chunk, never_answers
from tests.support.conversations import parallel_weather
from tests.support.http import leave_mid_stream, send_and_read
from tests.support.proxies import MakeProxy

pytestmark = pytest.mark.asyncio

USER, CALLS, OSLO, PARIS = parallel_weather("18C sun", "-3C snow")


def body(*messages: Any, **extra: Any) -> bytes:
    return orjson.dumps({"model": "m", "messages": list(messages), **extra})


async def post(url: str, data: bytes, path: str = "/v1/chat/completions", **kw: Any) -> tuple[int, Any, Any]:
    return await send_and_read(url, data, path, **kw)


async def test_reversed_results_reach_the_engine_in_call_order(stack: Stack) -> None:
    status, reply, _ = await post(stack.url, body(USER, CALLS, OSLO, PARIS))
    assert status == 200 and reply["choices"][0]["message"]["content"] == "ok"
    sent = stack.engine.last.json()["messages"]
    assert [m.get("tool_call_id") for m in sent] == [None, None, "call_paris", "call_oslo"]
    assert sent[2] == PARIS and sent[3] == OSLO
    assert set(stack.engine.last.json()) == {"model", "messages"}


@pytest.mark.parametrize(
    "raw",
    [
        body(USER, CALLS, PARIS, OSLO),  # already ordered
        body(USER, temperature=0.5),  # no tool results at all
        b'{"messages": [ {"role":"user", "content":"spaces and\\u00e9 escapes kept"} ],  "model":"m"}',
        body(USER, CALLS, OSLO, {"role": "tool", "tool_call_id": "call_x", "content": "?"}),  # unknown id
        body(USER, CALLS, OSLO),  # incomplete
        body(
            USER,
            {"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}},
            {"role": "function", "name": "f", "content": "1"},
        ),
    ],
    ids=["ordered", "no-results", "odd-formatting", "unknown-id", "incomplete", "legacy-function"],
)
async def test_bodies_that_need_no_move_reach_the_engine_byte_identical(stack: Stack, raw: bytes) -> None:
    status, _, _ = await post(stack.url, raw)
    assert status == 200
    assert stack.engine.last.body == raw


async def test_reordered_body_adds_and_removes_no_fields(stack: Stack) -> None:
    extra = {"temperature": 0, "tools": [{"type": "function", "function": {"name": "get_weather"}}], "x_custom": [1]}
    await post(stack.url, body(USER, CALLS, OSLO, PARIS, **extra))
    sent = stack.engine.last.json()
    assert sent == {"model": "m", "messages": [USER, CALLS, PARIS, OSLO], **extra}


async def test_missing_or_odd_content_type_is_tolerated(stack: Stack) -> None:
    raw = body(USER, CALLS, OSLO, PARIS)
    status, _, _ = await post(stack.url, raw, headers={"Content-Type": "text/plain"})
    assert status == 200
    assert [m.get("tool_call_id") for m in stack.engine.last.json()["messages"]][2:] == ["call_paris", "call_oslo"]


async def test_unprefixed_chat_route_is_ordered_too(stack: Stack) -> None:
    await post(stack.url, body(USER, CALLS, OSLO, PARIS), path="/chat/completions")
    assert stack.engine.last.path == "/chat/completions"
    assert stack.engine.last.json()["messages"][2] == PARIS


async def test_stream_is_relayed_chunk_by_chunk_not_buffered(stack: Stack) -> None:
    gate = asyncio.Event()

    async def gated(request: web.Request, received: Received) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(chunk({"role": "assistant", "content": "first"}))
        await asyncio.wait_for(gate.wait(), 5)  # only continues once the client saw chunk 1
        await response.write(chunk({"content": "second"}, "stop") + b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    stack.engine.then(gated)
    async with (
        aiohttp.ClientSession() as session,
        session.post(stack.url + "/v1/chat/completions", data=body(USER, stream=True)) as response,
    ):
        assert response.headers["Content-Type"].startswith("text/event-stream")
        assert response.headers["X-Accel-Buffering"] == "no"
        assert response.headers["Cache-Control"] == "no-cache"
        first = await asyncio.wait_for(response.content.readuntil(b"\n\n"), 3)
        assert b"first" in first
        gate.set()
        rest = await asyncio.wait_for(response.content.read(), 3)
    assert b"second" in rest and rest.endswith(b"data: [DONE]\n\n")


async def test_upstream_failure_mid_stream_ends_with_an_error_line(stack: Stack) -> None:
    stack.engine.then(breaks_off(chunk({"content": "partial"}) + b'data: {"half": '))
    status, raw, _ = await post(stack.url, body(USER, stream=True))
    assert status == 200
    frames = raw.split(b"\n\n")
    assert frames[0].startswith(b"data: ") and b"partial" in frames[0]
    assert b"half" not in raw  # the partial frame is never written
    error = orjson.loads(frames[1][len(b"data: ") :])["error"]
    assert error["type"] == "upstream_error" and stack.engine.url in error["message"]
    assert frames[2:] == [b""]


@pytest.mark.parametrize(
    ("method", "path", "payload"),
    [
        ("GET", "/v1/models", None),
        ("POST", "/v1/embeddings?x=1&y=2", b'{"input": "hi"}'),
        ("POST", "/v1/completions", b'{"prompt": "hi", "tool_call_id": 1}'),
        ("GET", "/props", None),
        ("PUT", "/extras/never/heard/of?q=%20", b"\x00\x01binary"),
        ("DELETE", "/v1/files/abc", None),
    ],
)
async def test_other_paths_pass_through_transparently(
    stack: Stack, method: str, path: str, payload: bytes | None
) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method, stack.url + path, data=payload, headers={"X-Custom": "kept", "Authorization": "Bearer k"}
        ) as response,
    ):
        status = response.status
        await response.read()
    assert status == 200
    seen = stack.engine.last
    assert seen.method == method
    assert seen.query_string == (path.split("?")[1].replace("%20", " ") if "?" in path else "")
    assert seen.path == path.split("?")[0]
    assert seen.body == (payload or b"")
    assert seen.headers["X-Custom"] == "kept" and seen.headers["Authorization"] == "Bearer k"


async def test_passthrough_keeps_status_headers_and_body(stack: Stack) -> None:
    async def teapot(request: web.Request, received: Received) -> web.StreamResponse:
        return web.Response(status=418, body=b"short and stout", headers={"X-Engine": "1", "Content-Type": "text/x"})

    stack.engine.then(teapot)
    async with aiohttp.ClientSession() as session, session.get(stack.url + "/anything?a=b") as response:
        assert response.status == 418
        assert response.headers["X-Engine"] == "1"
        assert response.headers["Content-Type"] == "text/x"
        assert await response.read() == b"short and stout"
    assert stack.engine.last.query_string == "a=b"


async def test_engine_error_status_on_chat_is_relayed(stack: Stack) -> None:
    stack.engine.reply_json({"error": {"message": "boom"}}, status=500)
    status, reply, _ = await post(stack.url, body(USER))
    assert status == 500 and reply == {"error": {"message": "boom"}}


async def test_client_disconnect_closes_the_upstream_request(stack: Stack) -> None:
    started = asyncio.Event()

    stack.engine.then(never_answers(started))
    session = aiohttp.ClientSession()
    task = asyncio.create_task(session.post(stack.url + "/v1/chat/completions", data=body(USER)))
    await asyncio.wait_for(started.wait(), 3)
    task.cancel()
    await session.close()
    await stack.engine.wait_cancelled()
    assert len(stack.engine.cancelled) == 1


async def test_client_disconnect_mid_stream_stops_the_engine(stack: Stack) -> None:
    stack.engine.stream_word_count = 1000
    stack.engine.stream_delay = 0.01
    await leave_mid_stream(stack.url, "/v1/chat/completions", b"\n\n", data=body(USER, stream=True))
    await stack.engine.wait_cancelled()
    assert len(stack.engine.cancelled) == 1


@pytest.fixture
async def proxy_to_nowhere(make_proxy_to: MakeProxy) -> AsyncIterator[tuple[str, str]]:
    upstream = f"http://127.0.0.1:{free_port()}"
    yield await make_proxy_to(upstream=upstream, connect_timeout=1.0), upstream


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models"])
async def test_upstream_down_is_a_502_naming_it(proxy_to_nowhere: tuple[str, str], path: str) -> None:
    url, upstream = proxy_to_nowhere
    status, reply, headers = await post(url, body(USER), path=path)
    assert status == 502
    assert reply["error"]["type"] == "upstream_error"
    assert reply["error"]["code"] == "upstream_unavailable"
    assert upstream in reply["error"]["message"]
    assert headers["X-Toolpair-Error"] == "upstream_unavailable"


async def test_upstream_silent_past_the_read_timeout_is_a_504(engine: MockEngine, make_proxy: MakeProxy) -> None:
    engine.then(never_answers(seconds=10))
    async with make_proxy.running(upstream_read_timeout=0.3) as (url, _):
        status, reply, _ = await post(url, body(USER))
    assert status == 504
    assert reply["error"]["code"] == "upstream_timeout" and engine.url in reply["error"]["message"]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe\x00", "not valid JSON"),
        (b"", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'"text"', "must be a JSON object"),
        (b'{"messages": {"role": "user"}}', "'messages' must be a list"),
        (b'{"model": "m"}', "'messages' must be a list"),
        (b'{"messages": null, "tool_call_id": 1}', "'messages' must be a list"),
    ],
)
async def test_bad_chat_bodies_are_openai_shaped_400s(stack: Stack, raw: bytes, message: str) -> None:
    status, reply, _ = await post(stack.url, raw)
    assert status == 400
    assert set(reply) == {"error"}
    assert reply["error"]["type"] == "invalid_request_error"
    assert message in reply["error"]["message"]
    assert stack.engine.received == []


async def test_body_over_the_limit_is_a_413(engine: MockEngine, make_proxy: MakeProxy) -> None:
    async with make_proxy.running(max_body_bytes=1000) as (url, _):
        status, reply, _ = await post(url, body(USER, padding="x" * 2000))
        status_chunked, reply_chunked, _ = await post(url, _chunks(body(USER, padding="x" * 2000)))
    assert status == status_chunked == 413
    assert reply["error"]["code"] == reply_chunked["error"]["code"] == "body_too_large"
    assert engine.received == []


async def _chunks(raw: bytes) -> AsyncIterator[bytes]:
    for i in range(0, len(raw), 300):
        yield raw[i : i + 300]


async def test_default_limit_accepts_large_agent_bodies(stack: Stack) -> None:
    image = "data:image/png;base64," + "A" * (3 * 1024 * 1024)
    big = body(
        USER,
        CALLS,
        OSLO,
        {"role": "tool", "tool_call_id": "call_paris", "content": [{"type": "image_url", "image_url": {"url": image}}]},
    )
    status, _, _ = await post(stack.url, big)
    assert status == 200
    assert stack.engine.last.json()["messages"][2]["tool_call_id"] == "call_paris"


async def test_probe_routes_are_answered_by_toolpair(stack: Stack) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(stack.url + "/health") as response:
            assert response.status == 200 and await response.json() == {"status": "ok"}
        assert stack.engine.received == []  # liveness never asks the engine
        async with session.get(stack.url + "/ready") as response:
            assert response.status == 200
            assert await response.json() == {"status": "ready", "upstream": {"status": 200}}
        assert [r.path for r in stack.engine.received] == ["/health"]

        async def loading(request: web.Request, received: Received) -> web.StreamResponse:
            return web.json_response({"error": "loading model"}, status=503)

        stack.engine.then(loading)
        async with session.get(stack.url + "/ready") as response:
            assert response.status == 503
            assert await response.json() == {"status": "not ready", "upstream": {"status": 503}}


async def test_ready_is_503_when_the_upstream_is_down(make_proxy_to: MakeProxy) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    async with make_proxy_to.running(upstream=dead, connect_timeout=1.0) as (url, _):
        async with aiohttp.ClientSession() as session, session.get(url + "/ready") as response:
            body = await response.json()
        assert response.status == 503 and body["status"] == "not ready" and "unreachable" in body["upstream"]["error"]


async def test_an_endless_event_from_the_engine_ends_with_an_error_not_unbounded_memory(stack: Stack) -> None:
    async def endless(request: web.Request, received: Received) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(chunk({"content": "first"}) + b'data: {"content": "')
        block = b"z" * (1 << 20)
        for _ in range(64):  # 64 MiB in one event that never ends
            await response.write(block)
        await response.write_eof()
        return response

    stack.engine.then(endless)
    status, raw, _ = await post(stack.url, body(USER, stream=True))
    assert status == 200
    frames = raw.split(b"\n\n")
    assert b"first" in frames[0]
    error = orjson.loads(frames[1][len(b"data: ") :])["error"]
    assert "larger than" in error["message"] and error["source"] == "toolpair"
    assert frames[2:] == [b""]


async def test_a_body_that_stops_arriving_gets_a_408_and_never_reaches_the_engine(
    engine: MockEngine, make_proxy: MakeProxy
) -> None:
    async with make_proxy.running(body_read_timeout=0.5) as (url, _):
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n" + b'{"messages": ['
        )
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        writer.close()
    assert head.startswith(b"HTTP/1.1 408")
    assert engine.received == []
