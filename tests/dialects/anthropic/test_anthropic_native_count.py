"""Native mode (forwarding Anthropic Messages), count_tokens in both modes, and the mode setting."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from anthropic import AsyncAnthropic

from proxy.cli import build_parser
from proxy.cli.common import command_settings
from proxy.config import ApiMode, Settings
from proxy.dialects.anthropic.request import plan_translation
from proxy.dialects.anthropic.routes import messages_mode
from proxy.engine.client import prepare_chat_body
from proxy.engine.token_count import ChatTemplate, estimate_tokens
from tests.mock_engine import MockEngine, Received
from tests.real_engine import TEMPLATE
from tests.support.http import send_and_read
from tests.support.proxies import MakeProxy

HI = [{"role": "user", "content": "Hi"}]
CALLS = {"role": "assistant", "content": [{"type": "tool_use", "id": i, "name": "Grep", "input": {}} for i in "ab"]}
REVERSED = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": i, "content": i} for i in "ba"]}
MESSAGE = {
    "id": "msg_engine",
    "type": "message",
    "role": "assistant",
    "model": "engine-model",
    "content": [{"type": "text", "text": "native answer"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 3, "output_tokens": 2},
}


@pytest.fixture
def proxy(make_proxy: MakeProxy) -> MakeProxy:
    """Start toolpair in front of the mock engine with the given settings; returns its URL."""
    return make_proxy


async def post(url: str, body: Any, path: str = "/v1/messages", **kw: Any) -> tuple[int, Any, Any]:
    return await send_and_read(url, body, path, **kw)


CLIENT_HEADERS = {
    "x-api-key": "sk-ant-secret",
    "Authorization": "Bearer secret",
    "anthropic-version": "2023-06-01",
    "anthropic-beta": "fine-grained-tool-streaming-2025-05-14",
}


# --- native mode


async def test_native_forwards_the_clients_bytes_and_its_credentials(engine: MockEngine, proxy: Any) -> None:
    engine.reply_json(MESSAGE)
    raw = b'{"model": "claude-x",  "max_tokens": 9, "messages": [{"role": "user", "content": "Hi"}]}'
    status, reply, _ = await post(
        await proxy(messages_mode="native"), raw, "/v1/messages?beta=true", headers=CLIENT_HEADERS
    )
    assert status == 200 and reply == MESSAGE
    seen = engine.last
    assert (seen.path, seen.query_string, seen.body) == ("/v1/messages", "beta=true", raw)
    # The engine checks the client's key itself (a key-protected llama-server), as it would direct.
    assert seen.headers["x-api-key"] == "sk-ant-secret" and seen.headers["Authorization"] == "Bearer secret"
    assert seen.headers["anthropic-version"] == "2023-06-01"
    assert seen.headers["anthropic-beta"] == "fine-grained-tool-streaming-2025-05-14"


async def test_native_reorders_results_and_maps_the_model(engine: MockEngine, proxy: Any) -> None:
    engine.reply_json(MESSAGE)
    url = await proxy(messages_mode="native", messages_model="local")
    await post(url, {"model": "claude-x", "max_tokens": 9, "messages": [*HI, CALLS, REVERSED]})
    sent = engine.last.json()
    assert sent["model"] == "local"
    assert [b["tool_use_id"] for b in sent["messages"][2]["content"]] == ["a", "b"]


async def test_native_stream_is_relayed_to_the_sdk(engine: MockEngine, proxy: Any) -> None:
    frames = [
        {"type": "message_start", "message": {**MESSAGE, "content": [], "stop_reason": None}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "native"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
         "usage": {"output_tokens": 1}},
        {"type": "message_stop"},
    ]  # fmt: skip

    async def anthropic_stream(request: web.Request, received: Received) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for frame in frames:
            await response.write(f"event: {frame['type']}\ndata: ".encode() + orjson.dumps(frame) + b"\n\n")
        await response.write_eof()
        return response

    engine.then(anthropic_stream)
    sdk = AsyncAnthropic(base_url=await proxy(messages_mode="native"), api_key="k", max_retries=0)
    async with sdk, sdk.messages.stream(model="claude-x", max_tokens=9, messages=HI) as stream:
        final = await stream.get_final_message()
    assert final.content[0].text == "native"  # type: ignore[union-attr]
    assert engine.last.path == "/v1/messages"


async def test_native_engine_errors_are_relayed(engine: MockEngine, proxy: Any) -> None:
    error = {"type": "error", "error": {"type": "invalid_request_error", "message": "engine refused"}}
    engine.reply_json(error, status=400)
    status, reply, _ = await post(await proxy(messages_mode="native"), {"messages": HI})
    assert status == 400 and reply == error
    status, reply, _ = await post(await proxy(messages_mode="native"), b"{oops")
    assert status == 400 and reply["type"] == "error" and "not valid JSON" in reply["error"]["message"]


@pytest.mark.parametrize(
    ("status", "answer", "kind", "message"),
    [
        (400, {"error": {"code": 400, "message": "the request exceeds the available context size, try increasing it",
                         "type": "exceed_context_size_error", "n_prompt_tokens": 9000, "n_ctx": 8192}},
         "invalid_request_error", "prompt is too long: 9000 tokens > 8192 maximum"),
        (400, {"type": "error", "error": {"type": "invalid_request_error", "message":
               "request (5000 tokens) exceeds the available context size (4096 tokens), try increasing it"}},
         "invalid_request_error", "prompt is too long: 5000 tokens > 4096 maximum"),
    ],
)  # fmt: skip
async def test_native_engine_context_overflow_becomes_prompt_is_too_long(
    engine: MockEngine, proxy: Any, status: int, answer: Any, kind: str, message: str
) -> None:
    if isinstance(answer, str):

        async def text(request: web.Request, received: Received) -> web.StreamResponse:
            return web.Response(status=status, text=answer)

        engine.then(text)
    else:
        engine.reply_json(answer, status=status)
    code, reply, _ = await post(await proxy(messages_mode="native"), {"messages": HI})
    assert code == status
    assert reply["type"] == "error" and reply["error"]["type"] == kind and reply["error"]["message"] == message


@pytest.mark.parametrize(
    ("status", "answer", "content_type"),
    [
        (401, b'{"error":{"code":401,"message":"Invalid API Key","type":"authentication_error"}}', "application/json"),
        (404, b'{"detail": "Not Found"}', "application/json"),
        (500, b"plain text failure", "text/plain"),
    ],
)
async def test_native_engine_errors_other_than_an_overflow_go_out_as_the_engine_sent_them(
    engine: MockEngine, proxy: Any, status: int, answer: bytes, content_type: str
) -> None:
    async def reply(request: web.Request, received: Received) -> web.StreamResponse:
        return web.Response(status=status, body=answer, content_type=content_type, headers={"X-Engine": "e"})

    engine.then(reply)
    url = await proxy(messages_mode="native")
    async with aiohttp.ClientSession() as session, session.post(url + "/v1/messages", json={"messages": HI}) as got:
        assert got.status == status and await got.read() == answer
        assert got.headers["X-Engine"] == "e" and got.content_type == content_type  # not relabelled as toolpair's


def test_mode_setting_auto_follows_the_engine_kind_and_the_cli_overrides() -> None:
    assert messages_mode(Settings()) is ApiMode.TRANSLATE
    assert messages_mode(Settings(messages_mode="native")) is ApiMode.NATIVE
    assert messages_mode(Settings(messages_mode="auto", engine_kind="llama-server")) is ApiMode.NATIVE
    assert messages_mode(Settings(messages_mode="auto", engine_kind="llama-cpp-python")) is ApiMode.TRANSLATE
    args = build_parser().parse_args(["proxy", "--upstream", "http://e", "--messages-mode", "native"])
    assert command_settings(args, "upstream", "messages_mode").messages_mode == "native"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["proxy", "--messages-mode", "sometimes"])


# --- count_tokens


def counting_tokenizer(per: int = 3) -> Callable[[web.Request, Received], Awaitable[web.StreamResponse]]:
    """llama-cpp-python's /extras/tokenize/count, with a made-up tokenizer that adds a BOS."""

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        assert request.path == "/extras/tokenize/count"
        return web.json_response({"count": 1 + len(received.json()["input"].encode()) // per})

    return handler


REQUEST = {"model": "claude-x", "system": "Be brief.", "messages": [*HI, CALLS, REVERSED], "tools": [
    {"name": "Grep", "description": "search", "input_schema": {"type": "object"}}]}  # fmt: skip


async def test_count_tokens_renders_the_translated_request_and_asks_the_engines_tokenizer(
    engine: MockEngine, proxy: Any
) -> None:
    engine.then(counting_tokenizer()).then(counting_tokenizer()).then(counting_tokenizer())
    url = await proxy(count_tokens_template=str(TEMPLATE))
    status, reply, headers = await post(url, REQUEST, "/v1/messages/count_tokens", headers=CLIENT_HEADERS)
    prompt = ChatTemplate.from_file(TEMPLATE).render(prepare_chat_body(plan_translation(orjson.dumps(REQUEST)).chat)[0])
    assert status == 200 and headers["X-Toolpair-Token-Count"] == "exact"
    assert reply == {"input_tokens": len(prompt.encode()) // 3}  # the BOS the tokenizer adds is taken off
    assert [r.json()["input"] for r in engine.received] == ["", prompt]
    assert "<tool_response>\nb\n</tool_response>" in prompt.split("<tool_response>\na")[1]  # results in call order
    # The client's key goes to the engine's tokenizer too: a key-protected engine counts, not refuses.
    assert all(r.headers["x-api-key"] == "sk-ant-secret" for r in engine.received)
    # The empty input's count is asked once per app.
    await post(url, {"messages": HI}, "/v1/messages/count_tokens")
    assert len(engine.received) == 3


async def test_count_tokens_without_a_template_or_a_tokenizer_is_a_marked_estimate(
    engine: MockEngine, proxy: Any
) -> None:
    status, reply, headers = await post(await proxy(), REQUEST, "/v1/messages/count_tokens")
    chat = prepare_chat_body(plan_translation(orjson.dumps(REQUEST)).chat)[0]
    assert status == 200 and headers["X-Toolpair-Token-Count"] == "estimate"
    assert reply == {"input_tokens": estimate_tokens(len(orjson.dumps(chat)))}
    assert engine.received == []

    async def no_such_route(request: web.Request, received: Received) -> web.StreamResponse:
        return web.json_response({"detail": "Not Found"}, status=404)

    engine.then(no_such_route)
    url = await proxy(count_tokens_template=str(TEMPLATE))
    for _ in range(2):
        status, reply, headers = await post(url, REQUEST, "/v1/messages/count_tokens")
        assert status == 200 and headers["X-Toolpair-Token-Count"] == "estimate" and reply["input_tokens"] > 0
    assert len(engine.received) == 1  # a missing tokenizer is remembered


@pytest.mark.parametrize("raw", [b"{not json", b'{"messages": "x"}', b'{"messages": [{"role": "robot"}]}'])
async def test_count_tokens_never_answers_an_error_status(engine: MockEngine, proxy: Any, raw: bytes) -> None:
    for mode in ("translate", "native"):
        status, reply, headers = await post(await proxy(messages_mode=mode), raw, "/v1/messages/count_tokens")
        assert status == 200 and headers["X-Toolpair-Token-Count"] == "estimate"
        assert reply == {"input_tokens": estimate_tokens(len(raw))}
    status, reply, _ = await post(await proxy(max_body_bytes=100), b"x" * 400, "/v1/messages/count_tokens")
    assert status == 200 and reply == {"input_tokens": 100}


async def test_count_tokens_in_native_mode_asks_the_engine(engine: MockEngine, proxy: Any) -> None:
    engine.reply_json({"input_tokens": 1234})
    url = await proxy(messages_mode="native")
    status, reply, headers = await post(url, REQUEST, "/v1/messages/count_tokens?beta=true", headers=CLIENT_HEADERS)
    assert status == 200 and reply == {"input_tokens": 1234} and headers["X-Toolpair-Token-Count"] == "exact"
    assert engine.last.path == "/v1/messages/count_tokens" and engine.last.query_string == "beta=true"
    assert [b["tool_use_id"] for b in engine.last.json()["messages"][2]["content"]] == ["a", "b"]
    assert engine.last.headers["x-api-key"] == "sk-ant-secret"
    engine.reply_json({"error": "no such route"}, status=404)
    status, reply, headers = await post(url, REQUEST, "/v1/messages/count_tokens")
    assert status == 200 and headers["X-Toolpair-Token-Count"] == "estimate"


async def test_stream_input_usage_comes_from_the_tokenizer_when_the_engine_streams_none(
    engine: MockEngine, proxy: Any
) -> None:
    engine.then(counting_tokenizer(per=1)).then(counting_tokenizer(per=1))
    sdk = AsyncAnthropic(base_url=await proxy(count_tokens_template=str(TEMPLATE)), api_key="k", max_retries=0)
    async with sdk, sdk.messages.stream(model="c", max_tokens=9, messages=HI) as stream:
        first = await anext(aiter(stream))
        final = await stream.get_final_message()
    prompt = ChatTemplate.from_file(TEMPLATE).render({"model": "c", "messages": HI})
    assert first.type == "message_start" and first.message.usage.input_tokens == len(prompt.encode())
    assert final.usage.input_tokens == len(prompt.encode())
    assert [r.path for r in engine.received] == ["/extras/tokenize/count"] * 2 + ["/v1/chat/completions"]
