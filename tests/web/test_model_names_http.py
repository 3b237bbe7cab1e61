"""Model names through the real HTTP path: the engine gets the mapped name, the client sees its own.

toolpair in front of the mock engine, which records the bytes it got and answers under its own
name (``mock``), as llama-server answers under its model's path whatever it was asked.
"""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from proxy.config import ConfigError, Settings
from tests.mock_engine import MockEngine, Received, answers, write_stream
from tests.support.proxies import MakeProxy, proxy_app

pytestmark = pytest.mark.asyncio

ASKED = "claude-opus-4-5"
MAP = ["claude-*haiku*=small", "claude-*=mock"]
HI = [{"role": "user", "content": "Hi"}]
CHAT = {"model": ASKED, "messages": HI, "max_tokens": 8}
MESSAGES = {"model": ASKED, "max_tokens": 8, "messages": HI}
RESPONSES = {"model": ASKED, "input": "Hi", "max_output_tokens": 8}
PATHS = {"/v1/chat/completions": CHAT, "/v1/messages": MESSAGES, "/v1/responses": RESPONSES}


async def post(url: str, body: Any) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session, session.post(url, data=orjson.dumps(body)) as response:
        return response.status, await response.read()


def events(raw: bytes) -> list[Any]:
    """The JSON of every ``data:`` line of an event stream ([DONE] left out)."""
    found = []
    for frame in raw.split(b"\n\n"):
        for line in frame.split(b"\n"):
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                found.append(orjson.loads(line[6:]))
    return found


def names(value: Any) -> list[str]:
    """Every ``model`` member, at any depth (Anthropic's message_start and Responses events nest it)."""
    if isinstance(value, dict):
        own = [value["model"]] if isinstance(value.get("model"), str) else []
        return own + [name for v in value.values() for name in names(v)]
    if isinstance(value, list):
        return [name for v in value for name in names(v)]
    return []


def sent_model(received: Received) -> Any:
    return received.json().get("model")


def _event(kind: str | None, data: Any) -> bytes:
    head = f"event: {kind}\n".encode() if kind else b""
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


async def native_engine(request: web.Request, received: Received) -> web.StreamResponse:
    """llama-server's own /v1/messages and /v1/responses, as it answers them: under its own model name."""
    stream = received.json().get("stream") is True
    if request.path == "/v1/messages":
        message = {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "mock",
            "stop_reason": "end_turn",
            "content": [{"type": "text", "text": 'says "model": "x"'}],
            "usage": {},
        }
        if not stream:
            return web.json_response(message)
        # the message_start split over two writes, inside its "model" member: the relay cuts whole frames
        start = _event("message_start", {"type": "message_start", "message": {**message, "content": []}})
        cut = start.index(b'"mock"') + 3
        return await write_stream(request, start[:cut], start[cut:], _event("message_stop", {"type": "message_stop"}))
    response = {"id": "resp_1", "object": "response", "model": "mock", "status": "completed", "output": []}
    if not stream:
        return web.json_response(response)
    return await write_stream(
        request,
        _event("response.created", {"type": "response.created", "response": {**response, "status": "in_progress"}}),
        _event("response.completed", {"type": "response.completed", "response": response}),
    )


@pytest.mark.parametrize("stream", [False, True])
async def test_chat_sends_the_mapped_name_and_answers_under_the_asked_one(
    engine: MockEngine, make_proxy: MakeProxy, stream: bool
) -> None:
    url = await make_proxy(model_map=MAP)
    status, raw = await post(url + "/v1/chat/completions", {**CHAT, "stream": stream})
    assert status == 200, raw
    assert engine.last.json() == {**CHAT, "stream": stream, "model": "mock"}  # the name, nothing else, changed
    answer = events(raw) if stream else [orjson.loads(raw)]
    assert len(answer) >= (5 if stream else 1) and names(answer) == [ASKED] * len(answer), raw


async def test_haiku_goes_where_the_first_matching_entry_says(engine: MockEngine, make_proxy: MakeProxy) -> None:
    url = await make_proxy(model_map=MAP)
    status, raw = await post(url + "/v1/chat/completions", {**CHAT, "model": "claude-haiku-4-5-20251001"})
    assert status == 200 and sent_model(engine.last) == "small"
    assert orjson.loads(raw)["model"] == "claude-haiku-4-5-20251001"


async def test_a_name_that_does_not_change_goes_as_the_clients_bytes(engine: MockEngine, make_proxy: MakeProxy) -> None:
    url = await make_proxy(model_map=MAP)
    raw = orjson.dumps({**CHAT, "model": "gpt-5"}).replace(b",", b", ")  # spacing only the client's bytes keep
    async with aiohttp.ClientSession() as session, session.post(url + "/v1/chat/completions", data=raw) as response:
        assert response.status == 200
        assert (await response.json())["model"] == "mock"  # the engine's answer stands
    assert engine.last.body == raw


async def test_a_chunked_plain_answer_is_read_whole_to_name_the_asked_model(
    engine: MockEngine, make_proxy: MakeProxy
) -> None:
    async def chunked(request: web.Request, received: Received) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        body = orjson.dumps({"id": "c", "object": "chat.completion", "model": "mock", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]})  # fmt: skip
        cut = body.index(b'"mock"') + 2
        await response.write(body[:cut])
        await response.write(body[cut:])
        await response.write_eof()
        return response

    engine.then(chunked)
    url = await make_proxy(model_map=MAP)
    status, raw = await post(url + "/v1/chat/completions", CHAT)
    assert status == 200 and orjson.loads(raw)["model"] == ASKED, raw


@pytest.mark.parametrize("stream", [False, True])
async def test_a_rewritten_chat_reply_names_the_asked_model(
    engine: MockEngine, make_proxy: MakeProxy, stream: bool
) -> None:
    """llama-cpp-python's kind: the reply is decoded (calls lifted out of the text) and encoded again."""
    engine.then(answers('<tool_call>{"name": "f", "arguments": {}}</tool_call>'))
    url = await make_proxy(model_map=MAP, engine_kind="llama-cpp-python", tool_call_format="hermes")
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    status, raw = await post(url + "/v1/chat/completions", {**CHAT, "tools": tools, "stream": stream})
    assert status == 200, raw
    assert sent_model(engine.last) == "mock"
    answer = events(raw) if stream else [orjson.loads(raw)]
    assert names(answer) == [ASKED] * len(answer), raw
    parts = [choice.get("delta") or choice.get("message") or {} for a in answer for choice in a["choices"]]
    calls = [call for part in parts for call in part.get("tool_calls") or ()]
    assert calls and calls[0]["function"]["name"] == "f"  # the rewrite still happened


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", ["/v1/messages", "/v1/responses"])
async def test_native_routes_send_the_mapped_name_and_answer_under_the_asked_one(
    engine: MockEngine, make_proxy: MakeProxy, path: str, stream: bool
) -> None:
    engine.then(native_engine)
    url = await make_proxy(model_map=MAP, engine_kind="llama-server")
    status, raw = await post(url + path, {**PATHS[path], "stream": stream})
    assert status == 200, raw
    assert engine.last.path == path and engine.last.json() == {**PATHS[path], "stream": stream, "model": "mock"}
    answer = events(raw) if stream else [orjson.loads(raw)]
    named = {"/v1/messages": 1, "/v1/responses": 2 if stream else 1}[path]  # message_stop names none
    assert len(answer) == (2 if stream else 1) and names(answer) == [ASKED] * named, raw
    if path == "/v1/messages" and not stream:
        assert answer[0]["content"][0]["text"] == 'says "model": "x"'  # what the model wrote is left alone


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", ["/v1/messages", "/v1/responses"])
async def test_translated_routes_send_the_mapped_name_and_answer_under_the_asked_one(
    engine: MockEngine, make_proxy: MakeProxy, path: str, stream: bool
) -> None:
    url = await make_proxy(model_map=MAP, messages_mode="translate", responses_mode="translate")
    status, raw = await post(url + path, {**PATHS[path], "stream": stream})
    assert status == 200, raw
    assert engine.last.path == "/v1/chat/completions" and sent_model(engine.last) == "mock"
    answer = events(raw) if stream else [orjson.loads(raw)]
    assert names(answer) and set(names(answer)) == {ASKED}, raw


async def test_count_tokens_asks_the_native_engine_under_the_mapped_name(
    engine: MockEngine, make_proxy: MakeProxy
) -> None:
    engine.reply_json({"input_tokens": 7})
    url = await make_proxy(model_map=MAP, engine_kind="llama-server")
    status, raw = await post(url + "/v1/messages/count_tokens", {"model": ASKED, "messages": HI})
    assert status == 200 and orjson.loads(raw) == {"input_tokens": 7}
    assert engine.last.path == "/v1/messages/count_tokens" and sent_model(engine.last) == "mock"


async def test_messages_model_wins_on_its_route_and_the_answer_names_the_asked_model(
    engine: MockEngine, make_proxy: MakeProxy
) -> None:
    engine.then(native_engine)
    url = await make_proxy(model_map=MAP, messages_model="set", engine_kind="llama-server")
    status, raw = await post(url + "/v1/messages", MESSAGES)
    assert status == 200 and sent_model(engine.last) == "set"
    assert orjson.loads(raw)["model"] == ASKED


@pytest.mark.parametrize("path", list(PATHS))
async def test_without_a_map_an_engine_with_one_model_gets_it_for_names_it_does_not_know(
    engine: MockEngine, make_proxy: MakeProxy, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "toolpair")
    url = await make_proxy(find_engine=True, messages_mode="translate", responses_mode="translate")
    status, raw = await post(url + path, PATHS[path])
    assert status == 200, raw
    assert "/v1/models" in [r.path for r in engine.received[:3]]  # read where the engine is found
    assert sent_model(engine.last) == "mock"
    assert set(names(orjson.loads(raw))) == {ASKED}
    assert "  model names:    one model: mock (names the engine does not know go to it)" in caplog.messages

    raw = orjson.dumps({**CHAT, "model": "mock"})
    async with aiohttp.ClientSession() as session, session.post(url + "/v1/chat/completions", data=raw) as response:
        assert response.status == 200
    assert engine.last.body == raw  # a name it knows: the client's bytes


async def test_an_engine_with_several_models_gets_the_name_as_sent(engine: MockEngine, make_proxy: MakeProxy) -> None:
    engine.models = ["qwen3", "gemma"]
    url = await make_proxy(find_engine=True)
    raw = orjson.dumps(CHAT)
    async with aiohttp.ClientSession() as session, session.post(url + "/v1/chat/completions", data=raw) as response:
        assert response.status == 200
        assert (await response.json())["model"] == "mock"  # the engine's answer stands
    assert engine.last.body == raw


async def test_a_map_entry_that_is_not_pattern_equals_model_is_refused_at_start() -> None:
    with pytest.raises(ConfigError, match="model_map: 'claude-' is not PATTERN=MODEL"):
        proxy_app(Settings(upstream="http://127.0.0.1:9", model_map=["claude-*=q", "claude-"]))
