"""The official openai SDK as the client, pointed at toolpair through base_url."""

from __future__ import annotations

from typing import Any

import pytest
from openai import AsyncOpenAI

from tests.conftest import Stack
from tests.support.conversations import parallel_weather

pytestmark = pytest.mark.asyncio

MESSAGES: list[Any] = parallel_weather("18C", "-3C", ids=("call_1", "call_2"))


def client(stack: Stack) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=stack.url + "/v1", api_key="sk-test", max_retries=0)


async def test_sdk_non_stream_reversed_results_reach_engine_in_call_order(stack: Stack) -> None:
    async with client(stack) as openai:
        reply = await openai.chat.completions.create(model="m", messages=MESSAGES)
    assert reply.choices[0].message.content == "ok"
    sent = stack.engine.last.json()["messages"]
    assert [m.get("tool_call_id") for m in sent[2:]] == ["call_1", "call_2"]
    assert stack.engine.last.headers["Authorization"] == "Bearer sk-test"


async def test_sdk_stream(stack: Stack) -> None:
    async with client(stack) as openai:
        stream = await openai.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "w0 w1 w2 "
    assert [m.get("tool_call_id") for m in stack.engine.last.json()["messages"][2:]] == ["call_1", "call_2"]


async def test_sdk_models_passthrough(stack: Stack) -> None:
    async with client(stack) as openai:
        models = await openai.models.list()
    assert [m.id for m in models.data] == ["mock"]
