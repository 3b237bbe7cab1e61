"""/v1/responses through the real HTTP path: openai SDK -> toolpair -> mock chat engine."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from aiohttp import web
from openai import AsyncOpenAI

from proxy.config import Settings
from tests.conftest import Stack
from tests.mock_engine import MockEngine, Received, breaks_off, chunk, completion, streams
from tests.support.http import leave_mid_stream, send_and_read
from tests.support.proxies import MakeProxy, proxy_app
from tests.support.responses_events import failed_response

pytestmark = pytest.mark.asyncio

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
PATCH = {"type": "custom", "name": "apply_patch", "description": "Apply a patch to files."}


def client(url: str, key: str = "sk-test") -> AsyncOpenAI:
    return AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0)


def call(index: int, call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def stream_reply(*deltas: dict[str, Any], finish: str = "stop", usage: bool = True) -> Any:
    """A mock engine handler that streams ``deltas`` as chat chunks, then a usage chunk."""

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(chunk({"role": "assistant", "content": ""}))
        for delta in deltas:
            await response.write(chunk(delta))
        await response.write(chunk({}, finish))
        if usage:
            tail = {
                "id": "x",
                "object": "chat.completion.chunk",
                "choices": [],
                "usage": {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27},
            }
            await response.write(b"data: " + orjson.dumps(tail) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    return handler


def two_weather_calls_streamed() -> Any:
    return stream_reply(
        {"tool_calls": [call(0, "call_paris", "get_weather", "")]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Paris"}'}}]},
        {"tool_calls": [call(1, "call_oslo", "get_weather", '{"city": "Oslo"}')]},
        finish="tool_calls",
    )


def two_weather_calls() -> dict[str, Any]:
    message_calls = [
        {"id": "call_paris", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_oslo", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
    ]
    reply = completion(None, tool_calls=message_calls)
    reply["choices"][0]["finish_reason"] = "tool_calls"
    return reply


def tool_ids(received: Received) -> list[Any]:
    return [m.get("tool_call_id") for m in received.json()["messages"] if m["role"] == "tool"]


async def post(url: str, body: Any, path: str = "/v1/responses") -> tuple[int, Any, Any]:
    return await send_and_read(url, body, path)


def sse_events(raw: bytes) -> list[dict[str, Any]]:
    events = []
    for frame in raw.split(b"\n\n"):
        lines = frame.split(b"\n")
        if len(lines) == 2 and lines[1].startswith(b"data: "):
            event = orjson.loads(lines[1][len(b"data: ") :])
            assert lines[0] == b"event: " + event["type"].encode()
            events.append(event)
    return events


# --- the SDK's three ways in -------------------------------------------------------------------


async def test_sdk_create_non_stream(stack: Stack) -> None:
    async with client(stack.url) as sdk:
        response = await sdk.responses.create(model="m", instructions="Be brief.", input="Hi", max_output_tokens=30)
    assert response.output_text == "ok" and response.status == "completed"
    assert response.id.startswith("resp_") and response.model == "m"
    assert response.usage is not None and response.usage.input_tokens == 5 and response.usage.output_tokens == 1
    sent = stack.engine.last
    assert sent.path == "/v1/chat/completions"
    assert sent.json() == {
        "model": "m",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "max_tokens": 30,
        "stream": False,
    }
    assert sent.headers["Authorization"] == "Bearer sk-test"


async def test_sdk_create_stream(stack: Stack) -> None:
    async with client(stack.url) as sdk:
        stream = await sdk.responses.create(model="m", input="Hi", stream=True)
        events = [event async for event in stream]
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "w0 w1 w2 "
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == "w0 w1 w2 " and final.status == "completed"
    assert stack.engine.last.json()["stream"] is True
    assert stack.engine.last.json()["stream_options"] == {"include_usage": True}


async def test_sdk_stream_helper_text_and_final_response(stack: Stack) -> None:
    stack.engine.then(stream_reply({"reasoning_content": "Hmm."}, {"content": "Hello "}, {"content": "there."}))
    async with client(stack.url) as sdk, sdk.responses.stream(model="m", input="Hi") as stream:
        texts = [e.delta async for e in stream if e.type == "response.output_text.delta"]
        final = await stream.get_final_response()
    assert texts == ["Hello ", "there."]
    assert final.output_text == "Hello there."
    reasoning = final.output[0]
    assert reasoning.type == "reasoning" and reasoning.content is not None and reasoning.content[0].text == "Hmm."
    assert final.usage is not None and final.usage.total_tokens == 27


# --- parallel round trips: reversed outputs reach the engine in call order -----------------------


async def test_parallel_round_trip_stream_helper_with_outputs_sent_back_reversed(stack: Stack) -> None:
    stack.engine.then(two_weather_calls_streamed())
    history: list[Any] = [{"role": "user", "content": "Weather in Paris and Oslo?"}]
    async with client(stack.url) as sdk:
        async with sdk.responses.stream(model="m", input=history, tools=[WEATHER]) as stream:
            first = await stream.get_final_response()
        calls = [item for item in first.output if item.type == "function_call"]
        assert [(c.call_id, json.loads(c.arguments)["city"]) for c in calls] == [
            ("call_paris", "Paris"),
            ("call_oslo", "Oslo"),
        ]
        outputs = [
            {"type": "function_call_output", "call_id": c.call_id, "output": f"{c.call_id}: fine"} for c in calls
        ]
        history += [item.model_dump(exclude_none=True) for item in first.output]
        async with sdk.responses.stream(model="m", input=[*history, *reversed(outputs)], tools=[WEATHER]) as stream:
            second = await stream.get_final_response()
    assert second.output_text == "w0 w1 w2 "
    sent = stack.engine.last.json()["messages"]
    assert [c["id"] for c in sent[1]["tool_calls"]] == ["call_paris", "call_oslo"]
    assert tool_ids(stack.engine.last) == ["call_paris", "call_oslo"]
    assert sent[2]["content"] == "call_paris: fine"


async def test_parallel_round_trip_non_stream(stack: Stack) -> None:
    stack.engine.reply_json(two_weather_calls())
    question: list[Any] = [{"role": "user", "content": "Weather in Paris and Oslo?"}]
    async with client(stack.url) as sdk:
        first = await sdk.responses.create(model="m", input=question, tools=[WEATHER], store=False)
        calls = [item for item in first.output if item.type == "function_call"]
        assert [c.call_id for c in calls] == ["call_paris", "call_oslo"] and all(c.status == "completed" for c in calls)
        outputs = [{"type": "function_call_output", "call_id": c.call_id, "output": c.call_id} for c in reversed(calls)]
        again = [*question, *[c.model_dump(exclude_none=True) for c in calls], *outputs]
        second = await sdk.responses.create(model="m", input=again, tools=[WEATHER], store=False)
    assert second.output_text == "ok"
    assert tool_ids(stack.engine.last) == ["call_paris", "call_oslo"]


async def test_custom_tool_round_trip(stack: Stack) -> None:
    patch = "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch"
    stack.engine.then(
        stream_reply(
            {"tool_calls": [call(0, "call_p", "apply_patch", json.dumps({"input": patch}))]}, finish="tool_calls"
        )
    )
    async with client(stack.url) as sdk:
        async with sdk.responses.stream(model="m", input="Add a.txt", tools=[PATCH, WEATHER]) as stream:
            first = await stream.get_final_response()
        offered = {t["function"]["name"]: t["function"] for t in stack.engine.last.json()["tools"]}
        assert offered["apply_patch"]["parameters"]["required"] == ["input"]
        (item,) = first.output
        assert item.type == "custom_tool_call" and item.input == patch and item.call_id == "call_p"
        back = [
            {"role": "user", "content": "Add a.txt"},
            item.model_dump(exclude_none=True),
            {"type": "custom_tool_call_output", "call_id": "call_p", "output": "Done!"},
        ]
        second = await sdk.responses.create(model="m", input=back, tools=[PATCH, WEATHER])
    assert second.output_text == "ok"
    sent = stack.engine.last.json()["messages"]
    assert json.loads(sent[1]["tool_calls"][0]["function"]["arguments"]) == {"input": patch}
    assert sent[2] == {"role": "tool", "tool_call_id": "call_p", "content": "Done!"}


# --- previous_response_id and the store ------------------------------------------------------


async def test_previous_response_id_continues_with_reversed_outputs(stack: Stack) -> None:
    stack.engine.reply_json(two_weather_calls())
    async with client(stack.url) as sdk:
        first = await sdk.responses.create(model="m", instructions="Sys.", input="Weather?", tools=[WEATHER])
        outputs = [
            {"type": "function_call_output", "call_id": "call_oslo", "output": "-3C"},
            {"type": "function_call_output", "call_id": "call_paris", "output": "18C"},
        ]
        async with sdk.responses.stream(model="m", previous_response_id=first.id, input=outputs) as stream:
            second = await stream.get_final_response()
        third = await sdk.responses.create(model="m", previous_response_id=second.id, input="Thanks!")
        fetched = await sdk.responses.retrieve(third.id)
    messages = stack.engine.last.json()["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "assistant", "user"]
    assert tool_ids(stack.engine.last) == ["call_paris", "call_oslo"]
    assert messages[4]["content"] == "w0 w1 w2 " and messages[5]["content"] == "Thanks!"
    assert second.previous_response_id == first.id
    assert fetched.id == third.id and fetched.output_text == "ok"


async def test_unknown_or_unstored_previous_response_is_a_404(stack: Stack) -> None:
    async with client(stack.url) as sdk:
        kept_out = await sdk.responses.create(model="m", input="Hi", store=False)
        for missing in ("resp_nope", kept_out.id):
            with pytest.raises(openai.NotFoundError) as caught:
                await sdk.responses.create(model="m", previous_response_id=missing, input="more")
            error = caught.value.body
            assert isinstance(error, dict)
            assert error["code"] == "previous_response_not_found" and error["param"] == "previous_response_id"
            assert missing in error["message"] and error["source"] == "toolpair"
        with pytest.raises(openai.NotFoundError):
            await sdk.responses.retrieve(kept_out.id)
    assert len(stack.engine.received) == 1


async def test_delete_forgets_a_stored_response(stack: Stack) -> None:
    async with client(stack.url) as sdk:
        first = await sdk.responses.create(model="m", input="Hi")
        await sdk.responses.delete(first.id)
        with pytest.raises(openai.NotFoundError):
            await sdk.responses.create(model="m", previous_response_id=first.id, input="more")
        with pytest.raises(openai.NotFoundError):
            await sdk.responses.delete(first.id)


async def test_store_is_bounded(engine: MockEngine, make_proxy: MakeProxy) -> None:
    async with make_proxy.running(responses_store_max_entries=2) as (url, _), client(url) as sdk:
        ids = [(await sdk.responses.create(model="m", input=f"n{i}")).id for i in range(3)]
        with pytest.raises(openai.NotFoundError):
            await sdk.responses.retrieve(ids[0])
        assert (await sdk.responses.retrieve(ids[2])).id == ids[2]


# --- Codex CLI traffic -----------------------------------------------------------------------


async def test_codex_request_streams_through(stack: Stack) -> None:
    raw = (FIXTURES / "codex_0_169_request.json").read_bytes()
    stack.engine.then(
        stream_reply(
            {"content": "Both done."}, {"tool_calls": [call(0, "call_x", "multi_agent_v1__list_agents", "{}")]}
        )
    )
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            stack.url + "/v1/responses",
            data=raw,
            headers={
                "Authorization": "Bearer codex-key",
                "Accept": "text/event-stream",
                "Content-Type": "application/json",
            },
        ) as response,
    ):
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        assert response.headers["X-Toolpair-Dropped-Tools"] == "web_search"
        events = sse_events(await response.read())
    assert [e["type"] for e in events][:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    final = events[-1]
    assert final["type"] == "response.completed"
    message, listed = final["response"]["output"]
    assert message["content"][0]["text"] == "Both done."
    assert (listed["name"], listed["namespace"], listed["call_id"]) == ("list_agents", "multi_agent_v1", "call_x")
    assert final["response"]["store"] is False
    sent = stack.engine.last
    assert sent.headers["Authorization"] == "Bearer codex-key"
    body = sent.json()
    assert [m["role"] for m in body["messages"]] == ["system", "user", "user", "assistant", "tool", "tool"]
    assert tool_ids(sent) == ["call_date", "call_uname"]
    assert len(body["tools"]) == 14 and body["parallel_tool_calls"] is True and body["tool_choice"] == "auto"
    for dropped in ("prompt_cache_key", "client_metadata", "include", "store", "reasoning", "input"):
        assert dropped not in body


async def test_hosted_tools_are_logged_once_and_named_on_every_response(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    body = {"input": "x", "tools": [WEATHER, {"type": "web_search"}, {"type": "code_interpreter", "container": "auto"}]}
    with caplog.at_level(logging.INFO, logger="toolpair"):
        headers = [(await post(stack.url, body))[2] for _ in range(2)]
    assert [h["X-Toolpair-Dropped-Tools"] for h in headers] == ["web_search,code_interpreter"] * 2
    logged = [r.getMessage() for r in caplog.records if "hosted tools" in r.getMessage()]
    assert len(logged) == 1 and "web_search, code_interpreter" in logged[0]
    assert [t["function"]["name"] for t in stack.engine.last.json()["tools"]] == ["get_weather"]


async def test_codex_request_with_reversed_outputs_is_ordered(stack: Stack) -> None:
    data = json.loads((FIXTURES / "codex_0_169_request.json").read_text())
    data["input"][-2:] = reversed(data["input"][-2:])
    status, raw, _ = await post(stack.url, data)
    assert status == 200 and sse_events(raw)[-1]["type"] == "response.completed"
    assert tool_ids(stack.engine.last) == ["call_date", "call_uname"]
    assert stack.engine.last.json()["messages"][4]["content"] == "Sun Nov 29 18:54:29 UTC 2026"


# --- failures --------------------------------------------------------------------------------

BAD: list[tuple[bytes, int, str, str | None]] = [
    (b"{not json", 400, "not valid JSON", None),
    (b"[1]", 400, "must be a JSON object", None),
    (b'{"model": "m"}', 400, "nothing to respond to", "input"),
    (b'{"model": "m", "input": 3}', 400, "must be a string or a list", "input"),
    (b'{"input": [{"type": "item_reference", "id": "msg_1"}]}', 400, "'item_reference' is not", "input[0].type"),
    (b'{"input": "x", "tools": [{"type": "function"}]}', 400, "nonempty string", "tools[0].name"),
    (b'{"input": "x", "tool_choice": {"type": "function", "name": "f"}}', 400, "no tool", "tool_choice.name"),
    (b'{"input": "x", "max_output_tokens": -1}', 400, "positive integer", "max_output_tokens"),
    (b'{"input": "x", "background": true}', 400, "not supported", "background"),
    (b'{"input": "x", "previous_response_id": "resp_gone"}', 404, "not found", "previous_response_id"),
]  # fmt: skip


@pytest.mark.parametrize(("raw", "status", "message", "param"), BAD, ids=[b[2] for b in BAD])
async def test_bad_requests_get_openai_shaped_errors(
    stack: Stack, raw: bytes, status: int, message: str, param: str | None
) -> None:
    got, reply, headers = await post(stack.url, raw)
    assert got == status
    assert set(reply) == {"error"}
    error = reply["error"]
    assert set(error) == {"message", "type", "param", "code", "source"}
    assert error["type"] == "invalid_request_error" and message in error["message"] and error["param"] == param
    assert headers["X-Toolpair-Error"] == error["code"]
    assert stack.engine.received == []


async def test_body_over_the_limit_is_a_413(engine: MockEngine, make_proxy: MakeProxy) -> None:
    async with make_proxy.running(max_body_bytes=100) as (url, _):
        status, reply, _ = await post(url, {"input": "x" * 200})
    assert status == 413 and reply["error"]["code"] == "body_too_large"


@pytest.mark.parametrize("stream", [False, True])
async def test_engine_refusal_keeps_its_status_in_openai_shape(stack: Stack, stream: bool) -> None:
    stack.engine.reply_json({"error": {"message": "context window exceeded"}}, status=400)
    async with client(stack.url) as sdk:
        with pytest.raises(openai.BadRequestError) as caught:
            if stream:
                async with sdk.responses.stream(model="m", input="Hi") as events:
                    await events.get_final_response()
            else:
                await sdk.responses.create(model="m", input="Hi")
    assert caught.value.status_code == 400
    assert isinstance(caught.value.body, dict) and caught.value.body["message"] == "context window exceeded"


async def test_engine_garbage_is_a_502(stack: Stack) -> None:
    async def garbage(request: web.Request, received: Received) -> web.StreamResponse:
        return web.Response(body=b"<html>oops", content_type="text/html")

    stack.engine.then(garbage)
    status, reply, _ = await post(stack.url, {"input": "x"})
    assert status == 502 and "invalid JSON" in reply["error"]["message"]


async def test_engine_breaking_mid_stream_ends_with_response_failed(stack: Stack) -> None:
    stack.engine.then(breaks_off(chunk({"content": "partial"}) + b'data: {"half": '))
    status, raw, _ = await post(stack.url, {"input": "x", "stream": True})
    assert status == 200
    events = sse_events(raw)
    failed = failed_response(events)
    assert stack.engine.url in failed["error"]["message"]
    assert failed["output"][0]["content"][0]["text"] == "partial"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


async def test_incomplete_stream_reaches_the_sdk_as_response_incomplete(stack: Stack) -> None:
    stack.engine.then(stream_reply({"content": "cut"}, finish="length"))
    async with client(stack.url) as sdk:
        stream = await sdk.responses.create(model="m", input="Hi", stream=True, max_output_tokens=1)
        events = [event async for event in stream]
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details is not None  # type: ignore[union-attr]
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"  # type: ignore[union-attr]


async def test_client_leaving_mid_stream_stops_the_engine(stack: Stack) -> None:
    stack.engine.stream_word_count = 1000
    stack.engine.stream_delay = 0.01
    await leave_mid_stream(
        stack.url, "/v1/responses", b"output_text.delta", data=orjson.dumps({"input": "x", "stream": True})
    )
    await stack.engine.wait_cancelled()
    assert len(stack.engine.cancelled) == 1


# --- native mode -------------------------------------------------------------------------------


@pytest.fixture
async def native(engine: MockEngine, make_proxy: MakeProxy) -> AsyncIterator[Stack]:
    settings = Settings(upstream=engine.url, responses_mode="native")
    yield Stack(engine, await make_proxy(settings=settings), settings)


def fc(call_id: str) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": "f", "arguments": "{}"}


def fco(call_id: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": call_id}


async def test_native_mode_forwards_ordered_and_relays_the_engine_stream(native: Stack) -> None:
    native.engine.then(streams(b'event: response.created\ndata: {"type":"response.created"}\n\n'))
    body = {
        "model": "m",
        "stream": True,
        "input": [{"role": "user", "content": "q"}, fc("a"), fc("b"), fco("b"), fco("a")],
    }
    status, raw, _ = await post(native.url, body)
    assert status == 200 and raw == b'event: response.created\ndata: {"type":"response.created"}\n\n'
    assert native.engine.last.path == "/v1/responses"
    assert [i.get("call_id") for i in native.engine.last.json()["input"]] == [None, "a", "b", "a", "b"]


async def test_native_mode_keeps_client_bytes_when_nothing_moves(native: Stack) -> None:
    raw = b'{"input": [ {"type":"function_call","call_id":"a","name":"f","arguments":"{}"} ],  "x": 1}'
    status, _, _ = await post(native.url, raw)
    assert status == 200 and native.engine.last.body == raw
    status, reply, _ = await post(native.url, b"nope")
    assert status == 400 and "not valid JSON" in reply["error"]["message"]


async def test_native_mode_engine_breaking_mid_stream_ends_with_an_error_event(native: Stack) -> None:
    breaks = breaks_off(b'event: response.created\ndata: {"type":"response.created","sequence_number":0}\n\nda')
    native.engine.then(breaks)
    status, raw, _ = await post(native.url, {"model": "m", "input": "x", "stream": True})
    assert status == 200
    created, error = sse_events(raw)
    assert created["type"] == "response.created"
    assert error["type"] == "error" and error["code"] == "upstream_unavailable"
    assert error["error"]["source"] == "toolpair" and native.engine.url in error["message"]
    native.engine.then(breaks)
    async with client(native.url) as sdk:
        with pytest.raises(openai.APIError, match="broke off"):
            stream = await sdk.responses.create(model="m", input="x", stream=True)
            async for _ in stream:
                pass


async def test_responses_mode_setting_is_validated() -> None:
    from proxy.config import ConfigError

    with pytest.raises(ConfigError, match="responses_mode"):
        proxy_app(Settings(upstream="http://127.0.0.1:9", responses_mode="sometimes"))


async def test_cli_responses_mode_option() -> None:
    from proxy.cli import build_parser
    from proxy.cli.common import command_settings

    args = build_parser().parse_args(["proxy", "--upstream", "http://e", "--responses-mode", "native"])
    assert command_settings(args, "upstream", "responses_mode").responses_mode == "native"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["proxy", "--responses-mode", "sometimes"])
