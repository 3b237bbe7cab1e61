"""Engine adaptation and extraction through the real HTTP path: openai SDK -> toolpair -> mock engine.

The mock engine plays llama-cpp-python: it answers with raw model text, the
way that engine does, and records exactly what it received.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from aiohttp import web
from openai import AsyncOpenAI

from proxy.config import Settings
from proxy.engine.client import EngineCall
from proxy.engine.plan import engine_setup
from proxy.engine.upstream import Upstream
from tests.conftest import Stack
from tests.mock_engine import MockEngine, Received, answers, breaks_off, chunk, completion
from tests.support.conversations import WEATHER_TOOL
from tests.support.proxies import MakeProxy

pytestmark = pytest.mark.asyncio

Handler = Callable[[web.Request, Received], Awaitable[web.StreamResponse]]

TWO_CALLS = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
)
WEATHER = {"Paris": "18C sun", "Oslo": "-3C snow"}


def dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


@pytest.fixture
async def lcp(make_proxy: MakeProxy) -> AsyncIterator[str]:
    """toolpair in front of the mock engine, told that it is llama-cpp-python."""
    yield await make_proxy(engine_kind="llama-cpp-python", upstream_read_timeout=5.0)


def sdk(url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0)


async def test_agent_loop_with_raw_hermes_text(lcp: str, engine: MockEngine) -> None:
    engine.then(answers(TWO_CALLS)).then(answers("Paris: 18C and sunny. Oslo: -3C with snow."))
    messages: list[Any] = [{"role": "user", "content": "Weather in Paris and Oslo?"}]
    async with sdk(lcp) as client:
        reply = await client.chat.completions.create(model="m", messages=messages, tools=[WEATHER_TOOL])
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content is None
        calls = choice.message.tool_calls or []
        assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
            ("get_weather", {"city": "Paris"}),
            ("get_weather", {"city": "Oslo"}),
        ]
        messages.append(choice.message)  # as SDK users do: the assistant turn, content None
        for call in reversed(calls):  # the tools finished in reverse order
            city = json.loads(call.function.arguments)["city"]
            messages.append({"role": "tool", "tool_call_id": call.id, "content": WEATHER[city]})
        final = await client.chat.completions.create(model="m", messages=messages, tools=[WEATHER_TOOL])
    assert final.choices[0].message.content == "Paris: 18C and sunny. Oslo: -3C with snow."
    sent = engine.last.json()["messages"]
    assert sent[1]["content"] == "" and [c["id"] for c in sent[1]["tool_calls"]] == [c.id for c in calls]
    assert [(m["tool_call_id"], m["content"]) for m in sent[2:]] == [
        (calls[0].id, "18C sun"),
        (calls[1].id, "-3C snow"),
    ]


async def test_sdk_stream_accumulates_to_the_non_stream_calls(lcp: str, engine: MockEngine) -> None:
    text = "Checking both.\n" + TWO_CALLS
    engine.then(answers(text)).then(answers(text, piece=3))
    request: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "?"}], "tools": [WEATHER_TOOL]}
    async with sdk(lcp) as client:
        plain = await client.chat.completions.create(**request)
        async with client.chat.completions.stream(**request) as stream:
            async for _ in stream:
                pass
            streamed = await stream.get_final_completion()

    def shape(reply: Any) -> Any:
        message = reply.choices[0].message
        calls = [(c.type, c.function.name, c.function.arguments, len(c.id)) for c in message.tool_calls]
        return message.content, calls, reply.choices[0].finish_reason

    assert shape(streamed) == shape(plain)
    assert shape(plain) == (
        "Checking both.",
        [
            ("function", "get_weather", '{"city":"Paris"}', 29),
            ("function", "get_weather", '{"city":"Oslo"}', 29),
        ],
        "tool_calls",
    )


async def test_text_and_each_call_stream_as_soon_as_they_are_known(lcp: str, engine: MockEngine) -> None:
    gates = [asyncio.Event(), asyncio.Event()]

    async def gated(request: web.Request, received: Received) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(chunk({"role": "assistant", "content": "Let me look."}))
        await asyncio.wait_for(gates[0].wait(), 5)
        await response.write(chunk({"content": TWO_CALLS[:80]}))  # all of the first call, and more
        await asyncio.wait_for(gates[1].wait(), 5)
        await response.write(chunk({"content": TWO_CALLS[80:]}))
        await response.write(chunk({}, "stop") + b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    engine.then(gated)
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "?"}], "tools": [WEATHER_TOOL]}
    seen: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as session, session.post(lcp + "/v1/chat/completions", json=body) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")

        async def until(predicate: Callable[[], bool]) -> None:
            while not predicate():
                line = await asyncio.wait_for(response.content.readuntil(b"\n\n"), 3)
                if line.startswith(b"data: {"):
                    seen.append(orjson.loads(line[6:]))

        def deltas() -> list[dict[str, Any]]:
            return [c["choices"][0]["delta"] for c in seen if c["choices"]]

        await until(lambda: any(d.get("content") == "Let me look." for d in deltas()))
        gates[0].set()
        await until(lambda: any("arguments" in (d.get("tool_calls") or [{}])[0].get("function", {}) and
                                d["tool_calls"][0]["function"]["arguments"] for d in deltas()))  # fmt: skip
        gates[1].set()
        rest = await asyncio.wait_for(response.content.read(), 3)
    assert rest.endswith(b"data: [DONE]\n\n")
    first = [d["tool_calls"][0] for d in deltas() if d.get("tool_calls")]
    assert first[0]["function"] == {"name": "get_weather", "arguments": ""} and first[0]["index"] == 0
    assert first[1] == {"index": 0, "function": {"arguments": '{"city":"Paris"}'}}
    assert b'"index":1' in rest and b'"finish_reason":"tool_calls"' in rest


def usage_engine(engine: MockEngine, text: str, prompt_tokens: int) -> None:
    """Script: the stream (no usage), the replay that reports prompt tokens, two token counts."""
    engine.then(answers(text))
    replay = completion("x")
    replay["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": 1, "total_tokens": prompt_tokens + 1}
    engine.reply_json(replay)

    async def count(request: web.Request, received: Received) -> web.StreamResponse:
        words = received.json()["input"].split()
        return web.json_response({"count": 1 + len(words)})  # a BOS token, then one token per word

    engine.then(count).then(count)


async def test_include_usage_ends_the_stream_with_a_usage_chunk(lcp: str, engine: MockEngine) -> None:
    usage_engine(engine, "one two three four", prompt_tokens=42)
    async with sdk(lcp) as client:
        stream = await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "count"}],
            stream=True,
            stream_options={"include_usage": True},
            max_completion_tokens=9,
        )
        chunks = [c async for c in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "one two three four"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.model_dump() == {
        "prompt_tokens": 42,
        "completion_tokens": 4,
        "total_tokens": 46,
        "completion_tokens_details": None,
        "prompt_tokens_details": None,
    }
    stream_request, replay, *counts = engine.received
    assert [r.path for r in engine.received] == ["/v1/chat/completions"] * 2 + ["/extras/tokenize/count"] * 2
    assert stream_request.json()["max_tokens"] == 9
    assert replay.json() == {"model": "m", "messages": [{"role": "user", "content": "count"}], "max_tokens": 1,
                             "stream": False}  # fmt: skip
    assert [c.json() for c in counts] == [{"input": "one two three four"}, {"input": ""}]
    assert all(r.headers["Authorization"] == "Bearer sk-test" for r in engine.received)


async def test_usage_the_engine_sends_is_kept_and_not_counted_again(lcp: str, engine: MockEngine) -> None:
    usage = {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
    engine.then(answers("hi there", usage=usage))
    async with sdk(lcp) as client:
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "?"}], stream=True, stream_options={"include_usage": True}
        )
        chunks = [c async for c in stream]
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 9
    assert len(engine.received) == 1


async def test_reasoning_is_split_out_stream_and_not(lcp: str, engine: MockEngine) -> None:
    text = "<think>\nThe user greets me.\n</think>\n\nHello!"
    engine.then(answers(text)).then(answers(text, piece=2))
    async with sdk(lcp) as client:
        plain = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        deltas = [c.choices[0].delta for c in [c async for c in stream] if c.choices]
    message = plain.choices[0].message
    assert message.content == "Hello!"
    assert message.model_extra == {"reasoning_content": "The user greets me.\n"}
    assert "".join(d.content or "" for d in deltas) == "Hello!"
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == "The user greets me.\n"


async def test_malformed_call_text_stays_text(lcp: str, engine: MockEngine) -> None:
    text = 'Calling <tool_call>\n{"name": "get_weather", "arguments": {"city": Paris}}\n</tool_call>'
    engine.then(answers(text))
    async with sdk(lcp) as client:
        reply = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "?"}], tools=[WEATHER_TOOL]
        )
    assert reply.choices[0].message.content == text
    assert reply.choices[0].message.tool_calls is None and reply.choices[0].finish_reason == "stop"


async def test_parallel_tool_calls_false_keeps_the_first(lcp: str, engine: MockEngine) -> None:
    engine.then(answers(TWO_CALLS))
    async with sdk(lcp) as client:
        reply = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "?"}], tools=[WEATHER_TOOL], parallel_tool_calls=False
        )
    calls = reply.choices[0].message.tool_calls or []
    assert [json.loads(c.function.arguments)["city"] for c in calls] == ["Paris"]


async def test_without_tools_call_text_is_just_text(lcp: str, engine: MockEngine) -> None:
    engine.then(answers(TWO_CALLS))
    async with sdk(lcp) as client:
        reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "?"}])
    assert reply.choices[0].message.content == TWO_CALLS


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"n": 2}, "'n' = 2"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]},
         "cannot see images"),
    ],
)  # fmt: skip
async def test_requests_the_engine_cannot_serve_are_openai_400s(
    lcp: str, engine: MockEngine, extra: dict[str, Any], message: str
) -> None:
    async with sdk(lcp) as client:
        with pytest.raises(openai.BadRequestError, match=message) as caught:
            await client.chat.completions.create(
                **{"model": "m", "messages": [{"role": "user", "content": "?"}], **extra}
            )
    assert caught.value.status_code == 400
    assert isinstance(caught.value.body, dict) and caught.value.body["source"] == "toolpair"
    assert engine.received == []


async def test_a_request_needing_nothing_keeps_its_bytes_for_llama_cpp_python(lcp: str, engine: MockEngine) -> None:
    raw = b'{"model":"m",  "messages": [ {"role":"user","content":"hi \\u00e9"} ], "max_tokens": 5}'
    async with aiohttp.ClientSession() as session, session.post(lcp + "/v1/chat/completions", data=raw) as response:
        reply = await response.json()
    assert engine.last.body == raw
    assert reply["choices"][0]["message"]["content"] == "ok"


async def test_adapted_request_reaches_the_engine_in_its_shape(lcp: str, engine: MockEngine) -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                                                                    "function": {"name": "get_weather",
                                                                                 "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "18C"}]},
        ],
        "max_completion_tokens": 16,
        "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}},
    }  # fmt: skip
    async with aiohttp.ClientSession() as session, session.post(lcp + "/v1/chat/completions", json=body) as response:
        assert response.status == 200
    sent = engine.last.json()
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "tool"]
    assert [m["content"] for m in sent["messages"]] == ["Be brief.", "Weather?", "", "18C"]
    assert sent["max_tokens"] == 16 and "max_completion_tokens" not in sent
    assert sent["response_format"] == {"type": "json_object", "schema": {"type": "object"}}


async def test_engine_errors_are_relayed_as_they_are(lcp: str, engine: MockEngine) -> None:
    engine.reply_json({"error": {"message": "Requested tokens exceed context window"}}, status=400)
    async with (
        aiohttp.ClientSession() as session,
        session.post(lcp + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "?"}]}) as response,
    ):
        assert response.status == 400
        assert await response.json() == {"error": {"message": "Requested tokens exceed context window"}}


async def test_engine_breaking_off_mid_stream_ends_with_an_error_event(lcp: str, engine: MockEngine) -> None:
    engine.then(breaks_off(chunk({"content": "partial"}) + b'data: {"half'))
    body = {"stream": True, "messages": [{"role": "user", "content": "?"}]}
    async with aiohttp.ClientSession() as session, session.post(lcp + "/v1/chat/completions", json=body) as response:
        raw = await response.read()
    frames = raw.split(b"\n\n")
    assert b"partial" in frames[0] and b"half" not in raw
    error = orjson.loads(frames[1][len(b"data: ") :])["error"]
    assert error["type"] == "upstream_error" and error["source"] == "toolpair"


async def test_engine_pings_keep_the_client_stream_alive(lcp: str, engine: MockEngine) -> None:
    gate = asyncio.Event()

    async def slow(request: web.Request, received: Received) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b": ping - 2026-01-01 00:00:00\r\n\r\n")  # a long prompt is being read
        await asyncio.wait_for(gate.wait(), 5)
        await response.write(chunk({"content": "hi"}, "stop") + b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    engine.then(slow)
    body = {"stream": True, "messages": [{"role": "user", "content": "?"}]}
    async with aiohttp.ClientSession() as session, session.post(lcp + "/v1/chat/completions", json=body) as response:
        assert await asyncio.wait_for(response.content.readuntil(b"\n\n"), 3) == b": keepalive\n\n"
        gate.set()
        assert (await response.read()).endswith(b"data: [DONE]\n\n")


async def test_generic_engine_text_is_relayed_untouched(stack: Any) -> None:
    stack.engine.then(answers(TWO_CALLS))
    body = orjson.dumps({"messages": [{"role": "user", "content": "?"}], "tools": [WEATHER_TOOL]})
    async with (
        aiohttp.ClientSession() as session,
        session.post(stack.url + "/v1/chat/completions", data=body) as response,
    ):
        reply = await response.json()
    assert stack.engine.last.body == body
    assert reply["choices"][0]["message"] == {"role": "assistant", "content": TWO_CALLS}


@pytest.fixture
async def bound_upstream(engine: MockEngine) -> AsyncIterator[EngineCall]:
    setup = engine_setup(Settings(engine_kind="llama-cpp-python"))
    upstream = Upstream(engine.url, read_timeout=5.0, reuses_connections=setup.profile.reuses_connections)
    await upstream.start()
    yield EngineCall(upstream, setup)
    await upstream.close()


async def test_chat_upstream_seam_adapts_and_extracts(bound_upstream: EngineCall, engine: MockEngine) -> None:
    """What the Anthropic and Responses front ends get: the same treatment, without asking."""
    engine.then(answers(TWO_CALLS))
    body = {
        "model": "m",
        "messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "assistant", "content": None, "tool_calls": []},
        ],
        "tools": [WEATHER_TOOL],
    }
    reply = await bound_upstream.completion(body, headers={"Authorization": "Bearer k"})
    sent = engine.last.json()
    assert sent["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "assistant", "content": "",
                                                                             "tool_calls": []}]  # fmt: skip
    assert sent["stream"] is False and engine.last.headers["Authorization"] == "Bearer k"
    calls = reply["choices"][0]["message"]["tool_calls"]
    assert [c["function"]["arguments"] for c in calls] == ['{"city":"Paris"}', '{"city":"Oslo"}']
    assert reply["choices"][0]["finish_reason"] == "tool_calls"


async def test_chat_upstream_stream_extracts_and_counts_usage(bound_upstream: EngineCall, engine: MockEngine) -> None:
    usage_engine(engine, "Sure.\n" + TWO_CALLS, prompt_tokens=30)
    body = {"model": "m", "messages": [{"role": "user", "content": "?"}], "tools": [WEATHER_TOOL],
            "stream_options": {"include_usage": True}}  # fmt: skip
    chunks = [c async for c in bound_upstream.stream(body) if c is not None]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("content") or "" for d in deltas) == "Sure."
    assert [d["tool_calls"][0]["index"] for d in deltas if d.get("tool_calls")] == [0, 0, 1, 1]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] == 30
    assert chunks[-1]["usage"]["completion_tokens"] == len(("Sure.\n" + TWO_CALLS).split())


async def test_chat_upstream_refuses_what_the_engine_cannot_serve(
    bound_upstream: EngineCall, engine: MockEngine
) -> None:
    from proxy.errors import ClientInputError

    with pytest.raises(ClientInputError, match="'n' = 3"):
        await bound_upstream.completion({"messages": [], "n": 3})
    assert engine.received == []


async def test_llama_cpp_python_gets_a_fresh_connection_per_request(lcp: str, stack: Stack, engine: MockEngine) -> None:
    """Its server breaks kept-alive connections after a failed stream, so none is reused."""
    async with sdk(lcp) as client:
        for _ in range(3):
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    fresh = [seen.peer for seen in engine.received]
    assert len(set(fresh)) == 3
    # A generic engine keeps the pooled connection.
    async with AsyncOpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0) as client:
        for _ in range(3):
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert len({seen.peer for seen in engine.received[3:]}) == 1


async def test_an_idle_pooled_connection_is_closed_before_the_engines_own_idle_limit(
    stack: Stack, engine: MockEngine
) -> None:
    """llama-server and uvicorn drop a connection idle for 5 s; toolpair lets go of it first.

    A request written to a connection the engine is closing at that moment fails; so after
    :data:`~proxy.engine.upstream.IDLE_CONNECTION_SECONDS` idle the next request gets a new one.
    """
    from proxy.engine.upstream import IDLE_CONNECTION_SECONDS

    async with AsyncOpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0) as client:
        for pause in (0.0, 0.2, IDLE_CONNECTION_SECONDS + 0.5):
            await asyncio.sleep(pause)
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    peers = [seen.peer for seen in engine.received]
    assert peers[0] == peers[1], "a connection idle for a moment is reused"
    assert peers[2] != peers[1], "one idle past the limit is not"
    assert IDLE_CONNECTION_SECONDS < 5
