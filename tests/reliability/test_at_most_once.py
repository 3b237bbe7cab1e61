"""Nothing lost, nothing doubled: each client request reaches the engine at most once.

Generations are not idempotent, so toolpair never retries one: not when the engine
breaks off, fails, or goes silent, and not under load. A request toolpair refuses
(key, size, shape, a full queue) never reaches the engine at all.

Two kinds of extra engine call exist by design, and are told apart here: after a
stream that asked for usage, llama-cpp-python (which streams none) is asked the
prompt's size with the same request at ``max_tokens: 1`` (answered from its prompt
cache); and when an Anthropic stream breaks before its first chunk, the engine is
asked the same request at ``max_tokens: 1`` without streaming, to learn its error
(a prompt too long for the context is reported only that way). Neither produces
output for the client, and neither is ever sent after a timeout.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
from aiohttp import web

from proxy.engine.queueing import EngineQueue
from tests.mock_engine import MockEngine, Received, chunk
from tests.reliability.client import post
from tests.reliability.conftest import Proxy, ProxyFactory
from tests.reliability.figures import count, record
from tests.reliability.streams import check_error_body, check_stream
from tests.reliability.workload import APIS, PROMPT_MARK, body
from tests.support.proxies import MakeProxy

Handler = Callable[[web.Request, Received], Awaitable[web.StreamResponse]]
SERIAL = re.compile(rf"{PROMPT_MARK} (\d+):".encode())


def serial_of(received: Received) -> int | None:
    match = SERIAL.search(received.body)
    return int(match.group(1)) if match else None


def generations(engine: MockEngine) -> list[Received]:
    """Chat calls that generate for the client: everything but the one-token usage replays and probes."""
    calls = [r for r in engine.received if r.path == "/v1/chat/completions"]
    return [r for r in calls if r.json().get("max_tokens") != 1]


def one_token_calls(engine: MockEngine) -> list[Received]:
    calls = [r for r in engine.received if r.path == "/v1/chat/completions"]
    return [r for r in calls if r.json().get("max_tokens") == 1 and not r.json().get("stream")]


async def _closed_mid_stream(request: web.Request, received: Received) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(chunk({"role": "assistant", "content": ""}) + chunk({"content": "partial "}))
    await asyncio.sleep(0.02)
    assert request.transport is not None
    request.transport.close()
    return response


async def _closed_before_answering(request: web.Request, received: Received) -> web.StreamResponse:
    assert request.transport is not None
    request.transport.close()
    return web.Response()


async def _status_500(request: web.Request, received: Received) -> web.StreamResponse:
    return web.json_response({"error": {"message": "engine failed"}}, status=500)


async def _status_503(request: web.Request, received: Received) -> web.StreamResponse:
    return web.json_response({"error": {"message": "engine busy"}}, status=503)


async def _silent(request: web.Request, received: Received) -> web.StreamResponse:
    await asyncio.sleep(3600)
    raise AssertionError("unreachable")  # pragma: no cover


FAULTS: dict[str, Handler] = {
    "closed before answering": _closed_before_answering,
    "closed mid-stream": _closed_mid_stream,
    "500": _status_500,
    "503": _status_503,
    "silent past the read timeout": _silent,
}


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("api", APIS)
async def test_a_failed_generation_is_never_sent_again(
    proxy_factory: ProxyFactory, api: str, fault: str, stream: bool
) -> None:
    async with proxy_factory(engine_kind="llama-cpp-python", upstream_read_timeout=1.0) as proxy:
        engine = proxy.engine
        engine.tokenizer = True
        handler = FAULTS[fault]

        async def faulty(request: web.Request, received: Received) -> web.StreamResponse:
            return await handler(request, received)

        for _ in range(5):  # whatever reaches the engine meets the fault
            engine.then(faulty)
        answer = await post(proxy.url, api, body(api, 5, stream=stream), deadline=15)
        if answer.headers.get("Content-Type", "").startswith("text/event-stream"):
            assert check_stream(api, answer.body).outcome == "error"
        else:
            assert answer.status >= 400, answer.body[:300]
            if answer.toolpairs:
                check_error_body(api, answer.body)
        await asyncio.sleep(0.1)  # anything toolpair would send afterwards has been sent
        assert len(generations(engine)) == 1, [r.body[:120] for r in engine.received]
        probes = one_token_calls(engine)
        # Only an Anthropic stream that broke before its first chunk asks again, for the engine's error.
        if probes:
            assert api == "anthropic" and fault in ("closed before answering",), fault
            assert len(probes) <= 2 and all(serial_of(p) == 5 for p in probes)
        if fault.startswith("silent"):
            assert probes == []
        count("at_most_once", "failed_generations_not_retried")
        if probes:
            count("at_most_once", "anthropic_one_token_probes", len(probes))


async def test_under_load_each_request_reaches_the_engine_exactly_once(llama_proxy: Proxy) -> None:
    """120 concurrent streams, a quarter of them broken off by the engine: one generation per request."""
    engine = llama_proxy.engine
    per_api = 40

    async def dispatch(request: web.Request, received: Received) -> web.StreamResponse:
        serial = serial_of(received) if request.path == "/v1/chat/completions" else None
        if serial is not None and serial % 4 == 0 and received.json().get("stream"):
            return await _closed_mid_stream(request, received)
        return await engine._default(request, received)

    for _ in range(per_api * len(APIS) * 6):
        engine.then(dispatch)
    requests = [(api, serial) for serial in range(per_api * len(APIS)) for api in [APIS[serial % len(APIS)]]]
    answers = await asyncio.gather(*(post(llama_proxy.url, api, body(api, serial)) for api, serial in requests))

    outcomes = {}
    for (api, serial), answer in zip(requests, answers, strict=True):
        assert answer.status == 200, answer.body[:300]
        outcomes[serial] = check_stream(api, answer.body).outcome
        assert outcomes[serial] == ("error" if serial % 4 == 0 else "complete"), (api, serial, answer.body[-300:])
    by_serial: dict[int | None, int] = {}
    for sent in generations(engine):
        by_serial[serial_of(sent)] = by_serial.get(serial_of(sent), 0) + 1
    assert by_serial == {serial: 1 for _, serial in requests}
    # The usage replays follow only streams that completed, one each at most.
    replays = [serial_of(r) for r in one_token_calls(engine)]
    assert len(replays) == len(set(replays)) and all(serial % 4 != 0 for serial in replays if serial is not None)
    record(
        "at_most_once",
        concurrent_requests=len(requests),
        broken_off_by_the_engine=sum(1 for o in outcomes.values() if o == "error"),
        lost=len(requests) - len(answers),
        doubled=sum(n - 1 for n in by_serial.values()),
    )


# --- refused requests never reach the engine ----------------------------------------------------


async def test_requests_toolpair_refuses_never_reach_the_engine(engine: MockEngine, make_proxy: MakeProxy) -> None:
    async def ready() -> None:
        return None

    queue = EngineQueue(ready, max_concurrency=1, max_queue=0)
    settings = {"engine_kind": "llama-cpp-python", "api_keys": ["k"], "max_body_bytes": 4096}
    key = {"Authorization": "Bearer k"}
    refused: dict[str, int] = {}
    async with make_proxy.running(**settings, admission=queue) as (url, _):
        for api in APIS:
            cases: list[tuple[str, Any, dict[str, str], int]] = [
                ("no key", body(api), {}, 401),
                ("wrong key", body(api), {"Authorization": "Bearer nope"}, 401),
                ("too large", orjson.dumps({"pad": "x" * 5000}), key, 413),
                ("not JSON", b"{", key, 400),
            ]
            for name, payload, headers, status in cases:
                answer = await post(url, api, payload, headers=headers)
                assert answer.status == status and answer.toolpairs, (api, name, answer.body[:200])
                refused[name] = refused.get(name, 0) + 1
            # A full queue: one request holds the engine's only slot, no place to wait.
            engine.then(_silent)
            arrived = len(engine.received)
            holder = asyncio.create_task(post(url, api, body(api), headers=key, deadline=30))
            for _ in range(500):  # admitted, and its generation reached the engine
                if queue.active == 1 and len(engine.received) > arrived:
                    break
                await asyncio.sleep(0.01)
            before = len(engine.received)
            answer = await post(url, api, body(api, 1), headers=key)
            assert answer.status == 429 and answer.toolpairs
            refused["queue full"] = refused.get("queue full", 0) + 1
            assert len(engine.received) == before
            holder.cancel()
            await asyncio.gather(holder, return_exceptions=True)
            for _ in range(200):
                if queue.active == 0:
                    break
                await asyncio.sleep(0.01)
        generated = [serial_of(r) for r in engine.received]
        assert generated == [0, 0, 0], "only the three requests that held the slot reached the engine"
    record("at_most_once", refused_requests_that_reached_the_engine=0, refused_by_reason=refused)
