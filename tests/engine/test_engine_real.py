"""Against the real llama-cpp-python server: what fails when sent straight to it works through toolpair.

Each request goes twice, from the same openai SDK call: straight to the engine,
where llama-cpp-python 0.3.36 answers 500 (or silently ignores part of the
request), and through toolpair with ``engine_kind: llama-cpp-python``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from tests.real_engine import RealEngine
from tests.support.conversations import WEATHER_TOOL
from tests.support.proxies import MakeProxy

pytestmark = pytest.mark.asyncio

USER = {"role": "user", "content": "Weather in Paris?"}
THANKS = {"role": "user", "content": "Thanks."}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
TEXT = [{"type": "text", "text": "Be brief."}]

# Every message shape the SDK's ChatCompletionMessageParam allows that the engine rejects with a 500.
ACCEPTED: list[tuple[str, list[Any], dict[str, Any]]] = [
    ("assistant-null-content-with-tool-calls",
     [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]},
      {"role": "tool", "tool_call_id": "call_1", "content": "18C"}], {"tools": [WEATHER_TOOL]}),
    ("assistant-null-content-with-function-call",
     [USER, {"role": "assistant", "content": None, "function_call": {"name": "get_weather", "arguments": "{}"}},
      {"role": "function", "name": "get_weather", "content": "18C"}], {}),
    ("assistant-text-parts", [USER, {"role": "assistant", "content": [{"type": "text", "text": "Sunny."}]}, THANKS],
     {}),
    ("assistant-refusal-part",
     [USER, {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't."}], "refusal": "I can't."},
      THANKS], {}),
    ("system-text-parts", [{"role": "system", "content": TEXT}, USER], {}),
    ("developer", [{"role": "developer", "content": "Be brief."}, USER], {}),
    ("developer-text-parts", [{"role": "developer", "content": TEXT, "name": "ops"}, USER], {}),
    ("tool-text-parts",
     [USER, {"role": "assistant", "content": "", "tool_calls": [CALL]},
      {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "18C"}]}], {}),
    ("tool-without-parameters", [USER], {"tools": [{"type": "function", "function": {"name": "now"}}]}),
    ("tool-choice-allowed-tools", [USER],
     {"tools": [WEATHER_TOOL], "tool_choice": {"type": "allowed_tools", "allowed_tools": {
         "mode": "auto", "tools": [{"type": "function", "function": {"name": "get_weather"}}]}}}),
    ("response-format-json-schema", [USER],
     {"response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}}}),
]  # fmt: skip

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
# Shapes no adaptation can make work on this engine: toolpair says so (400); the engine fails or ignores them.
REFUSED: list[tuple[str, list[Any], dict[str, Any], int]] = [
    ("image-for-a-model-without-vision", [{"role": "user", "content": [{"type": "text", "text": "What?"}, IMAGE]}],
     {}, 200),
    ("input-audio",
     [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}]}],
     {}, 500),
    ("file", [{"role": "user", "content": [{"type": "file", "file": {"file_id": "file-1"}}]}], {}, 500),
    ("n-greater-than-one", [USER], {"n": 2}, 200),
    ("custom-tool", [USER], {"tools": [{"type": "custom", "custom": {"name": "shell"}}]}, 500),
]  # fmt: skip


@pytest.fixture
async def clients(real_engine: RealEngine, make_proxy_to: MakeProxy) -> AsyncIterator[tuple[AsyncOpenAI, AsyncOpenAI]]:
    """(through toolpair, straight to the engine)."""
    url = await make_proxy_to(
        upstream=real_engine.url, engine_kind="llama-cpp-python", upstream_read_timeout=real_engine.read_timeout
    )
    through = AsyncOpenAI(base_url=url + "/v1", api_key=real_engine.api_key, max_retries=0)
    direct = AsyncOpenAI(base_url=real_engine.url + "/v1", api_key=real_engine.api_key, max_retries=0)
    yield through, direct
    await through.close()
    await direct.close()


async def status_of(client: AsyncOpenAI, request: dict[str, Any]) -> int:
    try:
        await client.chat.completions.create(**request)
    except openai.APIStatusError as exc:
        return exc.status_code
    return 200


@pytest.mark.parametrize(("shape", "messages", "extra"), ACCEPTED, ids=[a[0] for a in ACCEPTED])
async def test_sdk_shapes_the_engine_rejects_are_accepted_through_toolpair(
    clients: tuple[AsyncOpenAI, AsyncOpenAI], shape: str, messages: list[Any], extra: dict[str, Any]
) -> None:
    through, direct = clients
    request = {"model": "gemma", "messages": messages, "max_tokens": 2, "temperature": 0, **extra}
    assert await status_of(direct, request) == 500
    reply = await through.chat.completions.create(**request)
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert reply.usage is not None and reply.usage.prompt_tokens > 0


@pytest.mark.parametrize(("shape", "messages", "extra", "direct_status"), REFUSED, ids=[r[0] for r in REFUSED])
async def test_shapes_no_adaptation_can_serve_are_clear_400s(
    clients: tuple[AsyncOpenAI, AsyncOpenAI], shape: str, messages: list[Any], extra: dict[str, Any], direct_status: int
) -> None:
    through, direct = clients
    request = {"model": "gemma", "messages": messages, "max_tokens": 2, "temperature": 0, **extra}
    assert await status_of(direct, request) == direct_status  # 200: the engine silently ignored part of it
    with pytest.raises(openai.BadRequestError) as caught:
        await through.chat.completions.create(**request)
    assert caught.value.status_code == 400
    assert isinstance(caught.value.body, dict) and caught.value.body["source"] == "toolpair"


async def test_user_text_parts_reach_the_template_as_text(clients: tuple[AsyncOpenAI, AsyncOpenAI]) -> None:
    """The engine takes a list in a user message but renders its Python repr; toolpair sends the text."""
    through, direct = clients
    parts = [{"role": "user", "content": [{"type": "text", "text": "Weather in"}, {"type": "text", "text": "Paris?"}]}]
    joined = [{"role": "user", "content": "Weather in\nParis?"}]
    request: dict[str, Any] = {"model": "gemma", "max_tokens": 1, "temperature": 0}
    via_toolpair = await through.chat.completions.create(messages=parts, **request)
    as_text = await direct.chat.completions.create(messages=joined, **request)
    as_repr = await direct.chat.completions.create(messages=parts, **request)
    assert via_toolpair.usage is not None and as_text.usage is not None and as_repr.usage is not None
    assert via_toolpair.usage.prompt_tokens == as_text.usage.prompt_tokens
    assert as_repr.usage.prompt_tokens > as_text.usage.prompt_tokens


# Makes the model write two Hermes calls, exactly as a tool-calling model would.
TWO_CALLS_GRAMMAR = r"""root ::= paris "\n" oslo
paris ::= "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
oslo ::= "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"
"""
WEATHER = {"Paris": "18C sun", "Oslo": "-3C snow"}


async def test_agent_loop_against_the_real_engine(clients: tuple[AsyncOpenAI, AsyncOpenAI]) -> None:
    through, direct = clients
    tools: Any = [WEATHER_TOOL]
    messages: list[Any] = [
        {"role": "developer", "content": "Answer with the weather."},
        {"role": "user", "content": "Weather in Paris and Oslo?"},
    ]
    first: dict[str, Any] = {
        "model": "gemma",
        "tools": tools,
        "max_tokens": 80,
        "temperature": 0,
        "extra_body": {"grammar": TWO_CALLS_GRAMMAR},
    }
    same_prompt = [{"role": "system", "content": "Answer with the weather."}, messages[1]]
    raw = await direct.chat.completions.create(messages=same_prompt, **first)
    assert raw.choices[0].message.tool_calls is None  # the engine leaves the calls in the text
    assert (raw.choices[0].message.content or "").count("<tool_call>") == 2

    reply = await through.chat.completions.create(messages=messages, **first)
    choice = reply.choices[0]
    calls = choice.message.tool_calls or []
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert [(c.function.name, json.loads(c.function.arguments)["city"]) for c in calls] == [
        ("get_weather", "Paris"),
        ("get_weather", "Oslo"),
    ]
    messages.append(choice.message.model_dump(exclude_none=False, include={"role", "content", "tool_calls"}))
    for call in reversed(calls):  # results come back in the order the tools finished
        city = json.loads(call.function.arguments)["city"]
        messages.append({"role": "tool", "tool_call_id": call.id, "content": [{"type": "text", "text": WEATHER[city]}]})

    second: dict[str, Any] = {"model": "gemma", "messages": messages, "tools": tools, "max_tokens": 8, "temperature": 0}
    assert await status_of(direct, second) == 500  # null content, developer role, list content
    answer = await through.chat.completions.create(**second)
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.usage is not None

    stream = await through.chat.completions.create(**second, stream=True, stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == answer.usage.prompt_tokens  # the engine's own count
    assert 0 < chunks[-1].usage.completion_tokens <= 8


async def test_a_streamed_prompt_longer_than_the_context_is_an_error_not_an_empty_answer(
    clients: tuple[AsyncOpenAI, AsyncOpenAI],
) -> None:
    """Straight from the engine the stream is empty; through toolpair it is the engine's own 400, found on replay."""
    through, direct = clients
    request: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": "hello " * 5000}],
        "max_tokens": 4,
        "stream": True,
    }
    direct_chunks = [chunk async for chunk in await direct.chat.completions.create(**request)]
    assert direct_chunks == []  # the engine's own answer: 200 and nothing, no error
    with pytest.raises(openai.BadRequestError, match=r"context (window|length)") as refused:
        async for _ in await through.chat.completions.create(**request):
            pass
    assert refused.value.status_code == 400


async def test_control_tokens_the_model_writes_reach_the_reply_as_text(
    clients: tuple[AsyncOpenAI, AsyncOpenAI],
) -> None:
    """Call markers are control tokens in a GGUF (``<|...|>``): llama-cpp-python alone writes them as nothing.

    ``<start_of_turn>`` (token 105) is the bundled model's one control token that does not end a
    reply; the grammar makes the model write that token itself, not its characters.
    """
    through, direct = clients
    forced = {"max_tokens": 8, "temperature": 0, "extra_body": {"grammar": 'root ::= "a" <[105]> "b"'}}
    for client in (direct, through):
        reply = await client.chat.completions.create(model="m", messages=[USER], **forced)
        assert reply.choices[0].message.content == "a<start_of_turn>b"
        chunks = await client.chat.completions.create(model="m", messages=[USER], stream=True, **forced)
        assert "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices]) == "a<start_of_turn>b"
