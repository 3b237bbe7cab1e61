"""What each dialect owes its clients, found by running an API's own peer tests, as one table per item.

- Anthropic ``usage`` always carries ``cache_read_input_tokens`` and ``cache_creation_input_tokens``;
- ``messages: []`` is a 400 ``invalid_request_error`` that reaches no engine;
- an image for a model that cannot see is refused naming the client's own field path;
- ``output_tokens`` leaves out a stop sequence (non-stream) and is counted on streamed Responses;
- a reply cut by ``max_tokens`` never ends in the start of an end-of-turn marker.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from aiohttp import web

from tests.mock_engine import MockEngine, Received, chunk, completion
from tests.reliability.client import post
from tests.reliability.streams import check_error_body, frames_of
from tests.support.proxies import MakeProxy

LCP = {"engine_kind": "llama-cpp-python"}
HI = [{"role": "user", "content": "hi"}]


def _events(raw: bytes) -> list[dict[str, Any]]:
    out = []
    for _, data in frames_of(raw):
        if data != "[DONE]":
            out.append(orjson.loads(data))
    return out


def _anthropic_usage(answer: bytes, stream: bool) -> dict[str, Any]:
    if not stream:
        return dict(orjson.loads(answer)["usage"])
    events = _events(answer)
    usage = dict(events[0]["message"]["usage"])
    assert {"cache_creation_input_tokens", "cache_read_input_tokens"} <= set(usage), usage
    usage.update(next(e for e in events if e["type"] == "message_delta")["usage"])
    return usage


# --- Anthropic usage carries the cache counts ------------------------------------------------


def _usage_reply(cached: int | None) -> Any:
    usage: dict[str, Any] = {"prompt_tokens": 30, "completion_tokens": 2, "total_tokens": 32}
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        if not received.json().get("stream"):
            return web.json_response({**completion("ok"), "usage": usage})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(chunk({"content": "ok"}, "stop"))
        body = {"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [], "usage": usage}
        await response.write(b"data: " + orjson.dumps(body) + b"\n\ndata: [DONE]\n\n")
        await response.write_eof()
        return response

    return handler


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize(
    ("cached", "expected"),
    [
        (None, {"input_tokens": 30, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}),
        (20, {"input_tokens": 10, "cache_read_input_tokens": 20, "cache_creation_input_tokens": 0}),
    ],
    ids=["engine-says-nothing", "engine-reports-cached"],
)
async def test_anthropic_usage_carries_cache_counts(
    engine: MockEngine, make_proxy: MakeProxy, stream: bool, cached: int | None, expected: dict[str, int]
) -> None:
    engine.then(_usage_reply(cached))
    url = await make_proxy()
    answer = await post(url, "anthropic", {"model": "c", "max_tokens": 8, "messages": HI, "stream": stream})
    assert answer.status == 200, answer.body
    usage = _anthropic_usage(answer.body, stream)
    assert {k: usage[k] for k in expected} == expected and usage["output_tokens"] == 2


# --- messages: [] -----------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_anthropic_empty_messages_is_a_400_that_reaches_no_engine(
    engine: MockEngine, make_proxy: MakeProxy, stream: bool
) -> None:
    url = await make_proxy()
    answer = await post(url, "anthropic", {"model": "c", "max_tokens": 8, "messages": [], "stream": stream})
    assert answer.status == 400
    error = check_error_body("anthropic", answer.body)
    assert error["type"] == "invalid_request_error" and "messages" in error["message"]
    assert engine.received == []


# --- images refused by the client's own field path -----------------------------------------------

IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
ANTHROPIC_IMAGE = {
    "model": "c",
    "max_tokens": 8,
    "messages": [
        {"role": "user", "content": "look"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "x"}, IMAGE]}
            ],
        },
    ],
    "tools": [{"name": "shot", "input_schema": {"type": "object"}}],
}
RESPONSES_IMAGE = {
    "model": "m",
    "input": [
        {
            "role": "user",
            "content": [{"type": "input_text", "text": "what is it?"}, {"type": "input_image", "image_url": "data:,"}],
        }
    ],
}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize(
    ("api", "body", "path"),
    [
        ("anthropic", ANTHROPIC_IMAGE, "messages[2].content[0].content[1]"),
        ("anthropic", {"model": "c", "max_tokens": 8, "messages": [{"role": "user", "content": [IMAGE]}]},
         "messages[0].content[0]"),
        ("responses", RESPONSES_IMAGE, "input[0].content[1]"),
    ],
    ids=["anthropic-tool-result", "anthropic-user", "responses"],
)  # fmt: skip
async def test_an_unseen_image_is_refused_by_the_clients_own_field_path(
    engine: MockEngine, make_proxy: MakeProxy, api: str, body: dict[str, Any], path: str, stream: bool
) -> None:
    url = await make_proxy(**LCP)
    answer = await post(url, api, {**body, "stream": stream})
    assert answer.status == 400, answer.body
    error = check_error_body(api, answer.body)
    assert path in error["message"] and "cannot see images" in error["message"]
    if api == "responses":
        assert error["param"] == path
    assert engine.received == []


async def test_a_vision_model_gets_the_image(engine: MockEngine, make_proxy: MakeProxy) -> None:
    url = await make_proxy(**LCP, vision=True)
    answer = await post(url, "responses", RESPONSES_IMAGE)
    assert answer.status == 200, answer.body
    assert "image_url" in engine.last.body.decode()


# --- output_tokens --------------------------------------------------------------------------------


async def test_anthropic_output_tokens_leave_out_the_stop_sequence(engine: MockEngine, make_proxy: MakeProxy) -> None:
    """Non-stream with stop sequences: the engine is streamed, stopped at one, and its chunks counted."""
    engine.stream_word_count = 10
    url = await make_proxy()
    body = {"model": "c", "max_tokens": 50, "messages": HI, "stop_sequences": ["w3"]}
    answer = await post(url, "anthropic", body)
    message = orjson.loads(answer.body)
    assert message["content"][0]["text"] == "w0 w1 w2 " and message["stop_sequence"] == "w3"
    # The role chunk carries no output; w0, w1 and w2 do; the chunk that spelled the stop sequence does not.
    assert message["usage"]["output_tokens"] == 3


async def test_streamed_responses_report_output_tokens_the_engine_does_not(
    engine: MockEngine, make_proxy: MakeProxy
) -> None:
    """llama-cpp-python streams no usage: the final response's usage is counted by the engine's tokenizer."""
    engine.tokenizer = True
    engine.stream_word_count = 4
    url = await make_proxy(**LCP)
    answer = await post(url, "responses", {"model": "m", "input": "hi", "stream": True, "store": False})
    final = _events(answer.body)[-1]
    assert final["type"] == "response.completed"
    usage = final["response"]["usage"]
    assert usage["output_tokens"] == 4 and usage["input_tokens"] == 5, usage  # the mock: one token per word


# --- a reply cut by max_tokens ---------------------------------------------------------------------


def _cut_reply(text: list[str]) -> Any:
    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        if not received.json().get("stream"):
            reply = completion("".join(text))
            reply["choices"][0]["finish_reason"] = "length"
            return web.json_response(reply)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for piece in text:
            await response.write(chunk({"content": piece}))
        await response.write(chunk({}, "length") + b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    return handler


def _text_of(api: str, raw: bytes, stream: bool) -> str:
    if not stream:
        data = orjson.loads(raw)
        if api == "chat":
            return str(data["choices"][0]["message"]["content"])
        if api == "anthropic":
            return "".join(b.get("text", "") for b in data["content"])
        return "".join(p["text"] for item in data["output"] for p in item.get("content", []))
    events = _events(raw)
    if api == "chat":
        return "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
    if api == "anthropic":
        return "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
    return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")


CUT_BODIES = {
    "chat": {"model": "m", "max_tokens": 4, "messages": HI, "stream_options": {"include_usage": True}},
    "anthropic": {"model": "c", "max_tokens": 4, "messages": HI},
    "responses": {"model": "m", "input": "hi", "max_output_tokens": 16, "store": False},
}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("api", ["chat", "anthropic", "responses"])
@pytest.mark.parametrize(
    ("pieces", "expected"),
    [(["Sure", ".", "<|im"], "Sure."), (["Sure.", "<", "end_of"], "Sure."), (["a ", "<", "b"], "a <b")],
    ids=["im-end", "end-of-turn", "not-a-marker"],
)
async def test_a_reply_cut_by_max_tokens_never_ends_in_a_partial_end_marker(
    engine: MockEngine, make_proxy: MakeProxy, api: str, stream: bool, pieces: list[str], expected: str
) -> None:
    engine.tokenizer = True
    engine.then(_cut_reply(pieces))
    url = await make_proxy(**LCP)
    answer = await post(url, api, {**CUT_BODIES[api], "stream": stream})
    assert answer.status == 200, answer.body
    assert _text_of(api, answer.body, stream) == expected
