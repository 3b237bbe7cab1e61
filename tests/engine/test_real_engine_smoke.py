"""The sidecar in front of the real llama-cpp-python engine, with the openai SDK."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from openai import AsyncOpenAI

from tests.real_engine import RealEngine
from tests.support.proxies import MakeProxy

pytestmark = pytest.mark.asyncio


@pytest.fixture
async def sidecar(real_engine: RealEngine, make_proxy_to: MakeProxy) -> AsyncIterator[str]:
    yield await make_proxy_to(upstream=real_engine.url, upstream_read_timeout=real_engine.read_timeout)


async def test_chat_through_toolpair_to_the_real_engine(sidecar: str, real_engine: RealEngine) -> None:
    async with AsyncOpenAI(base_url=sidecar + "/v1", api_key=real_engine.api_key, max_retries=0) as client:
        reply = await client.chat.completions.create(
            model="gemma", messages=[{"role": "user", "content": "Say hi."}], max_tokens=8, temperature=0
        )
        assert reply.usage is not None and reply.usage.completion_tokens > 0
        stream = await client.chat.completions.create(
            model="gemma", messages=[{"role": "user", "content": "Say hi."}], max_tokens=8, temperature=0, stream=True
        )
        streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert streamed == reply.choices[0].message.content
