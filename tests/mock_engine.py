"""An OpenAI-compatible engine for tests: a real aiohttp server that records what it receives.

It keeps the exact bytes of every request, notices when a client goes away
mid-request (``cancelled``), and answers from a script: push a handler with
:meth:`MockEngine.then` to control the next reply, or rely on the defaults (a
short completion, streamed when asked). Run ``python -m tests.mock_engine
--port P`` to use it as a separate process (the benchmark does).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

Handler = Callable[[web.Request, "Received"], Awaitable[web.StreamResponse]]


@dataclass
class Received:
    """One request as the engine saw it."""

    method: str
    path: str
    query_string: str
    headers: dict[str, str]
    body: bytes
    at: float = field(default_factory=time.monotonic)
    peer: tuple[str, int] | None = None
    """The client's address: a new port means a new connection."""

    def json(self) -> Any:
        return orjson.loads(self.body)


def completion(content: str = "ok", model: str = "mock", **extra: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    message.update(extra)
    return {
        "id": "chatcmpl-mock",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }


def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {
        "id": "chatcmpl-mock",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "mock",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
    }
    return b"data: " + orjson.dumps(body) + b"\n\n"


async def stream_words(request: web.Request, words: list[str], delay: float = 0.0) -> web.StreamResponse:
    """Answer as an OpenAI chat stream, one chunk per word."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(chunk({"role": "assistant", "content": ""}))
    for word in words:
        if delay:
            await asyncio.sleep(delay)
        await response.write(chunk({"content": word}))
    await response.write(chunk({}, "stop"))
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def answers(text: str, piece: int = 7, finish: str = "stop", usage: Any = None) -> Handler:
    """Answer a stream or a plain request with ``text`` as the model wrote it, as llama-cpp-python does
    (which leaves tool calls and reasoning in the text), streamed ``piece`` characters a chunk."""

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        if not received.json().get("stream"):
            reply = completion(text)
            reply["choices"][0]["finish_reason"] = finish
            return web.json_response(reply, dumps=lambda v: orjson.dumps(v).decode())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(chunk({"role": "assistant"}))
        for i in range(0, len(text), piece):
            await response.write(chunk({"content": text[i : i + piece]}))
        await response.write(chunk({}, finish))
        if usage is not None:
            await response.write(b"data: " + orjson.dumps({"id": "u", "choices": [], "usage": usage}) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    return handler


async def write_stream(request: web.Request, *pieces: bytes) -> web.StreamResponse:
    """An event stream of ``pieces``, written one by one as they are, then a clean end."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for piece in pieces:
        await response.write(piece)
    await response.write_eof()
    return response


def streams(*pieces: bytes) -> Handler:
    """Answer the next request with :func:`write_stream` of ``pieces``."""

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        return await write_stream(request, *pieces)

    return handler


def breaks_off(sent: bytes) -> Handler:
    """Start a stream, send ``sent`` (usually ending mid-line), then drop the connection: an engine that dies."""

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(sent)
        assert request.transport is not None
        request.transport.close()
        return response

    return handler


def never_answers(arrived: asyncio.Event | None = None, seconds: float = 30) -> Handler:
    """Take the request and say nothing for ``seconds`` (longer than any test waits); set ``arrived`` first."""

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        if arrived is not None:
            arrived.set()
        await asyncio.sleep(seconds)
        raise AssertionError("not reached")

    return handler


class MockEngine:
    """Records requests; answers from a script of handlers, then from defaults."""

    def __init__(
        self, stream_words: int = 3, stream_delay: float = 0.0, tokenizer: bool = False, echo_count: bool = False
    ) -> None:
        self.received: list[Received] = []
        self.cancelled: list[Received] = []
        self._cancel_seen = asyncio.Event()
        self.script: deque[Handler] = deque()
        self.stream_word_count = stream_words
        self.stream_delay = stream_delay
        self.tokenizer = tokenizer
        """Answer llama-cpp-python's ``/extras/tokenize/count`` (one token per word, plus a BOS)."""
        self.echo_count = echo_count
        """Chat replies start with ``seen=N``, N the messages received: shows whether history arrived."""
        self.models = ["mock"]
        """What ``/v1/models`` lists."""
        self.app = web.Application(client_max_size=1 << 30)
        self.app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner: web.AppRunner | None = None
        self.url = ""

    def then(self, handler: Handler) -> MockEngine:
        """Use ``handler`` for the next request that arrives."""
        self.script.append(handler)
        return self

    def reply_json(self, payload: Any, status: int = 200) -> MockEngine:
        async def handler(request: web.Request, received: Received) -> web.StreamResponse:
            return web.json_response(payload, status=status, dumps=lambda v: orjson.dumps(v).decode())

        return self.then(handler)

    async def wait_cancelled(self) -> None:
        """Return once a request has been cancelled, or after 4 s (the caller asserts what it expects)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._cancel_seen.wait(), 4.0)

    @property
    def last(self) -> Received:
        return self.received[-1]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        received = Received(
            request.method,
            request.path,
            request.query_string,
            dict(request.headers),
            await request.read(),
            peer=tuple(peer[:2]) if peer else None,
        )
        self.received.append(received)
        try:
            if self.script:
                return await self.script.popleft()(request, received)
            return await self._default(request, received)
        except (asyncio.CancelledError, ConnectionResetError):
            self.cancelled.append(received)
            self._cancel_seen.set()
            raise

    async def _default(self, request: web.Request, received: Received) -> web.StreamResponse:
        if request.path.endswith("/chat/completions"):
            body = received.json()
            seen = [f"seen={len(body.get('messages', []))} "] if self.echo_count else []
            if body.get("stream"):
                words = [*seen, *(f"w{i} " for i in range(self.stream_word_count))]
                return await stream_words(request, words, self.stream_delay)
            reply = completion("".join(seen) + "ok")
            return web.json_response(reply, dumps=lambda v: orjson.dumps(v).decode())
        if self.tokenizer and request.path == "/extras/tokenize/count":
            return web.json_response({"count": len(str(received.json().get("input", "")).split()) + 1})
        if request.path.endswith("/models"):
            listed = [{"id": model, "object": "model"} for model in self.models]
            return web.json_response({"object": "list", "data": listed})
        return web.json_response(
            {"method": request.method, "path": request.path, "query": request.query_string, "echo": len(received.body)}
        )

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        self._runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        sockets = site._server.sockets if site._server else []  # type: ignore[union-attr]
        self.url = f"http://{host}:{sockets[0].getsockname()[1]}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


async def _serve(port: int, words: int, delay: float, tokenizer: bool, echo_count: bool) -> None:
    engine = MockEngine(stream_words=words, stream_delay=delay, tokenizer=tokenizer, echo_count=echo_count)
    print(await engine.start(port=port), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="mock OpenAI-compatible engine")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--words", type=int, default=3, help="chunks per streamed reply")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds between streamed chunks")
    parser.add_argument("--tokenizer", action="store_true", help="answer /extras/tokenize/count")
    parser.add_argument("--echo-count", action="store_true", help="start chat replies with seen=N (messages received)")
    args = parser.parse_args()
    asyncio.run(_serve(args.port, args.words, args.delay, args.tokenizer, args.echo_count))
