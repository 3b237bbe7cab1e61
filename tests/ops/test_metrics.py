"""/metrics scraped over HTTP and parsed with prometheus_client's parser: the numbers move as they should."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

import proxy
from proxy.errors import EngineUnavailableError
from proxy.ops.engine_probe import ENGINE_PROBE, EngineReading, EngineSnapshot
from proxy.ops.trace import note_toolcalls, trace_of
from tests.conftest import Stack
from tests.mock_engine import MockEngine, Received, chunk, never_answers
from tests.support.conversations import RESULT_A as A
from tests.support.conversations import RESULT_B as B
from tests.support.conversations import TWO_CALLS as CALLS
from tests.support.proxies import MakeProxy

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

USER = {"role": "user", "content": "go"}


def chat(*messages: Any, **extra: Any) -> bytes:
    return orjson.dumps({"model": "m", "messages": [USER, *messages], **extra})


async def scrape(url: str) -> Samples:
    # toolpair's own families alone: /metrics would also ask the (mock) engine, which answers any path
    async with aiohttp.ClientSession() as session, session.get(url + "/toolpair/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = await response.text()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


async def send(url: str, path: str = "/v1/chat/completions", data: bytes | None = None, method: str = "POST") -> bytes:
    async with aiohttp.ClientSession() as session, session.request(method, url + path, data=data) as response:
        return await response.read()


CHAT = {"route": "/v1/chat/completions"}


async def test_reordered_request_moves_the_counters(stack: Stack) -> None:
    before = await scrape(stack.url)
    await send(stack.url, data=chat(CALLS, B, A))
    after = await scrape(stack.url)
    assert delta(before, after, "toolpair_runs_reordered_total", api="chat") == 1
    assert delta(before, after, "toolpair_runs_in_order_total", api="chat") == 0
    assert delta(before, after, "toolpair_requests_total", status="200", **CHAT) == 1
    assert delta(before, after, "toolpair_request_duration_seconds_count", **CHAT) == 1
    assert delta(before, after, "toolpair_upstream_ttfb_seconds_count", **CHAT) == 1
    assert 0 < delta(before, after, "toolpair_upstream_ttfb_seconds_sum", **CHAT) < 5
    # the mock engine's usage: 5 prompt tokens, 1 completion token
    assert delta(before, after, "toolpair_prompt_tokens_total", **CHAT) == 5
    assert delta(before, after, "toolpair_completion_tokens_total", **CHAT) == 1
    # the scrape before did not count itself
    assert delta(before, after, "toolpair_requests_total", route="toolpair_metrics", status="200") == 0
    assert value(after, "toolpair_requests_in_flight") == 0  # nor is the scrape in flight


async def test_reading_leaves_every_metric_as_it_was(stack: Stack) -> None:
    """Scrapes, probes and status reads count nowhere: two scrapes with only reads between are the same bytes."""
    await send(stack.url, data=chat(CALLS, B, A))  # labelled children and histograms to read
    async with aiohttp.ClientSession() as session:

        async def read(path: str, **headers: str) -> bytes:
            async with session.get(stack.url + path, headers=headers) as response:
                assert response.status in (200, 503), path
                return await response.read()

        for accept in ({}, {"Accept": "application/openmetrics-text; version=1.0.0"}):
            first = await read("/toolpair/metrics", **accept)
            assert b"toolpair_requests_total{" in first and b"_created" not in first
            for path in ("/health", "/ready", "/toolpair/status", "/metrics", "/toolpair/metrics"):
                await read(path, **accept)
            assert await read("/toolpair/metrics", **accept) == first


ENGINE_STATUS = ("/props", "/slots", "/models", "/v1/models", "/v1/health", "/lora-adapters")


async def test_reading_the_engines_state_through_toolpair_leaves_every_metric_as_it_was(stack: Stack) -> None:
    """GET and HEAD of the engine's status paths reach the engine, but count nowhere in toolpair."""
    await send(stack.url, data=chat(CALLS, B, A))
    first = await send(stack.url, "/toolpair/metrics", method="GET")
    seen = len(stack.engine.received)
    for path in ENGINE_STATUS:
        for method in ("GET", "HEAD"):
            await send(stack.url, path + "?model=m", method=method)
    assert [(r.method, r.path) for r in stack.engine.received[seen:]] == [
        (method, path) for path in ENGINE_STATUS for method in ("GET", "HEAD")
    ]
    assert await send(stack.url, "/toolpair/metrics", method="GET") == first


async def test_writing_to_an_engine_status_path_is_counted(stack: Stack) -> None:
    before = await scrape(stack.url)
    await send(stack.url, "/props", b'{"n_ctx": 1}')
    await send(stack.url, "/lora-adapters", b"[]")
    await send(stack.url, "/slots/0?action=erase", b"{}")
    after = await scrape(stack.url)
    assert delta(before, after, "toolpair_requests_total", route="passthrough", status="200") == 3
    assert delta(before, after, "toolpair_request_duration_seconds_count", route="passthrough") == 3


async def test_in_order_and_kept_runs_by_reason(stack: Stack) -> None:
    before = await scrape(stack.url)
    await send(stack.url, data=chat(CALLS, A, B))
    await send(stack.url, data=chat(CALLS, B))
    await send(stack.url, data=chat(CALLS, B, {**A, "tool_call_id": "call_b"}))
    await send(stack.url, data=chat(CALLS, B, A), path="/chat/completions")
    after = await scrape(stack.url)
    assert delta(before, after, "toolpair_runs_in_order_total", api="chat") == 1
    assert delta(before, after, "toolpair_runs_kept_total", api="chat", reason="incomplete_run") == 1
    assert delta(before, after, "toolpair_runs_kept_total", api="chat", reason="duplicate_id") == 1
    assert delta(before, after, "toolpair_runs_reordered_total", api="chat") == 1
    assert delta(before, after, "toolpair_requests_total", route="/chat/completions", status="200") == 1


async def test_passthrough_is_counted_under_one_route_label(stack: Stack) -> None:
    stack.engine.reply_json({"object": "list", "data": [], "usage": {"prompt_tokens": 4, "total_tokens": 4}})
    before = await scrape(stack.url)
    await send(stack.url, "/v1/embeddings", b'{"input": "hi"}')
    await send(stack.url, "/v1/files", method="GET")
    await send(stack.url, "/some/random/path/123", method="DELETE")
    after = await scrape(stack.url)
    assert delta(before, after, "toolpair_requests_total", route="passthrough", status="200") == 3
    assert delta(before, after, "toolpair_prompt_tokens_total", route="passthrough") == 4
    assert delta(before, after, "toolpair_upstream_ttfb_seconds_count", route="passthrough") == 3
    assert delta(before, after, "toolpair_runs_reordered_total", api="chat") == 0
    assert not any("random" in str(key) for key in after)


async def test_stream_usage_is_counted_and_the_relay_stays_byte_identical(stack: Stack) -> None:
    sent = (
        chunk({"role": "assistant", "content": "hi"})
        + chunk({}, "stop")
        + b'data: {"id":"c","object":"chat.completion.chunk","choices":[],'
        b'"usage":{"prompt_tokens":30,"completion_tokens":7,"total_tokens":37}}\n\n' + b"data: [DONE]\n\n"
    )

    async def streams(request: web.Request, received: Received) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(0, len(sent), 50):  # arbitrary chunking: usage split across writes
            await response.write(sent[i : i + 50])
        await response.write_eof()
        return response

    stack.engine.then(streams)
    before = await scrape(stack.url)
    got = await send(stack.url, data=chat(stream=True, stream_options={"include_usage": True}))
    after = await scrape(stack.url)
    assert got == sent
    assert delta(before, after, "toolpair_prompt_tokens_total", **CHAT) == 30
    assert delta(before, after, "toolpair_completion_tokens_total", **CHAT) == 7


async def test_errors_are_counted_by_status(stack: Stack) -> None:
    stack.engine.reply_json({"error": {"message": "boom"}}, status=500)
    before = await scrape(stack.url)
    await send(stack.url, data=chat())
    await send(stack.url, data=b"{not json")
    after = await scrape(stack.url)
    assert delta(before, after, "toolpair_requests_total", status="500", **CHAT) == 1
    assert delta(before, after, "toolpair_requests_total", status="400", **CHAT) == 1


async def test_client_that_leaves_is_counted_as_499(stack: Stack) -> None:
    started = asyncio.Event()

    stack.engine.then(never_answers(started))
    before = await scrape(stack.url)
    session = aiohttp.ClientSession()
    task = asyncio.create_task(session.post(stack.url + "/v1/chat/completions", data=chat()))
    await asyncio.wait_for(started.wait(), 3)
    task.cancel()
    await session.close()
    for _ in range(100):
        after = await scrape(stack.url)
        if delta(before, after, "toolpair_requests_total", status="499", **CHAT):
            break
        await asyncio.sleep(0.02)
    assert delta(before, after, "toolpair_requests_total", status="499", **CHAT) == 1
    assert value(after, "toolpair_requests_in_flight") == 0  # the request that left; the scrape is not counted


class FakeEngine:
    """What the managed engine's owner will provide: a snapshot on demand, and an admission gate."""

    def __init__(self) -> None:
        self.snapshot = EngineSnapshot(state="starting", restarts=0, backend="cpu", model="gemma.gguf", queue_depth=0)
        self.refuse = False

    @asynccontextmanager
    async def admit(self, request: web.Request, conversation: str | None) -> AsyncIterator[None]:
        await asyncio.sleep(0.05)
        trace_of(request).queued(0.05)
        if self.refuse:
            raise EngineUnavailableError("engine is restarting")
        note_toolcalls(2, 1)  # stands in for extraction, which runs where the request is not in reach
        yield


@pytest.fixture
async def managed(make_proxy: MakeProxy) -> AsyncIterator[tuple[str, FakeEngine]]:
    fake = FakeEngine()

    def probe_the_fake(app: web.Application) -> None:
        app[ENGINE_PROBE] = lambda: fake.snapshot

    yield await make_proxy(admission=fake.admit, before_start=probe_the_fake), fake


async def test_engine_queue_and_extraction_hooks(managed: tuple[str, FakeEngine]) -> None:
    url, fake = managed
    first = await scrape(url)
    assert value(first, "toolpair_engine_state", state="starting") == 1
    assert value(first, "toolpair_engine_state", state="ready") == 0
    assert value(first, "toolpair_engine_restarts_total") == 0
    fake.snapshot = EngineSnapshot(state="ready", restarts=2, queue_depth=3)
    await send(url, data=chat())
    fake.refuse = True
    await send(url, data=chat())
    after = await scrape(url)
    assert value(after, "toolpair_engine_state", state="ready") == 1
    assert value(after, "toolpair_engine_state", state="starting") == 0
    assert value(after, "toolpair_engine_restarts_total") == 2
    assert value(after, "toolpair_queue_depth") == 3
    assert delta(first, after, "toolpair_queue_wait_seconds_count") == 2
    assert delta(first, after, "toolpair_queue_wait_seconds_sum") == pytest.approx(0.1)
    assert delta(first, after, "toolpair_tool_calls_extracted_total") == 2
    assert delta(first, after, "toolpair_tool_call_extraction_failures_total") == 1
    assert delta(first, after, "toolpair_requests_total", status="503", **CHAT) == 1
    fake.snapshot = EngineSnapshot(state="failed", restarts=5)
    failed = await scrape(url)
    assert value(failed, "toolpair_engine_state", state="failed") == 1
    assert ("toolpair_queue_depth", ()) not in failed


async def test_sidecar_exports_no_engine_metrics(stack: Stack) -> None:
    samples = await scrape(stack.url)
    assert not any(name.startswith(("toolpair_engine", "toolpair_queue_depth")) for name, _ in samples)
    assert value(samples, "toolpair_build_info", version=proxy.__version__) == 1


async def test_each_app_has_its_own_registry(make_proxy: MakeProxy) -> None:
    url_one, url_two = await make_proxy(), await make_proxy()
    await send(url_one, data=chat(CALLS, B, A))
    assert value(await scrape(url_one), "toolpair_runs_reordered_total", api="chat") == 1
    assert value(await scrape(url_two), "toolpair_runs_reordered_total", api="chat") == 0


async def test_openmetrics_is_served_when_asked(stack: Stack) -> None:
    headers = {"Accept": "application/openmetrics-text; version=1.0.0"}
    async with aiohttp.ClientSession() as session, session.get(stack.url + "/metrics", headers=headers) as response:
        assert response.headers["Content-Type"].startswith("application/openmetrics-text")
        assert (await response.text()).endswith("# EOF\n")


# -- /toolpair/status


async def status_of(url: str, **headers: str) -> Any:
    async with aiohttp.ClientSession() as session, session.get(url + "/toolpair/status", headers=headers) as response:
        assert response.status == 200
        return await response.json()


async def test_status_in_sidecar_mode(engine: MockEngine, make_proxy: MakeProxy) -> None:
    host = engine.url.removeprefix("http://")
    async with make_proxy.running(upstream=f"http://user:pw-secret@{host}", api_keys=["k"]) as (url, _):
        async with aiohttp.ClientSession() as session:
            await session.post(url + "/v1/chat/completions", data=chat(CALLS, B, A), headers={"x-api-key": "k"})
        status = await status_of(url, **{"x-api-key": "k"})
    assert status["version"] == proxy.__version__
    assert status["mode"] == "sidecar"
    assert status["upstream"] == engine.url and "pw-secret" not in orjson.dumps(status).decode()
    assert status["engine"] == {"state": None, "backend": None, "model": None, "restarts": None, "queue_depth": None}
    assert status["auth"] == {"keys_required": True}
    assert 0 <= status["uptime_seconds"] < 60
    assert status["counters"]["runs_reordered"] == 1
    assert status["counters"]["requests"] == 1  # the chat request; this one is counted when it ends
    assert status["counters"]["prompt_tokens"] == 5


async def test_status_reports_the_managed_engine(managed: tuple[str, FakeEngine]) -> None:
    url, fake = managed
    fake.snapshot = EngineSnapshot(state="ready", restarts=1, backend="cuda", model="qwen.gguf", queue_depth=0)
    status = await status_of(url)
    assert status["mode"] == "managed"
    assert status["engine"] == {
        "state": "ready",
        "backend": "cuda",
        "model": "qwen.gguf",
        "restarts": 1,
        "queue_depth": 0,
    }


async def test_each_of_several_engines_has_its_own_series_and_status(managed: tuple[str, FakeEngine]) -> None:
    url, fake = managed
    fake.snapshot = EngineSnapshot(
        state="ready",
        restarts=1,
        queue_depth=0,
        engines=(
            EngineReading("engine-0", "starting", restarts=1, active=0, served=3, port=41001),
            EngineReading("engine-1", "ready", restarts=0, active=1, served=5, port=41002),
        ),
    )
    samples = await scrape(url)
    assert value(samples, "toolpair_engine_instance_state", engine="engine-0", state="starting") == 1
    assert value(samples, "toolpair_engine_instance_state", engine="engine-0", state="ready") == 0
    assert value(samples, "toolpair_engine_instance_state", engine="engine-1", state="ready") == 1
    assert value(samples, "toolpair_engine_instance_restarts_total", engine="engine-0") == 1
    assert value(samples, "toolpair_engine_instance_active", engine="engine-1") == 1
    assert value(samples, "toolpair_engine_instance_requests_total", engine="engine-1") == 5
    status = await status_of(url)
    assert status["engine"]["engines"] == [
        {"name": "engine-0", "state": "starting", "restarts": 1, "active": 0, "served": 3, "port": 41001},
        {"name": "engine-1", "state": "ready", "restarts": 0, "active": 1, "served": 5, "port": 41002},
    ]
