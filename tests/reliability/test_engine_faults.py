"""Engine faults, for each API: every one ends the client's answer cleanly, and the next request is served.

The mock engine misbehaves on cue: it closes the connection mid-stream, ends its
body inside an event (a cut SSE frame), sends an event whose data is not JSON,
answers 5xx, or goes silent past ``upstream_read_timeout`` (before its head, or
mid-stream). Once a stream has begun, the client must get one in-band error in its
own dialect (a Chat ``data:`` error object, Anthropic ``event: error``, Responses
``response.failed``) and then the end of the body, never half a frame; before
that, a plain HTTP error in its dialect. Either way within a deadline, and then
toolpair serves a normal request.

toolpair runs as ``toolpair serve`` runs it (engine kind ``llama-cpp-python``:
every stream is decoded); Chat also runs as a ``generic`` sidecar, whose
streams are relayed frame by frame undecoded, so an event with bad JSON reaches
the client as the engine wrote it there (the engine's bytes are not toolpair's to
judge) and is left out of that row. SIGKILL of the real engine is at the end.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tests.mock_engine import MockEngine, Received, chunk
from tests.real_engine import bundled_model, start_real_engine
from tests.reliability.client import HEADERS, post
from tests.reliability.figures import count
from tests.reliability.streams import check_error_body, check_stream
from tests.reliability.workload import APIS, PATHS, body
from tests.support.proxies import MakeProxy

Fault = Callable[[web.Request, Received], Awaitable[web.StreamResponse]]

READ_TIMEOUT = 1.0


async def _begin(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(chunk({"role": "assistant", "content": ""}))
    await response.write(chunk({"content": "partial "}))
    return response


async def closed_mid_stream(request: web.Request, received: Received) -> web.StreamResponse:
    response = await _begin(request)
    await asyncio.sleep(0.05)
    assert request.transport is not None
    request.transport.close()  # no chunked terminator: the body is cut
    return response


async def cut_frame(request: web.Request, received: Received) -> web.StreamResponse:
    response = await _begin(request)
    await response.write(b'data: {"id":"chatcmpl-mock","object":"chat.completion.chunk","choi')
    await response.write_eof()  # a clean end of body, inside an event
    return response


async def invalid_json(request: web.Request, received: Received) -> web.StreamResponse:
    response = await _begin(request)
    await response.write(b'data: {"choices": [{"index": 0, "delta": {"content": "x"\n\n')
    await asyncio.sleep(0.05)
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def status_500(request: web.Request, received: Received) -> web.StreamResponse:
    return web.json_response({"error": {"message": "engine exploded", "type": "server_error"}}, status=500)


async def status_503_html(request: web.Request, received: Received) -> web.StreamResponse:
    return web.Response(status=503, text="<html><body>Service Unavailable</body></html>", content_type="text/html")


async def hang_before_head(request: web.Request, received: Received) -> web.StreamResponse:
    await asyncio.sleep(3600)
    raise AssertionError("unreachable")  # pragma: no cover


async def hang_mid_stream(request: web.Request, received: Received) -> web.StreamResponse:
    await _begin(request)
    await asyncio.sleep(3600)
    raise AssertionError("unreachable")  # pragma: no cover


IN_BAND = {"closed_mid_stream": closed_mid_stream, "cut_frame": cut_frame, "invalid_json": invalid_json}
IN_BAND_TIMEOUT = {"hang_mid_stream": hang_mid_stream}
BEFORE_STREAM = {"status_500": status_500, "status_503_html": status_503_html, "hang_before_head": hang_before_head}
FAULTS = {**IN_BAND, **IN_BAND_TIMEOUT, **BEFORE_STREAM}

# (api, engine kind) pairs, and the faults that do not apply to one.
ROWS = [(api, "llama-cpp-python") for api in APIS] + [("chat", "generic")]
NOT_APPLICABLE = {
    ("chat", "generic", "invalid_json"): "the generic Chat relay checks events by their first bytes, not by parsing",
}


async def _next_request_is_served(url: str, api: str) -> None:
    answer = await post(url, api, body(api, 1))
    assert answer.status == 200, answer.body[:300]
    assert check_stream(api, answer.body).outcome == "complete"


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize(("api", "kind"), ROWS)
async def test_engine_fault_ends_cleanly_then_toolpair_serves_the_next_request(
    engine: MockEngine, make_proxy: MakeProxy, api: str, kind: str, fault: str
) -> None:
    if (api, kind, fault) in NOT_APPLICABLE:
        pytest.skip(NOT_APPLICABLE[api, kind, fault])
    engine.tokenizer = True
    async with make_proxy.running(engine_kind=kind, upstream_read_timeout=READ_TIMEOUT) as proxy:
        url = proxy.url
        engine.then(FAULTS[fault])
        answer = await post(url, api, body(api), deadline=15)
        if fault in BEFORE_STREAM:
            # Nothing was sent yet: an HTTP error in the client's dialect.
            expected = {"status_500": 500, "status_503_html": 503, "hang_before_head": 504}[fault]
            assert answer.status == expected, answer.body[:300]
            error = check_error_body(api, answer.body)
            if fault == "status_500":
                assert "engine exploded" in error["message"]
        else:
            assert answer.status == 200
            stream = check_stream(api, answer.body)
            assert stream.outcome == "error", answer.body[-500:]
            assert stream.error is not None and stream.error.get("source") == "toolpair", stream.error
        assert answer.seconds < READ_TIMEOUT + 5
        if fault.startswith("hang"):
            # toolpair gave up on the engine's request: the engine saw it go.
            generation = engine.received[0]
            for _ in range(50):
                if generation in engine.cancelled:
                    break
                await asyncio.sleep(0.05)
            assert generation in engine.cancelled
        await _next_request_is_served(url, api)
    count("engine_faults", f"survived_{fault}")
    count("engine_faults", "cases_survived")


# --- the real engine, killed ------------------------------------------------------------------


def _has_real_engine() -> bool:
    try:
        bundled_model()
    except Exception:  # pragma: no cover - the engine extra is part of `make test`
        return False
    return True


COUNTING = ", ".join(str(n) for n in range(1, 201)) + ","
"""A sequence the bundled model continues, greedily, up to any ``max_tokens`` (400 measured in all three APIs).

Asked to count, it answers in 6 to 50 tokens, which a fast CPU generates in the milliseconds between the
first streamed chunk and the test's SIGKILL: the stream then ends whole and the kill proves nothing."""


def _streamed(api: str, tokens: int) -> dict[str, object]:
    """A streamed prompt (about 900 tokens, read in a second or two) generating exactly ``tokens`` tokens."""
    if api == "responses":
        return {
            "model": "m", "input": COUNTING, "max_output_tokens": tokens, "temperature": 0, "stream": True,
            "store": False,
        }  # fmt: skip
    messages = [{"role": "user", "content": COUNTING}]
    return {"model": "m", "messages": messages, "max_tokens": tokens, "temperature": 0, "stream": True}


@pytest.mark.skipif(not _has_real_engine(), reason="needs llama-cpp-python and the bundled model")
async def test_sigkill_of_the_real_engine_mid_stream_is_a_clean_error_for_each_api(
    tmp_path: Path, make_proxy_to: MakeProxy
) -> None:
    """The engine dies while it streams: an in-band error, then 502s, then service again once it is back."""
    real = start_real_engine(tmp_path)
    port = int(real.url.rsplit(":", 1)[1])
    url = await make_proxy_to(
        upstream=real.url,
        engine_kind="llama-cpp-python",
        upstream_api_key=real.api_key,
        connect_timeout=2.0,
        upstream_read_timeout=30.0,
    )
    try:
        for api in APIS:
            async with (
                asyncio.timeout(60),
                aiohttp.ClientSession() as session,
                session.post(url + PATHS[api], json=_streamed(api, 400), headers=HEADERS) as response,
            ):
                assert response.status == 200
                head = await response.content.readany()  # the engine is streaming now
                os.killpg(real.process.pid, signal.SIGKILL)
                real.process.wait()
                raw = head + await response.read()  # ends cleanly: no payload error
            stream = check_stream(api, raw)
            assert stream.outcome == "error", raw[-500:]
            # While the engine is down: a clean 502 in the dialect, fast.
            down = await post(url, api, _streamed(api, 2), deadline=10)
            assert down.status == 502 and down.toolpairs, down.body[:300]
            check_error_body(api, down.body)
            # Back on the same port: toolpair serves again, with no restart of its own.
            real = start_real_engine(tmp_path, port=port)
            answer = await post(url, api, _streamed(api, 2), deadline=60)
            assert answer.status == 200, answer.body[:300]
            assert check_stream(api, answer.body).outcome == "complete"
            count("engine_faults", "survived_sigkill_real_engine")
            count("engine_faults", "cases_survived")
    finally:
        real.stop()
