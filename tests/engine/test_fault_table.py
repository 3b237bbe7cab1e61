"""Every engine fault x every API x stream and non-stream: the client sees an error in its own API's form.

Never a success: a non-stream answer is a 4xx/5xx in the dialect's error shape; a stream is either
that, or ends with the dialect's error event (a Chat ``data:`` error object, Anthropic
``event: error``, Responses ``response.failed``). A failed Responses answer is never stored:
continuing from its id afterwards is a 404. The mock engine plays each fault, since a real engine
cannot be made to; the last test is the one fault the real engine shows on its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import orjson
import pytest
from aiohttp import web

from tests.mock_engine import MockEngine, Received, chunk, write_stream
from tests.real_engine import bundled_model, start_real_engine
from tests.reliability.client import post, send
from tests.reliability.streams import check_error_body, check_stream, frames_of
from tests.support.proxies import MakeProxy

Fault = Callable[[web.Request, Received], Awaitable[web.StreamResponse]]


def _json(raw: bytes, status: int = 200) -> web.Response:
    return web.Response(status=status, body=raw, content_type="application/json")


def fault(stream: Callable[[web.Request], Awaitable[web.StreamResponse]], plain: Callable[[], web.Response]) -> Fault:
    """An engine that answers a streamed request with ``stream`` and any other with ``plain``."""

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        return await stream(request) if received.json().get("stream") else plain()

    return handler


_HALF = b'{"id":"x","object":"chat.completion","choi'
_CONTEXT = (
    b'{"error": {"message": "Requested tokens (900) exceed context window of 512", "type": "invalid_request_error"}}'
)
_HTML = b"<html><body><h1>500 Internal Server Error</h1></body></html>"

FAULTS: dict[str, Fault] = {
    "empty stream": fault(lambda r: write_stream(r), lambda: _json(b"")),
    "no finish, no [DONE]": fault(lambda r: write_stream(r, chunk({"content": "partial"})), lambda: _json(_HALF)),
    "cut inside an event": fault(
        lambda r: write_stream(r, chunk({"content": "partial"}), b"data: " + _HALF), lambda: _json(_HALF)
    ),
    "event not JSON": fault(
        lambda r: write_stream(r, b"data: hello there\n\ndata: [DONE]\n\n"), lambda: _json(b"hello there")
    ),
    "HTML 500": fault(
        lambda r: web.Response(status=500, body=_HTML, content_type="text/html"),  # type: ignore[arg-type,return-value]
        lambda: web.Response(status=500, body=_HTML, content_type="text/html"),
    ),
    "context-window 400": fault(lambda r: write_stream(r), lambda: _json(_CONTEXT, 400)),
    "not a completion": fault(
        lambda r: write_stream(r, b'data: {"object": "list", "data": []}\n\ndata: [DONE]\n\n'),
        lambda: _json(b'{"object": "list", "data": []}'),
    ),
}


async def _context_stream(request: web.Request, received: Received) -> web.StreamResponse:
    """llama-cpp-python's answer to a streamed prompt over its context: an empty 200 stream."""
    if received.json().get("stream"):
        return await write_stream(request)
    return _json(_CONTEXT, 400)


FAULTS["context-window 400"] = _context_stream

CHAT = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
REQUESTS = {
    "chat": CHAT,
    "chat-decoded": {**CHAT, "stream_options": {"include_usage": True}},
    "anthropic": {"model": "claude", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
    "responses": {"model": "m", "input": "hi", "store": True},
}
# (route, engine kind): the generic chat sidecar relays bytes (the fast path); llama-cpp-python decodes.
ROWS = [("chat", "generic"), ("chat-decoded", "llama-cpp-python"), ("anthropic", "llama-cpp-python"),
        ("responses", "llama-cpp-python")]  # fmt: skip


@pytest.fixture
async def proxies(make_proxy: MakeProxy) -> AsyncIterator[dict[str, str]]:
    yield {
        kind: await make_proxy(engine_kind=kind, connect_timeout=2.0, upstream_read_timeout=3.0)
        for kind in ("generic", "llama-cpp-python")
    }


def _api(route: str) -> str:
    return "chat" if route.startswith("chat") else route


def _response_ids(raw: bytes) -> set[str]:
    ids = set()
    for _, data in frames_of(raw):
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        if isinstance(event, dict) and isinstance(event.get("response"), dict):
            ids.add(event["response"]["id"])
    return ids


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("name", list(FAULTS))
@pytest.mark.parametrize(("route", "kind"), ROWS)
async def test_every_engine_fault_is_an_error_in_the_clients_own_form(
    engine: MockEngine, proxies: dict[str, str], route: str, kind: str, name: str, stream: bool
) -> None:
    api = _api(route)
    engine.then(FAULTS[name]).then(FAULTS[name]).then(FAULTS[name])  # the answer, and a diagnosis replay or two
    answer = await post(proxies[kind], api, {**REQUESTS[route], "stream": stream}, deadline=15)
    if answer.status >= 400:
        error = check_error_body(api, answer.body)
        if name == "context-window 400":
            assert answer.status == 400, answer.body
            if api == "anthropic":
                assert error["type"] == "invalid_request_error" and "prompt is too long" in error["message"]
        ids: set[str] = set()
    else:
        assert stream, f"a non-stream answer to '{name}' was a {answer.status}: {answer.body[:300]!r}"
        outcome = check_stream(api, answer.body)
        assert outcome.outcome == "error", answer.body[-500:]
        ids = _response_ids(answer.body) if api == "responses" else set()
    if api == "responses":
        for response_id in ids:
            for path in (f"/v1/responses/{response_id}",):
                assert (await send(proxies[kind] + path, "GET")).status == 404
            follow = {"model": "m", "input": "and then?", "previous_response_id": response_id}
            again = await post(proxies[kind], "responses", follow)
            assert again.status in (400, 404), again.body


def _has_real_engine() -> bool:
    try:
        bundled_model()
        import llama_cpp  # noqa: F401
    except Exception:  # pragma: no cover - the engine is part of `make test`
        return False
    return True


@pytest.mark.skipif(not _has_real_engine(), reason="needs llama-cpp-python and the bundled model")
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_a_prompt_longer_than_the_real_engines_context_is_a_400_on_every_api(
    tmp_path: Path, make_proxy_to: MakeProxy, stream: bool
) -> None:
    """llama-cpp-python answers a streamed prompt over n_ctx with an empty 200 stream; every API says why."""
    real = start_real_engine(tmp_path, n_ctx=256)
    url = await make_proxy_to(upstream=real.url, engine_kind="llama-cpp-python", upstream_api_key=real.api_key)
    long = "Tell me about the sea. " * 200
    requests = {
        "chat": {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": long}]},
        "anthropic": {"model": "claude", "max_tokens": 8, "messages": [{"role": "user", "content": long}]},
        "responses": {"model": "m", "input": long, "max_output_tokens": 16},
    }
    try:
        for api, request in requests.items():
            answer = await post(url, api, {**request, "stream": stream}, deadline=120)
            assert answer.status == 400, (api, answer.body[:300])
            error = check_error_body(api, answer.body)
            if api == "anthropic":
                assert error["message"].startswith("prompt is too long"), error
    finally:
        real.stop()
