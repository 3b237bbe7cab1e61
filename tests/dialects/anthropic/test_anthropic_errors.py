"""Every error path of /v1/messages: Anthropic's error shape, the right status, never a hang."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anthropic
import orjson
import pytest
from aiohttp import web

from engine_launcher.supervise.launch import free_port
from proxy.config import ConfigError, Settings
from proxy.errors import EngineUnavailableError
from proxy.sse import EventDecoder
from tests.mock_engine import MockEngine, Received, breaks_off, chunk, never_answers, streams
from tests.support.http import send_and_read
from tests.support.proxies import MakeProxy, proxy_app

HI = [{"role": "user", "content": "Hi"}]
OVERFLOW = (
    "This model's maximum context length is 512 tokens. However, you requested 829 tokens "
    "(824 in the messages, 5 in the completion). Please reduce the length of the messages or completion."
)


@pytest.fixture
async def url(make_proxy: MakeProxy) -> str:
    return await make_proxy(max_body_bytes=100_000)


async def post(url: str, body: Any, path: str = "/v1/messages") -> tuple[int, Any, Any]:
    return await send_and_read(url, body, path)


def request(stream: bool = False, **extra: Any) -> dict[str, Any]:
    return {"model": "c", "max_tokens": 5, "messages": HI, "stream": stream, **extra}


def assert_anthropic_error(reply: Any, kind: str, text: str) -> None:
    assert reply["type"] == "error" and set(reply) == {"type", "error"}
    assert reply["error"]["type"] == kind
    assert text in reply["error"]["message"]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1]", "must be a JSON object"),
        (b'{"model": "c"}', "messages must be a list"),
        (b'{"messages": [{"role": "tool", "content": "x"}]}', "role must be user, assistant or system"),
        (b'{"messages": [{"role": "user", "content": 5}]}', "content must be a string or a list"),
        (b'{"messages": [], "max_tokens": "many"}', "max_tokens must be a number"),
        (b'{"messages": [], "tools": [{"description": "x"}]}', "a tool needs a name"),
        (b'{"messages": [], "tool_choice": {"type": "maybe"}}', "tool_choice type"),
        (b'{"messages": [], "stop_sequences": [1]}', "stop_sequences must be a list of strings"),
        (b'{"messages": [], "thinking": "on"}', "thinking must be an object"),
    ],
)
async def test_bad_requests_are_anthropic_400s_and_reach_no_engine(
    url: str, engine: MockEngine, raw: bytes, message: str
) -> None:
    status, reply, headers = await post(url, raw)
    assert status == 400
    assert_anthropic_error(reply, "invalid_request_error", message)
    assert reply["error"]["source"] == "toolpair" and headers["X-Toolpair-Error"] == "invalid_request"
    assert engine.received == []


async def test_body_over_the_limit_is_a_413_request_too_large(url: str, engine: MockEngine) -> None:
    status, reply, _ = await post(url, request(padding="x" * 200_000))
    assert status == 413
    assert_anthropic_error(reply, "request_too_large", "over the 100000-byte limit")
    assert engine.received == []


@pytest.mark.parametrize("stream", [False, True])
async def test_prompt_too_long_becomes_anthropics_message(url: str, engine: MockEngine, stream: bool) -> None:
    engine.reply_json({"error": {"message": OVERFLOW, "type": "invalid_request_error"}}, status=400)
    status, reply, _ = await post(url, request(stream))
    assert status == 400
    assert_anthropic_error(reply, "invalid_request_error", "")
    assert reply["error"]["message"] == "prompt is too long: 824 tokens > 512 maximum"
    assert len(engine.received) == 1  # an error status needs no second request to explain it


async def test_prompt_and_max_tokens_over_the_context_get_anthropics_other_message(
    url: str, engine: MockEngine
) -> None:
    engine.reply_json({"error": {"message": OVERFLOW.replace("824 in", "500 in")}}, status=400)
    status, reply, _ = await post(url, request())
    assert status == 400
    assert reply["error"]["message"] == (
        "input length and `max_tokens` exceed context limit: 500 + 5 > 512, "
        "decrease input length or `max_tokens` and try again"
    )


async def test_an_engine_stream_that_ends_before_it_begins_is_diagnosed(url: str, engine: MockEngine) -> None:
    """llama-cpp-python answers a too-long streamed prompt with an empty 200 stream."""

    async def empty_stream(request: web.Request, received: Received) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write_eof()
        return response

    engine.then(empty_stream).reply_json({"error": {"message": OVERFLOW}}, status=400)
    async with anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0) as sdk:
        with pytest.raises(anthropic.BadRequestError, match="prompt is too long: 824 tokens > 512 maximum"):
            async with sdk.messages.stream(model="c", max_tokens=5, messages=HI) as stream:
                await stream.get_final_message()
    probe = engine.received[1].json()
    assert probe["stream"] is False and probe["max_tokens"] == 1
    assert probe["messages"] == engine.received[0].json()["messages"]


async def test_an_empty_stream_from_an_engine_that_then_answers_is_a_502(url: str, engine: MockEngine) -> None:
    engine.then(streams(b"data: [DONE]\n\n"))
    status, reply, _ = await post(url, request(stream=True))
    assert status == 502
    assert_anthropic_error(reply, "api_error", "ended the stream without answering")


@pytest.mark.parametrize(
    ("status", "kind", "sdk_error"),
    [
        (400, "invalid_request_error", anthropic.BadRequestError),
        (401, "authentication_error", anthropic.AuthenticationError),
        (403, "permission_error", anthropic.PermissionDeniedError),
        (404, "not_found_error", anthropic.NotFoundError),
        (429, "rate_limit_error", anthropic.RateLimitError),
        (500, "api_error", anthropic.InternalServerError),
        (503, "overloaded_error", anthropic.InternalServerError),
    ],
)
async def test_engine_error_statuses_keep_their_status_in_anthropic_shape(
    url: str, engine: MockEngine, status: int, kind: str, sdk_error: type[Exception]
) -> None:
    for stream in (False, True):
        engine.reply_json({"error": {"message": f"engine says {status}"}}, status=status)
        code, reply, _ = await post(url, request(stream))
        assert code == status
        assert_anthropic_error(reply, kind, f"engine says {status}")
    engine.reply_json({"detail": "plain detail"}, status=status)
    async with anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0) as sdk:
        with pytest.raises(sdk_error, match="plain detail"):
            await sdk.messages.create(model="c", max_tokens=5, messages=HI)


@pytest.mark.parametrize("stream", [False, True])
async def test_engine_down_is_a_502_api_error(stream: bool, make_proxy_to: MakeProxy) -> None:
    upstream = f"http://127.0.0.1:{free_port()}"
    async with make_proxy_to.running(upstream=upstream, connect_timeout=1.0) as (url, _):
        status, reply, _ = await post(url, request(stream))
        count_status, count, headers = await post(url, request(), path="/v1/messages/count_tokens")
    assert status == 502
    assert_anthropic_error(reply, "api_error", upstream)
    assert count_status == 200 and headers["X-Toolpair-Token-Count"] == "estimate" and count["input_tokens"] > 0


async def test_engine_silent_past_the_read_timeout_is_a_504(engine: MockEngine, make_proxy: MakeProxy) -> None:
    engine.then(never_answers(seconds=10))
    async with make_proxy.running(upstream_read_timeout=0.3) as (url, _):
        status, reply, _ = await post(url, request())
    assert status == 504
    assert_anthropic_error(reply, "api_error", "did not answer in time")


async def test_an_engine_that_is_not_ready_is_overloaded(engine: MockEngine, make_proxy: MakeProxy) -> None:
    @asynccontextmanager
    async def refuse(request: web.Request, conversation: str | None) -> AsyncIterator[None]:
        raise EngineUnavailableError("the engine is starting")
        yield  # pragma: no cover

    async with make_proxy.running(admission=refuse) as (url, _):
        for stream in (False, True):
            status, reply, _ = await post(url, request(stream))
            assert status == 503
            assert_anthropic_error(reply, "overloaded_error", "the engine is starting")
        count_status, _, headers = await post(url, request(), path="/v1/messages/count_tokens")
        assert count_status == 200 and headers["X-Toolpair-Token-Count"] == "estimate"
    assert engine.received == []


async def test_failure_mid_stream_ends_with_an_error_event_and_no_done(url: str, engine: MockEngine) -> None:
    engine.then(breaks_off(chunk({"role": "assistant", "content": "partial"}) + b'data: {"half": '))
    status, raw, _ = await post(url, request(stream=True))
    assert status == 200
    events = [(e.event, orjson.loads(e.data)) for e in EventDecoder().feed(raw)]
    names = [name for name, _ in events]
    assert names == ["message_start", "ping", "content_block_start", "content_block_delta", "error"]
    assert events[-1][1]["type"] == "error" and events[-1][1]["error"]["type"] == "api_error"
    assert engine.url in events[-1][1]["error"]["message"]
    assert b"[DONE]" not in raw and b"message_stop" not in raw


async def test_engine_error_event_mid_stream_and_a_stream_without_a_finish(url: str, engine: MockEngine) -> None:
    engine.then(streams(chunk({"content": "x"}) + b'data: {"error": {"message": "out of memory"}}\n\n'))
    engine.then(streams(chunk({"content": "x"}) + b"data: [DONE]\n\n"))
    async with anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0) as sdk:
        for expected in ("out of memory", "before it finished the message"):
            with pytest.raises(anthropic.APIStatusError, match=expected):
                async with sdk.messages.stream(model="c", max_tokens=5, messages=HI) as stream:
                    await stream.get_final_message()


async def test_malformed_engine_answers_are_502s(url: str, engine: MockEngine) -> None:
    async def garbage(request: web.Request, received: Received) -> web.StreamResponse:
        return web.Response(body=b"<html>", content_type="application/json")

    engine.then(garbage)
    status, reply, _ = await post(url, request())
    assert status == 502
    assert_anthropic_error(reply, "api_error", "invalid JSON")
    bad_call = {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}}]}

    engine.then(streams(chunk({"content": "x"}) + b"data: " + orjson.dumps(bad_call) + b"\n\n"))
    status, raw, _ = await post(url, request(stream=True))
    assert status == 200 and raw.endswith(b"\n\n")
    last = list(EventDecoder().feed(raw))[-1]
    assert last.event == "error" and "without a name" in last.data


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"messages_mode": "sometimes"}, "messages_mode: expected one of auto, native, translate"),
        ({"messages_ping_interval": 0.0}, "messages_ping_interval"),
        ({"count_tokens_template": "/nonexistent/template.json"}, "cannot read chat template"),
    ],
)
def test_bad_anthropic_settings_are_config_errors(settings: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        proxy_app(Settings(upstream="http://127.0.0.1:1", **settings))
