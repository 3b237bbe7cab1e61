"""/v1/responses translated onto the real llama-cpp-python engine, with a tap recording what it receives.

The model is tiny: these tests check structure and what reached the engine, not answers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from openai import AsyncOpenAI

from tests.conftest import start_app
from tests.real_engine import RealEngine
from tests.support.proxies import MakeProxy

pytestmark = pytest.mark.asyncio


@dataclass
class Tap:
    """A pass-through in front of the engine that keeps every request body it forwards."""

    target: str
    bodies: list[Any] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.bodies.append(orjson.loads(body) if body else None)
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
        async with (
            aiohttp.ClientSession() as session,
            session.request(request.method, self.target + request.path_qs, data=body, headers=headers) as upstream,
        ):
            out = web.StreamResponse(status=upstream.status, headers={"Content-Type": upstream.content_type})
            await out.prepare(request)
            async for piece in upstream.content.iter_any():
                await out.write(piece)
            await out.write_eof()
            return out


@pytest.fixture
async def tapped(real_engine: RealEngine, make_proxy_to: MakeProxy) -> AsyncIterator[tuple[str, Tap]]:
    tap = Tap(real_engine.url)
    tap_app = web.Application()
    tap_app.router.add_route("*", "/{tail:.*}", tap.handle)
    tap_runner, tap_url = await start_app(tap_app)
    async with make_proxy_to.running(upstream=tap_url, upstream_read_timeout=real_engine.read_timeout) as (url, _):
        yield url, tap
    await tap_runner.cleanup()


TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        "strict": False,
    },
    {"type": "web_search"},
]
INPUT: list[Any] = [
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Answer in one short line."}]},
    {"role": "user", "content": "Weather in Paris and Oslo?"},
    {"type": "function_call", "id": "fc_1", "status": "completed", "call_id": "call_paris", "name": "get_weather",
     "arguments": '{"city": "Paris"}'},
    {"type": "function_call", "id": "fc_2", "status": "completed", "call_id": "call_oslo", "name": "get_weather",
     "arguments": '{"city": "Oslo"}'},
    {"type": "function_call_output", "id": "fco_2", "call_id": "call_oslo", "output": "Oslo: -3C, snow"},
    {"type": "function_call_output", "id": "fco_1", "call_id": "call_paris", "output": "Paris: 18C, sun"},
]  # fmt: skip


async def test_responses_round_trip_on_the_real_engine(tapped: tuple[str, Tap], real_engine: RealEngine) -> None:
    url, tap = tapped
    async with AsyncOpenAI(base_url=url + "/v1", api_key=real_engine.api_key, max_retries=0) as sdk:
        whole = await sdk.responses.create(
            model="gemma", input=INPUT, tools=TOOLS, max_output_tokens=8, temperature=0, store=False
        )
        stream = await sdk.responses.create(
            model="gemma", input=INPUT, tools=TOOLS, max_output_tokens=8, temperature=0, stream=True
        )
        events = [event async for event in stream]

    for sent in tap.bodies:
        messages = sent["messages"]
        assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool"]
        assert [m["tool_call_id"] for m in messages[3:]] == ["call_paris", "call_oslo"]
        assert [t["function"]["name"] for t in sent["tools"]] == ["get_weather"]
        assert sent["max_tokens"] == 8
    assert len(tap.bodies) == 2 and tap.bodies[1]["stream"] is True

    assert whole.status in ("completed", "incomplete") and whole.id.startswith("resp_")
    assert whole.usage is not None and whole.usage.input_tokens > 20 and 0 < whole.usage.output_tokens <= 8
    assert all(item.type in ("message", "function_call", "reasoning") for item in whole.output)

    assert events[0].type == "response.created" and events[-1].type in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response  # type: ignore[union-attr]
    assert final.id == events[0].response.id  # type: ignore[union-attr]
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed == final.output_text
    if whole.status == "incomplete":
        assert whole.incomplete_details is not None and whole.incomplete_details.reason == "max_output_tokens"


async def test_logprobs_asked_for_come_back_on_each_output_text(
    tapped: tuple[str, Tap], real_engine: RealEngine
) -> None:
    url, tap = tapped
    ask: dict[str, Any] = {"model": "gemma", "input": "Say hello.", "max_output_tokens": 6, "temperature": 0}
    async with AsyncOpenAI(base_url=url + "/v1", api_key=real_engine.api_key, max_retries=0) as sdk:
        whole = await sdk.responses.create(**ask, top_logprobs=2, include=["message.output_text.logprobs"], store=False)
        stream = await sdk.responses.create(**ask, top_logprobs=2, stream=True, store=False)
        events = [event async for event in stream]
        plain = await sdk.responses.create(**ask, store=False)

    assert [(sent.get("logprobs"), sent.get("top_logprobs")) for sent in tap.bodies] == [
        (True, 2),
        (True, 2),
        (None, None),
    ]
    text = whole.output[-1].content[0]  # type: ignore[union-attr]
    assert text.type == "output_text" and text.text and text.logprobs
    for entry in text.logprobs:
        assert isinstance(entry.token, str) and entry.logprob <= 0 and entry.bytes == list(entry.token.encode())
        assert len(entry.top_logprobs) == 2 and entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
    # The logprobs are the engine's, token for token: when the token limit cuts the reply inside an
    # end-of-turn marker, the text loses the marker's first characters and the logprobs keep them.
    spelled = "".join(entry.token for entry in text.logprobs)
    assert spelled.startswith(text.text) and len(spelled) - len(text.text) < 12

    deltas = [e for e in events if e.type == "response.output_text.delta"]
    done = next(e for e in events if e.type == "response.output_text.done")
    final = events[-1].response.output[-1].content[0]  # type: ignore[union-attr]
    tokens = [x.token for x in done.logprobs]
    assert tokens == [x.token for x in final.logprobs] == [x.token for x in text.logprobs]  # temperature 0
    streamed = [x.token for e in deltas for x in e.logprobs]
    assert streamed and tokens[: len(streamed)] == streamed  # a held-back marker's tokens come with done
    assert "".join(e.delta for e in deltas) == final.text and "".join(streamed).startswith(final.text)

    assert plain.output[-1].content[0].logprobs == []  # type: ignore[union-attr]
