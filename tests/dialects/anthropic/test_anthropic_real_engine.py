"""/v1/messages through toolpair to the real llama-cpp-python engine, driven by the anthropic SDK.

toolpair never forwards the client's Anthropic credentials, so something else
must give the engine its API key: ``direct`` runs toolpair with an upstream
client that adds it, and ``stack`` puts a recording forwarder between toolpair
and the engine that adds it and keeps every body the engine received. The
model is tiny, so the tests check structure and what the engine received,
never the quality of answers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import anthropic
import orjson
import pytest
from aiohttp import web
from anthropic import AsyncAnthropic

from proxy.config import Settings
from tests.conftest import start_app
from tests.real_engine import TEMPLATE, RealEngine
from tests.support.conversations import anthropic_calls, weather_uses
from tests.support.proxies import MakeProxy


@dataclass
class Seen:
    path: str
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


@dataclass
class Stack:
    url: str
    seen: list[Seen] = field(default_factory=list)

    def chats(self) -> list[Any]:
        return [s.json() for s in self.seen if s.path == "/v1/chat/completions"]


@pytest.fixture
async def stack(real_engine: RealEngine, make_proxy_to: MakeProxy) -> AsyncIterator[Stack]:
    # No keep-alive: llama-cpp-python closes a connection just after a stream that failed
    # inside it, so a pooled connection could be dead by its next use.
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
    seen: list[Seen] = []

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        seen.append(Seen(request.path, body))
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {real_engine.api_key}"}
        async with session.request(request.method, real_engine.url + request.path_qs, data=body, headers=headers) as up:
            out = web.StreamResponse(status=up.status, headers={"Content-Type": up.headers["Content-Type"]})
            await out.prepare(request)
            async for piece in up.content.iter_any():
                await out.write(piece)
            await out.write_eof()
            return out

    recorder = web.Application()
    recorder.router.add_route("*", "/{tail:.*}", forward)
    recorder_runner, recorder_url = await start_app(recorder)
    settings = Settings(upstream=recorder_url, count_tokens_template=str(TEMPLATE), messages_ping_interval=1.0)
    async with make_proxy_to.running(settings=settings) as (url, _):
        yield Stack(url, seen)
    await recorder_runner.cleanup()
    await session.close()


@pytest.fixture
async def direct(real_engine: RealEngine, make_proxy_to: MakeProxy) -> AsyncIterator[Stack]:
    """toolpair straight in front of the engine, keep-alive pool included."""
    settings = Settings(
        upstream=real_engine.url,
        upstream_api_key=real_engine.api_key,
        upstream_read_timeout=real_engine.read_timeout,
        count_tokens_template=str(TEMPLATE),
    )
    async with make_proxy_to.running(settings=settings) as (url, _):
        yield Stack(url)


def sdk(stack: Stack) -> AsyncAnthropic:
    return AsyncAnthropic(base_url=stack.url, api_key="sk-ant-not-for-the-engine", max_retries=0)


WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
        "required": ["city"],
    },
}
QUESTION = {"role": "user", "content": "What is the weather in Paris and in Oslo?"}


async def test_parallel_tool_round_trip_with_the_sdk_against_the_real_engine(stack: Stack) -> None:
    async with sdk(stack) as client:
        # Turn 1, streamed: a named tool_choice makes llama-cpp-python constrain its output to a call.
        async with client.messages.stream(
            model="claude-test-model",
            max_tokens=40,
            messages=[QUESTION],
            tools=[WEATHER],
            tool_choice={"type": "tool", "name": "get_weather"},
        ) as stream:
            first = await stream.get_final_message()
        assert first.stop_reason == "tool_use" and first.model == "claude-test-model"
        call = next(block for block in first.content if block.type == "tool_use")
        assert call.name == "get_weather" and call.input in ({"city": "Paris"}, {"city": "Oslo"})
        assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0

        # Turn 2: two parallel calls, results sent back in the order they finished (reversed).
        second_call = {"type": "tool_use", "id": "toolu_second", "name": "get_weather", "input": {"city": "Oslo"}}
        history = [
            QUESTION,
            {"role": "assistant", "content": [call.model_dump(exclude_none=True), second_call]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_second", "content": "Oslo: -3C, snow"},
                    {"type": "tool_result", "tool_use_id": call.id, "content": "Paris: 18C, sun"},
                ],
            },
        ]
        second = await client.messages.create(
            model="claude-test-model", max_tokens=12, messages=history, tools=[WEATHER]
        )
    assert second.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert second.usage.input_tokens > first.usage.input_tokens
    received = stack.chats()[-1]["messages"]
    assert [m["role"] for m in received] == ["user", "assistant", "tool", "tool"]
    assert [c["id"] for c in received[1]["tool_calls"]] == [call.id, "toolu_second"]
    assert [m["tool_call_id"] for m in received[2:]] == [call.id, "toolu_second"]
    assert received[2]["content"] == "Paris: 18C, sun"
    assert all(b"sk-ant" not in s.body for s in stack.seen)


TOOLS_HISTORY: dict[str, Any] = {
    "system": [{"type": "text", "text": "You answer briefly.", "cache_control": {"type": "ephemeral"}}],
    "tools": [WEATHER],
    "messages": [
        QUESTION,
        anthropic_calls(*weather_uses(), thinking="Two calls.", text="Checking both."),
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_b", "content": [{"type": "text", "text": "snow"}]},
                {"type": "tool_result", "tool_use_id": "toolu_a", "content": "timeout", "is_error": True},
                {"type": "text", "text": "Summarize."},
            ],
        },
        {"role": "system", "content": "Use one sentence."},
    ],
}


@pytest.mark.parametrize(
    "request_body",
    [{"messages": [{"role": "user", "content": "Hi"}]}, {"system": "Be brief.", "messages": [QUESTION]}, TOOLS_HISTORY],
    ids=["plain", "system", "tools-history"],
)
async def test_count_tokens_is_exact_against_the_real_engine(direct: Stack, request_body: dict[str, Any]) -> None:
    async with sdk(direct) as client:
        counted = await client.messages.count_tokens(model="claude-test-model", **request_body)
        answered = await client.messages.create(model="claude-test-model", max_tokens=1, **request_body)
    # usage.input_tokens of a non-stream answer is the engine's own usage.prompt_tokens.
    assert counted.input_tokens == answered.usage.input_tokens
    assert counted.input_tokens > 5


async def test_count_tokens_header_says_exact(stack: Stack) -> None:
    body = {"model": "c", "messages": [{"role": "user", "content": "Hi"}]}
    async with (
        aiohttp.ClientSession() as session,
        session.post(stack.url + "/v1/messages/count_tokens", json=body) as r,
    ):
        assert r.status == 200 and r.headers["X-Toolpair-Token-Count"] == "exact"


async def test_stop_sequence_against_the_real_engine(stack: Stack) -> None:
    # The tiny model mostly echoes its prompt; greedy decoding makes that repeatable.
    prompt = [{"role": "user", "content": "Write a short poem about the sea."}]
    options: dict[str, Any] = {"model": "c", "max_tokens": 24, "messages": prompt, "extra_body": {"temperature": 0}}
    async with sdk(stack) as client:
        free = await client.messages.create(**options)
        text = "".join(b.text for b in free.content if b.type == "text")
        assert len(text) > 8, f"the model's answer is too short to cut: {text!r}"
        stop = text[len(text) // 2 : len(text) // 2 + 3]
        cut = text[: text.index(stop)]
        stopped = await client.messages.create(**options, stop_sequences=[stop, "never in this text"])
        async with client.messages.stream(**options, stop_sequences=[stop]) as stream:
            streamed = await stream.get_final_message()
    for message in (stopped, streamed):
        assert message.stop_reason == "stop_sequence" and message.stop_sequence == stop
        assert "".join(b.text for b in message.content if b.type == "text") == cut
        assert message.usage.output_tokens < free.usage.output_tokens
        assert message.usage.input_tokens == free.usage.input_tokens
    assert all("stop" not in chat for chat in stack.chats())


async def test_prompt_too_long_against_the_real_engine(direct: Stack) -> None:
    long = [{"role": "user", "content": "hello " * 5000}]
    async with sdk(direct) as client:
        counted = await client.messages.count_tokens(model="c", messages=long)
        expected = f"prompt is too long: {counted.input_tokens} tokens > 4096 maximum"
        with pytest.raises(anthropic.BadRequestError, match=expected) as plain:
            await client.messages.create(model="c", max_tokens=5, messages=long)
        # Streamed, llama-cpp-python answers 200 and an empty stream, then drops the connection;
        # toolpair still finds the reason, every time.
        for _ in range(3):
            with pytest.raises(anthropic.BadRequestError, match=expected):
                async with client.messages.stream(model="c", max_tokens=5, messages=long) as stream:
                    await stream.get_final_message()
    assert plain.value.status_code == 400
    assert plain.value.body == {"type": "error", "error": {"type": "invalid_request_error", "message": expected,
                                                            "source": "toolpair"}}  # fmt: skip
