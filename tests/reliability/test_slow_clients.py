"""Slow and vanishing clients, for each API.

- A client that reads one byte a second: its own engine stream stalls (toolpair
  stops reading it, so the engine's writes block), and the other clients finish
  about as fast as without it (compared with a baseline, with a generous bound).
- A client that leaves before the engine answers, or in the middle of a stream:
  the engine sees its request cancelled at once, and nothing is left running in
  toolpair (no request in flight, no stray task).
- A client that leaves while it waits in the engine queue (``EngineQueue``, the
  admission ``toolpair serve`` uses): its place is freed, the engine never sees it,
  and the next request is served.

The slow reader is a raw socket with a 4 KiB receive buffer that takes one byte
off it each second (``loop.sock_recv(sock, 1)``): asyncio's stream reader would
drain the kernel buffer into its own.
"""

from __future__ import annotations

import asyncio
import socket
import statistics
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
from aiohttp import web

from proxy.engine.queueing import EngineQueue
from proxy.ops.metrics import METRICS
from tests.mock_engine import MockEngine, Received, chunk
from tests.reliability.client import HEADERS, post
from tests.reliability.conftest import Proxy
from tests.reliability.figures import count, record
from tests.reliability.streams import check_stream
from tests.reliability.workload import APIS, PATHS, body, encoded
from tests.support.proxies import MakeProxy

# --- helpers ------------------------------------------------------------------------------------


class SlowReader:
    """A client that sends one streaming request and then reads its answer one byte a second."""

    def __init__(self, url: str, api: str) -> None:
        parts = urlsplit(url)
        self.address = (parts.hostname or "127.0.0.1", parts.port or 80)
        payload = encoded(api)
        head = (
            f"POST {PATHS[api]} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
            f"anthropic-version: 2023-06-01\r\nContent-Length: {len(payload)}\r\n\r\n"
        )
        self.request = head.encode() + payload
        self.received = b""
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self._sock.setblocking(False)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.sock_connect(self._sock, self.address)
        await loop.sock_sendall(self._sock, self.request)
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            byte = await loop.sock_recv(self._sock, 1)
            if not byte:
                return
            self.received += byte
            await asyncio.sleep(1)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._sock.close()


def big_stream(written: dict[str, int], chunks: int = 40_000) -> Any:
    """An engine reply of ``chunks`` 1 KiB content chunks; ``written`` counts what its writes let through."""
    piece = chunk({"content": "x" * 1000})

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(chunk({"role": "assistant", "content": ""}))
        for _ in range(chunks):
            await response.write(piece)  # blocks while the reader does not read
            written["bytes"] = written.get("bytes", 0) + len(piece)
        await response.write(chunk({}, "stop") + b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    return handler


async def until(condition: Any, within: float = 5.0, step: float = 0.02) -> float:
    """Wait for ``condition()`` to hold; returns the seconds it took."""
    started = time.monotonic()
    async with asyncio.timeout(within):
        while True:
            if condition():
                return time.monotonic() - started
            await asyncio.sleep(step)


async def normal_round(url: str, api: str, clients: int, serial: int) -> list[float]:
    """``clients`` concurrent streams; each one's time to a complete, well-formed answer."""

    async def one(n: int) -> float:
        answer = await post(url, api, body(api, serial + n), deadline=30)
        assert answer.status == 200 and check_stream(api, answer.body).outcome == "complete"
        return answer.seconds

    return list(await asyncio.gather(*(one(n) for n in range(clients))))


def in_flight(app: web.Application) -> float:
    return float(app[METRICS].in_flight)


# --- a slow reader ------------------------------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
async def test_a_client_reading_one_byte_a_second_does_not_slow_the_others(llama_proxy: Proxy, api: str) -> None:
    engine = llama_proxy.engine
    baseline: list[float] = []
    for round_ in range(3):
        baseline += await normal_round(llama_proxy.url, api, 10, round_ * 100)

    written: dict[str, int] = {}
    engine.then(big_stream(written)).then(big_stream(written))
    slow = [SlowReader(llama_proxy.url, api), SlowReader(llama_proxy.url, api)]
    try:
        for reader in slow:
            await reader.start()
        # The engine's writes for the slow readers stall: toolpair stopped reading them.
        await until(lambda: not engine.script and written.get("bytes", 0) > 0)
        previous = -1
        for _ in range(40):
            if written["bytes"] == previous:
                break
            previous = written["bytes"]
            await asyncio.sleep(0.5)
        stalled_at = written["bytes"]
        assert stalled_at == previous, "the engine never stopped writing for readers that do not read"

        slowed: list[float] = []
        for round_ in range(3):
            slowed += await normal_round(llama_proxy.url, api, 10, 1000 + round_ * 100)
        await asyncio.sleep(1.1)  # the slow readers took another byte each
        assert written["bytes"] == stalled_at, "the engine went on writing for a client that does not read"
        # Each slow reader is still getting its answer, a byte a second.
        assert all(reader.received and b"HTTP/1.1 200".startswith(reader.received) for reader in slow)
    finally:
        for reader in slow:
            await reader.close()

    total = 2 * 40_000 * len(chunk({"content": "x" * 1000}))
    base, loaded = statistics.median(baseline), statistics.median(slowed)
    assert stalled_at < total / 2
    assert loaded <= 3 * base + 0.25, f"median {loaded:.3f}s with slow readers, {base:.3f}s without"
    record(
        "slow_reader",
        **{
            f"{api}_median_ms_without": round(base * 1000, 1),
            f"{api}_median_ms_with_two_slow_readers": round(loaded * 1000, 1),
            f"{api}_engine_bytes_before_stall": stalled_at,
        },
    )


# --- clients that leave -------------------------------------------------------------------------


async def silent(request: web.Request, received: Received) -> web.StreamResponse:
    await asyncio.sleep(3600)  # an engine still reading a long prompt
    raise AssertionError("unreachable")  # pragma: no cover


async def trickle(request: web.Request, received: Received) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(chunk({"role": "assistant", "content": ""}))
    for n in range(3600):
        await response.write(chunk({"content": f"t{n} "}))
        await asyncio.sleep(0.02)
    raise AssertionError("unreachable")  # pragma: no cover


def _handler_tasks() -> set[asyncio.Task[Any]]:
    current = asyncio.current_task()
    return {task for task in asyncio.all_tasks() if task is not current and not task.done()}


@pytest.mark.parametrize("when", ["before_the_engine_answers", "mid_stream"])
@pytest.mark.parametrize("api", APIS)
async def test_a_client_that_leaves_cancels_its_engine_request_at_once(llama_proxy: Proxy, api: str, when: str) -> None:
    engine = llama_proxy.engine
    idle = _handler_tasks()
    engine.then(silent if when == "before_the_engine_answers" else trickle)
    async with aiohttp.ClientSession() as session:

        async def request() -> None:
            async with session.post(llama_proxy.url + PATHS[api], data=encoded(api), headers=HEADERS) as response:
                assert (await response.content.readany()) != b""  # the stream has begun
                await asyncio.sleep(3600)

        client = asyncio.create_task(request())
        await until(lambda: len(engine.received) == 1)
        if when == "mid_stream":
            await until(lambda: engine.received[0] not in engine.cancelled and client.done() is False)
            await asyncio.sleep(0.1)  # a few chunks have gone out
        left = time.monotonic()
        client.cancel()  # the client goes away: its connection is closed
        with pytest.raises(asyncio.CancelledError):
            await client
    await until(lambda: engine.received[0] in engine.cancelled, within=5, step=0.001)
    cancelled_in = time.monotonic() - left
    # Nothing left running: no request in flight, no task beyond those before.
    await until(lambda: in_flight(llama_proxy.app) == 0 and len(_handler_tasks() - idle) == 0, within=5)
    assert len(engine.received) == 1  # and nothing was retried or probed afterwards
    await asyncio.sleep(0.2)
    assert len(engine.received) == 1
    count("vanishing_clients", "cases")
    record("vanishing_clients", **{f"{api}_{when}_cancel_ms": round(cancelled_in * 1000, 1)})
    # toolpair serves the next request as usual.
    answer = await post(llama_proxy.url, api, body(api, 1))
    assert check_stream(api, answer.body).outcome == "complete"


# --- a client that leaves the engine queue ------------------------------------------------------


@asynccontextmanager
async def queued_proxy(make_proxy: MakeProxy) -> AsyncIterator[tuple[str, EngineQueue, web.Application]]:
    """toolpair with the managed engine's admission: one request at a time, two more may wait."""

    async def ready() -> None:
        return None

    queue = EngineQueue(ready, max_concurrency=1, max_queue=2, ready_timeout=5)
    settings = {"engine_kind": "llama-cpp-python", "upstream_read_timeout": 10}
    async with make_proxy.running(**settings, admission=queue) as (url, app):
        yield url, queue, app


@pytest.mark.parametrize("api", APIS)
async def test_a_client_that_leaves_the_queue_frees_its_place(
    engine: MockEngine, make_proxy: MakeProxy, api: str
) -> None:
    engine.tokenizer = True
    async with queued_proxy(make_proxy) as (url, queue, app), aiohttp.ClientSession() as session:
        engine.then(trickle)
        running = await session.post(url + PATHS[api], data=encoded(api), headers=HEADERS)
        await running.content.readany()  # holds the engine's only slot
        waiting = asyncio.create_task(post(url, api, body(api, 2)))
        await until(lambda: queue.waiting == 1)
        waiting.cancel()  # the client leaves while it waits
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await until(lambda: queue.waiting == 0)
        assert len(engine.received) == 1  # the engine never saw it
        # Its place is free: two more fit in the queue (max_queue 2), a third is refused.
        queued = [asyncio.create_task(post(url, api, body(api, 3 + n))) for n in range(2)]
        await until(lambda: queue.waiting == 2)
        refused = await post(url, api, body(api, 9))
        assert refused.status == 429 and refused.toolpairs
        running.close()  # the running stream's client leaves: its slot goes to the next in line
        answers = await asyncio.gather(*queued)
        assert [check_stream(api, a.body).outcome for a in answers] == ["complete", "complete"]
        assert queue.active == 0 and queue.waiting == 0
        await until(lambda: in_flight(app) == 0)
    generations = [r for r in engine.received if r.path == "/v1/chat/completions" and r.json().get("stream")]
    assert len(generations) == 3  # the running one and the two queued; never the one that left
    count("vanishing_clients", "cases")
