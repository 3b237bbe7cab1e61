"""DeepSeek V3.1, Kimi K2 and gpt-oss calls read back through ``toolpair proxy``, on every API.

The mock engine plays llama-cpp-python answering with the text each family's own template renders
for two parallel calls; toolpair (``auto``, as a sidecar runs without the template) must return the
two calls with clean content: Chat non-stream and stream, Anthropic Messages and Responses.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from anthropic import AsyncAnthropic

from tests.engine.test_engine_http import answers, sdk
from tests.engine.test_toolcalls_deepseek import v31_reply
from tests.engine.test_toolcalls_harmony import gpt_oss_reply
from tests.engine.test_toolcalls_kimi import kimi_reply
from tests.mock_engine import MockEngine
from tests.support.conversations import WEATHER_TOOL
from tests.support.proxies import MakeProxy

pytestmark = pytest.mark.asyncio

REPLIES: dict[str, Callable[[], str]] = {"deepseek-v3.1": v31_reply, "kimi-k2": kimi_reply, "harmony": gpt_oss_reply}
CITIES = [{"city": "Paris"}, {"city": "Tokyo"}]
QUESTION: list[Any] = [{"role": "user", "content": "Weather in Paris and Tokyo?"}]


@pytest.mark.parametrize("fmt", list(REPLIES))
async def test_every_api_gets_the_two_calls(fmt: str, engine: MockEngine, make_proxy: MakeProxy) -> None:
    text = REPLIES[fmt]()
    url = await make_proxy(engine_kind="llama-cpp-python")  # tool_call_format auto
    for _ in range(4):
        engine.then(answers(text))
    async with sdk(url) as client:
        done = await client.chat.completions.create(model="m", messages=QUESTION, tools=[WEATHER_TOOL])  # type: ignore[arg-type]
        message = done.choices[0].message
        assert done.choices[0].finish_reason == "tool_calls"
        assert [json.loads(c.function.arguments) for c in message.tool_calls or []] == CITIES
        assert not message.content

        stream = await client.chat.completions.create(
            model="m",
            messages=QUESTION,  # type: ignore[arg-type]
            tools=[WEATHER_TOOL],  # type: ignore[list-item]
            stream=True,
        )
        content, arguments = "", {}
        async for chunk in stream:
            for choice in chunk.choices:
                content += choice.delta.content or ""
                for call in choice.delta.tool_calls or []:
                    arguments[call.index] = arguments.get(call.index, "") + (call.function.arguments or "")  # type: ignore[union-attr]
        assert [json.loads(arguments[i]) for i in sorted(arguments)] == CITIES
        assert not content

        function = WEATHER_TOOL["function"]
        responses = await client.responses.create(
            model="m",
            input="Weather in Paris and Tokyo?",
            tools=[{"type": "function", "name": "get_weather", "parameters": function["parameters"], "strict": False}],  # type: ignore[index, list-item]
        )
        calls = [item for item in responses.output if item.type == "function_call"]
        assert [json.loads(c.arguments) for c in calls] == CITIES  # type: ignore[union-attr]
        assert not [item for item in responses.output if item.type == "message"]

    tool = {"name": "get_weather", "description": function["description"], "input_schema": function["parameters"]}  # type: ignore[index]
    async with AsyncAnthropic(base_url=url, api_key="k", max_retries=0) as anthropic:
        reply = await anthropic.messages.create(model="m", max_tokens=100, tools=[tool], messages=QUESTION)  # type: ignore[list-item]
    assert reply.stop_reason == "tool_use"
    assert [b.input for b in reply.content if b.type == "tool_use"] == CITIES
    assert [b for b in reply.content if b.type == "text" and b.text.strip()] == []
