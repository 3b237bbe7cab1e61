"""/v1/messages in translate mode through the real HTTP path: client -> toolpair -> mock engine."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from anthropic import AsyncAnthropic

from proxy.sse import EventDecoder
from tests.claude_code_fixture import TOOL_NAMES, claude_code_request
from tests.mock_engine import MockEngine, Received, chunk, completion
from tests.support.http import leave_mid_stream, send_and_read
from tests.support.proxies import MakeProxy

pytestmark = pytest.mark.asyncio

Handler = Callable[[web.Request, Received], Awaitable[web.StreamResponse]]


@pytest.fixture
def proxy(make_proxy: MakeProxy) -> MakeProxy:
    """Start toolpair in front of the mock engine with the given settings; returns its URL."""
    return make_proxy


NO_CACHE = {"cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
"""Anthropic usage always carries the cache counts; 0 where the engine reports none."""


def client(url: str, **options: Any) -> AsyncAnthropic:
    return AsyncAnthropic(base_url=url, api_key="sk-ant-client-secret", max_retries=0, **options)


def streamed(chunks: list[dict[str, Any] | bytes], delay: float = 0.0, head_delay: float = 0.0) -> Handler:
    """An engine handler that streams these chunks (dicts are deltas; bytes go out as they are)."""

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        await asyncio.sleep(head_delay)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for item in chunks:
            await asyncio.sleep(delay)
            await response.write(item if isinstance(item, bytes) else chunk(item.get("delta", {}), item.get("finish")))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    return handler


def tool_calls_completion(*ids: str) -> dict[str, Any]:
    calls = [
        {"id": i, "type": "function", "function": {"name": "get_weather", "arguments": f'{{"city": "{i}"}}'}}
        for i in ids
    ]
    reply = completion("", tool_calls=calls)
    reply["choices"][0]["finish_reason"] = "tool_calls"
    return reply


WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


async def post(url: str, body: Any, path: str = "/v1/messages", **kw: Any) -> tuple[int, Any, Any]:
    return await send_and_read(url, body, path, **kw)


def sse_events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    return [(e.event, orjson.loads(e.data)) for e in EventDecoder().feed(raw)]


HI = [{"role": "user", "content": "Hi"}]


# --- the anthropic SDK


async def test_sdk_non_stream_with_x_api_key_and_bearer(engine: MockEngine, proxy: Any) -> None:
    url = await proxy()
    bearer = AsyncAnthropic(base_url=url, auth_token="bearer-secret", max_retries=0)
    sdks = ((client(url), "sk-ant-client-secret"), (bearer, "bearer-secret"))
    for sdk, key in sdks:
        async with sdk:
            message = await sdk.messages.create(
                model="claude-test-model",
                max_tokens=64,
                system="Be brief.",
                messages=HI,
                extra_body={"temperature": 0.1},
                extra_headers={"anthropic-beta": "interleaved-thinking-2025-05-14", "anthropic-version": "2099-01-01"},
            )
        assert message.model == "claude-test-model" and message.id.startswith("msg_")
        assert message.content[0].type == "text" and message.content[0].text == "ok"
        assert message.stop_reason == "end_turn"
        assert message.usage.input_tokens == 5 and message.usage.output_tokens == 1
        seen = engine.last
        assert seen.path == "/v1/chat/completions"
        assert seen.json() == {
            "model": "claude-test-model",
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
            "max_tokens": 64,
            "temperature": 0.1,
            "stream": False,
        }
        # The client's credentials reach the engine, which checks them; anthropic-* headers stay behind.
        sent = {k.lower(): v for k, v in seen.headers.items()}
        assert not sent.keys() & {"anthropic-version", "anthropic-beta"}
        assert key in (sent.get("x-api-key"), sent.get("authorization", "").removeprefix("Bearer "))
        assert b"secret" not in seen.body


async def test_sdk_stream_and_get_final_message(engine: MockEngine, proxy: Any) -> None:
    engine.stream_word_count = 4
    sdk = client(await proxy())
    async with sdk, sdk.messages.stream(model="claude-haiku-4-5", max_tokens=32, messages=HI) as stream:
        text = "".join([piece async for piece in stream.text_stream])
        final = await stream.get_final_message()
    assert text == "w0 w1 w2 w3 "
    assert final.content[0].text == text  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn" and final.model == "claude-haiku-4-5"
    assert final.usage.output_tokens == 4
    assert engine.last.json()["stream"] is True
    assert engine.last.json()["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("stream", [False, True])
async def test_sdk_parallel_tool_round_trip_reversed_results_reach_the_engine_in_call_order(
    engine: MockEngine, proxy: Any, stream: bool
) -> None:
    ids = ("call_paris", "call_oslo")
    if stream:
        calls = [
            {"delta": {"role": "assistant", "content": ""}},
            {"delta": {"tool_calls": [{"index": 0, "id": ids[0], "type": "function",
                                       "function": {"name": "get_weather", "arguments": ""}}]}},
            {"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}},
            {"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}},
            {"delta": {"tool_calls": [{"index": 1, "id": ids[1], "type": "function",
                                       "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]}},
            {"delta": {}, "finish": "tool_calls"},
        ]  # fmt: skip
        engine.then(streamed(calls))
    else:
        engine.reply_json(tool_calls_completion(*ids))
    question = {"role": "user", "content": "Weather in Paris and Oslo?"}
    async with client(await proxy()) as sdk:
        if stream:
            async with sdk.messages.stream(model="c", max_tokens=64, messages=[question], tools=[WEATHER]) as s:
                first = await s.get_final_message()
        else:
            first = await sdk.messages.create(model="c", max_tokens=64, messages=[question], tools=[WEATHER])
        assert first.stop_reason == "tool_use"
        uses = [b for b in first.content if b.type == "tool_use"]
        assert [u.id for u in uses] == list(ids) and [u.name for u in uses] == ["get_weather"] * 2
        assert uses[0].input == {"city": "Paris" if stream else "call_paris"}
        results = [{"type": "tool_result", "tool_use_id": u.id, "content": f"weather of {u.id}"} for u in uses]
        second = await sdk.messages.create(
            model="c",
            max_tokens=64,
            tools=[WEATHER],
            messages=[
                question,
                {"role": "assistant", "content": [u.model_dump(exclude_none=True) for u in uses]},
                {"role": "user", "content": results[::-1]},  # the order the tools finished
            ],
        )
    assert second.content[0].text == "ok"  # type: ignore[union-attr]
    sent = engine.last.json()["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "tool"]
    assert [c["id"] for c in sent[1]["tool_calls"]] == list(ids)
    assert [m["tool_call_id"] for m in sent[2:]] == list(ids)
    assert sent[2]["content"] == "weather of call_paris"
    assert engine.last.json()["tools"][0]["function"]["name"] == "get_weather"


async def test_results_split_across_two_user_messages(engine: MockEngine, proxy: Any) -> None:
    calls = {"role": "assistant", "content": [{"type": "tool_use", "id": i, "name": "f", "input": {}} for i in "abc"]}
    status, _, _ = await post(
        await proxy(),
        {
            "model": "c",
            "max_tokens": 8,
            "messages": [
                {"role": "user", "content": "go"},
                calls,
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c", "content": "C"}]},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "all done"},
                        {"type": "tool_result", "tool_use_id": "b", "content": "B"},
                        {"type": "tool_result", "tool_use_id": "a", "content": "A"},
                    ],
                },
            ],
        },
    )
    assert status == 200
    sent = engine.last.json()["messages"]
    assert [(m["role"], m.get("tool_call_id"), m["content"]) for m in sent[2:]] == [
        ("tool", "a", "A"),
        ("tool", "b", "B"),
        ("tool", "c", "C"),
        ("user", None, "all done"),
    ]


async def test_is_error_and_images_in_results(engine: MockEngine, proxy: Any) -> None:
    png = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
    uses = [{"type": "tool_use", "id": i, "name": "f", "input": {}} for i in ("shot", "cat")]
    calls = {"role": "assistant", "content": uses}
    results = [
        {"type": "tool_result", "tool_use_id": "cat", "is_error": True, "content": "cat: x: No such file"},
        {"type": "tool_result", "tool_use_id": "shot", "content": [{"type": "image", "source": png}]},
    ]
    async with client(await proxy()) as sdk:
        history = [{"role": "user", "content": "go"}, calls, {"role": "user", "content": results}]
        await sdk.messages.create(model="c", max_tokens=8, messages=history)
    sent = engine.last.json()["messages"]
    assert sent[2] == {"role": "tool", "tool_call_id": "shot", "content": "[image: shown in the next message]"}
    assert sent[3] == {"role": "tool", "tool_call_id": "cat", "content": "Error: cat: x: No such file"}
    assert sent[4]["role"] == "user"
    assert sent[4]["content"][1] == {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}


# --- the SSE grammar, event by event


async def test_sse_grammar_event_by_event(engine: MockEngine, proxy: Any) -> None:
    engine.then(
        streamed(
            [
                {"delta": {"role": "assistant", "content": ""}},
                {"delta": {"reasoning_content": "think"}},
                {"delta": {"content": "Hi"}},
                {"delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                           "function": {"name": "f", "arguments": "{}"}}]}},
                {"delta": {}, "finish": "tool_calls"},
                b'data: {"id":"x","object":"chat.completion.chunk","choices":[],'
                b'"usage":{"prompt_tokens":11,"completion_tokens":3}}\n\n',
            ]
        )
    )  # fmt: skip
    body = {"model": "c", "max_tokens": 8, "stream": True, "messages": HI}
    async with aiohttp.ClientSession() as session, session.post(await proxy() + "/v1/messages", json=body) as r:
        assert r.status == 200
        assert r.headers["Content-Type"] == "text/event-stream; charset=utf-8"
        assert r.headers["X-Accel-Buffering"] == "no" and r.headers["Cache-Control"] == "no-cache"
        raw = await r.read()
    assert b"[DONE]" not in raw and raw.endswith(b"\n\n")
    events = sse_events(raw)
    assert all(name == data["type"] for name, data in events)
    steps = [data["type"] if data["type"] != "content_block_delta" else data["delta"]["type"] for _, data in events]
    assert steps == [
        "message_start", "ping",
        "content_block_start", "thinking_delta", "content_block_stop",
        "content_block_start", "text_delta", "content_block_stop",
        "content_block_start", "input_json_delta", "content_block_stop",
        "message_delta", "message_stop",
    ]  # fmt: skip
    start = events[0][1]["message"]
    assert start["role"] == "assistant" and start["content"] == [] and start["model"] == "c"
    assert start["stop_reason"] is None and start["usage"] == {"input_tokens": 0, "output_tokens": 0, **NO_CACHE}
    assert [d["index"] for _, d in events if "index" in d] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert events[8][1]["content_block"] == {"type": "tool_use", "id": "call_1", "name": "f", "input": {}}
    assert events[11][1] == {
        "type": "message_delta",
        "delta": {"stop_reason": "tool_use", "stop_sequence": None},
        "usage": {"input_tokens": 11, "output_tokens": 3, **NO_CACHE},
    }


# --- stop sequences


async def test_stop_sequence_in_a_stream_is_reported_and_stops_the_engine(engine: MockEngine, proxy: Any) -> None:
    engine.stream_word_count = 200
    engine.stream_delay = 0.01
    sdk = client(await proxy())
    async with sdk, sdk.messages.stream(model="c", max_tokens=300, messages=HI, stop_sequences=["w3", "x"]) as stream:
        final = await stream.get_final_message()
    assert final.content[0].text == "w0 w1 w2 "  # type: ignore[union-attr]
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == "w3"
    assert final.usage.output_tokens == 3  # the token that completed the stop sequence is not output
    assert "stop" not in engine.last.json()
    await engine.wait_cancelled()
    assert len(engine.cancelled) == 1  # the engine's generation was cut off, not run to the end


async def test_stop_sequence_without_streaming_streams_from_the_engine_to_stop_it(
    engine: MockEngine, proxy: Any
) -> None:
    engine.stream_word_count = 200
    engine.stream_delay = 0.01
    async with client(await proxy()) as sdk:
        message = await sdk.messages.create(model="c", max_tokens=300, messages=HI, stop_sequences=["1 w"])
    assert message.content[0].text == "w0 w"  # type: ignore[union-attr]
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == "1 w"
    assert engine.last.json()["stream"] is True
    await engine.wait_cancelled()
    assert len(engine.cancelled) == 1


async def test_stop_sequences_that_never_match_end_normally(engine: MockEngine, proxy: Any) -> None:
    async with client(await proxy()) as sdk:
        message = await sdk.messages.create(model="c", max_tokens=30, messages=HI, stop_sequences=["w9"])
    assert message.content[0].text == "w0 w1 w2 "  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn" and message.stop_sequence is None


# --- pings


def gated(gate: asyncio.Event, answer: Handler) -> Handler:
    """An engine that reads the prompt until the test opens the gate."""

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        await asyncio.wait_for(gate.wait(), 10)
        return await answer(request, received)

    return handler


async def test_pings_while_the_engine_reads_the_prompt(engine: MockEngine, proxy: Any) -> None:
    gate = asyncio.Event()
    answer = streamed([{"delta": {"role": "assistant", "content": "late"}}, {"delta": {}, "finish": "stop"}])
    engine.then(gated(gate, answer))
    url = await proxy(messages_ping_interval=0.05)
    body = {"model": "c", "max_tokens": 8, "stream": True, "messages": HI}
    async with aiohttp.ClientSession() as session, session.post(url + "/v1/messages", json=body) as r:
        # The engine has not answered at all yet, and the client already has its stream.
        assert r.status == 200
        head = [await asyncio.wait_for(r.content.readuntil(b"\n\n"), 10) for _ in range(4)]
        gate.set()
        raw = b"".join(head) + await r.read()
    names = [name for name, _ in sse_events(raw)]
    assert names[:4] == ["message_start", "ping", "ping", "ping"]  # the start's own ping, then one per interval
    assert names[names.index("content_block_start") :] == [
        "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop",
    ]  # fmt: skip
    assert set(names[: names.index("content_block_start")]) == {"message_start", "ping"}


async def test_an_error_after_pings_went_out_is_an_error_event(engine: MockEngine, proxy: Any) -> None:
    overflow = (
        "This model's maximum context length is 512 tokens. However, you requested 829 tokens (824 in the messages"
    )
    gate = asyncio.Event()

    async def refusal(request: web.Request, received: Received) -> web.StreamResponse:
        return web.json_response({"error": {"message": overflow}}, status=400)

    engine.then(gated(gate, refusal))
    url = await proxy(messages_ping_interval=0.05)
    body = {"model": "c", "max_tokens": 8, "stream": True, "messages": HI}
    async with aiohttp.ClientSession() as session, session.post(url + "/v1/messages", json=body) as r:
        assert r.status == 200  # the stream had begun; the error can only go in-band
        head = [await asyncio.wait_for(r.content.readuntil(b"\n\n"), 10) for _ in range(3)]
        gate.set()
        raw = b"".join(head) + await r.read()
    events = sse_events(raw)
    assert [name for name, _ in events][:3] == ["message_start", "ping", "ping"]
    assert events[-1] == (
        "error",
        {"type": "error", "error": {"type": "invalid_request_error", "source": "toolpair",
                                    "message": "prompt is too long: 824 tokens > 512 maximum"}},
    )  # fmt: skip


async def test_no_extra_pings_when_the_engine_answers_quickly(engine: MockEngine, proxy: Any) -> None:
    _, raw, _ = await post(await proxy(), {"model": "c", "max_tokens": 8, "stream": True, "messages": HI})
    assert [name for name, _ in sse_events(raw)].count("ping") == 1


# --- real traffic


async def test_a_claude_code_request_with_every_real_world_oddity(engine: MockEngine, proxy: Any) -> None:
    url = await proxy(messages_model="local-gemma")
    status, raw, _ = await post(url, claude_code_request(stream=True), path="/v1/messages?beta=true")
    assert status == 200
    events = sse_events(raw)
    assert events[-1][0] == "message_stop"
    assert events[0][1]["message"]["model"] == "claude-sonnet-4-5-20250929"
    sent = engine.last.json()
    assert sent["model"] == "local-gemma"
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "tool", "tool", "system"]
    assert sent["messages"][0]["content"].startswith("x-anthropic-billing-header: cc_version=2.1.37.0d9;")
    assert "cch=00000;" in sent["messages"][0]["content"]
    assert sent["messages"][2]["reasoning_content"] == "Two searches in parallel."
    slow, fast = sent["messages"][3:5]
    assert sent["messages"][5]["content"] == "Skills available: none."
    assert (slow["tool_call_id"], fast["tool_call_id"]) == ("toolu_01SLOW", "toolu_02FAST")  # call order restored
    assert slow["content"] == "Error: grep: slow.py: Permission denied"
    assert [t["function"]["name"] for t in sent["tools"]] == TOOL_NAMES
    assert sent["user"] == '{"device_id":"d1","account_uuid":"","session_id":"s1"}'
    assert sent["chat_template_kwargs"] == {"enable_thinking": True, "reasoning_effort": "high"}
    assert sent["reasoning_effort"] == "high"
    assert sent["max_tokens"] == 32000 and sent["temperature"] == 1
    for absent in (b"cache_control", b"defer_loading", b"context_management", b"signature", b"output_config"):
        assert absent not in engine.last.body


async def test_billing_stamp_normalization_can_be_turned_off(engine: MockEngine, proxy: Any) -> None:
    await post(await proxy(normalize_billing_stamp=False), claude_code_request(stream=False))
    assert "cch=fa690;" in engine.last.json()["messages"][0]["content"]


async def test_client_disconnect_mid_stream_stops_the_engine(engine: MockEngine, proxy: Any) -> None:
    engine.stream_word_count = 1000
    engine.stream_delay = 0.01
    body = {"model": "c", "max_tokens": 8, "stream": True, "messages": HI}
    await leave_mid_stream(await proxy(), "/v1/messages", b"text_delta", json=body)
    await engine.wait_cancelled()
    assert len(engine.cancelled) == 1
