"""Regression tests for the bugs this suite found, each through the real HTTP path.

Before the fixes, each request here made toolpair answer a bare 500 (an exception
escaped a handler) or, once a stream had begun, cut the client's connection without
an in-band error. Each now gets a 4xx in its dialect, or is served.
"""

from __future__ import annotations

import asyncio
import io
import logging
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage

from engine_launcher.supervise.process import ChildSpec, EngineSupervisor
from proxy.dialects.responses.request import translate_request
from proxy.dialects.responses.stream import ResponsesStream
from proxy.engine.adapt import adapt_chat_request
from proxy.engine.kinds import engine_profile
from proxy.ops.logs import log_handler
from proxy.order import order_responses_items
from tests.mock_engine import Received, chunk, streams
from tests.reliability.client import post
from tests.reliability.conftest import Proxy, ProxyFactory
from tests.reliability.streams import check_error_body, check_stream
from tests.reliability.workload import body

# --- requests that made the llama-cpp-python adaptation raise ---------------------------------


@pytest.mark.parametrize(
    "message",
    [
        {"role": ["user"], "content": "hi"},  # adapt: `role in frozenset` on a list
        {"role": {"r": 1}, "content": None},
        {"role": "system", "content": [{"type": ["text"], "text": "hi"}]},  # adapt: a part's type as a list
        {"role": "system", "content": [{"type": {"t": 1}, "text": "hi"}]},
    ],
)
async def test_a_role_or_part_type_of_the_wrong_type_is_a_400(llama_proxy: Proxy, message: dict[str, Any]) -> None:
    answer = await post(llama_proxy.url, "chat", {"model": "m", "messages": [message]})
    assert answer.status == 400 and answer.toolpairs, answer.body
    check_error_body("chat", answer.body)
    assert llama_proxy.engine.received == []


@pytest.mark.parametrize(
    "extra",
    [
        {"tools": 5},  # adapt.refuse_custom_tools and engine_plan._function_tools iterated it
        {"tools": 5, "tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}}},
    ],
)
async def test_tools_that_are_not_a_list_do_not_break_the_adaptation(llama_proxy: Proxy, extra: dict[str, Any]) -> None:
    answer = await post(
        llama_proxy.url, "chat", {"model": "m", "messages": [{"role": "user", "content": "x"}], **extra}
    )
    assert answer.status == 200, answer.body  # the engine decides; here the mock accepts it
    assert len(llama_proxy.engine.received) == 1


# --- Responses requests -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", [["function_call"], {"t": "function_call_output"}])
async def test_an_input_item_type_that_is_a_list_or_object_is_a_400(llama_proxy: Proxy, kind: object) -> None:
    request = {"input": [{"role": "user", "content": "x"}, {"type": kind, "call_id": "a"}]}
    answer = await post(llama_proxy.url, "responses", request)
    assert answer.status == 400 and answer.toolpairs, answer.body
    check_error_body("responses", answer.body)
    # order.order_responses_items looked such a type up in a frozenset.
    items = [{"type": "function_call", "call_id": "a"}, {"type": kind}]
    assert order_responses_items(items)[0] is items


async def test_a_reasoning_summary_part_without_text_is_skipped(llama_proxy: Proxy) -> None:
    reasoning = {"type": "reasoning", "summary": [{"type": "summary_text"}]}
    answer = await post(llama_proxy.url, "responses", {"input": [{"role": "user", "content": "x"}, reasoning]})
    assert answer.status == 200, answer.body
    assert answer.json()["status"] == "completed"


# --- engine replies of the wrong shape, mid-stream ------------------------------------------


def _stream_of(*chunks: bytes) -> Any:
    return streams(*chunks, b"data: [DONE]\n\n")


async def test_usage_of_the_wrong_shape_ends_a_responses_stream_normally(llama_proxy: Proxy) -> None:
    usage = {"prompt_tokens": "5", "completion_tokens": [1], "prompt_tokens_details": ["x"], "total_tokens": {}}
    head = b'data: {"object":"chat.completion.chunk","choices":[],"usage":' + orjson.dumps(usage) + b"}\n\n"
    llama_proxy.engine.then(_stream_of(chunk({"content": "hi"}), head, chunk({}, "stop")))
    answer = await post(llama_proxy.url, "responses", body("responses"))
    stream = check_stream("responses", answer.body)
    assert stream.outcome == "complete" and stream.text == "hi"
    assert stream.events[-1][1]["response"]["usage"]["total_tokens"] == 0


async def test_a_tool_call_index_that_is_a_list_is_an_anthropic_error_event(llama_proxy: Proxy) -> None:
    bad = chunk({"tool_calls": [{"index": [0], "id": "c", "function": {"name": "read", "arguments": "{}"}}]})
    llama_proxy.engine.then(_stream_of(chunk({"content": "hi"}), bad))
    answer = await post(llama_proxy.url, "anthropic", body("anthropic"))
    stream = check_stream("anthropic", answer.body)
    assert stream.outcome == "error" and "index" in (stream.error or {})["message"]


async def test_a_choice_index_that_is_a_list_goes_through_the_chat_extractor_untouched(llama_proxy: Proxy) -> None:
    odd = b'data: {"object":"chat.completion.chunk","choices":[{"index":[0],"delta":{"content":"x"}}]}\n\n'
    llama_proxy.engine.then(_stream_of(chunk({"content": "hi"}), odd, chunk({}, "stop")))
    answer = await post(llama_proxy.url, "chat", body("chat"))
    stream = check_stream("chat", answer.body)
    assert stream.outcome == "complete"
    assert [c["choices"][0]["index"] for _, c in stream.events if c["choices"]][-2] == [0]


def test_the_pure_pieces_directly() -> None:
    profile = engine_profile("llama-cpp-python")
    assert adapt_chat_request({"messages": [], "tools": 5}, profile)[1] == ()
    plan = translate_request({"input": "x"})
    stream = ResponsesStream(plan, "resp_1", 0)
    stream.start()
    stream.feed({"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": None}})
    assert stream.finish()[-1]["response"]["usage"]["total_tokens"] == 2


# --- an Anthropic stream whose engine went silent -----------------------------------------------


async def _silent(request: web.Request, received: Received) -> web.StreamResponse:
    await asyncio.sleep(3600)
    raise AssertionError("unreachable")  # pragma: no cover


@pytest.mark.parametrize("stream", [True, False])
async def test_an_engine_that_times_out_is_not_asked_again(proxy_factory: ProxyFactory, stream: bool) -> None:
    """A timeout before the first chunk sent a one-token probe to the silent engine, doubling the wait."""
    async with proxy_factory(engine_kind="llama-cpp-python", upstream_read_timeout=1.0) as proxy:
        proxy.engine.then(_silent).then(_silent)
        request = body("anthropic", stream=stream)
        request["stop_sequences"] = ["never"]  # a non-stream request with stop sequences is streamed from the engine
        answer = await post(proxy.url, "anthropic", request)
        assert answer.status == 504 and answer.toolpairs, answer.body
        check_error_body("anthropic", answer.body)
        assert answer.seconds < 1.9
        assert len(proxy.engine.received) == 1


# --- logs and headers that carried client text ------------------------------------------------


def test_a_request_that_is_not_http_is_one_info_line_without_a_traceback() -> None:
    stream = io.StringIO()
    handler = log_handler("text", stream)
    logger = logging.getLogger("aiohttp.server")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        try:
            raise BadHttpMessage("Duplicate Content-Length")
        except BadHttpMessage:
            logger.exception("Error handling request from 127.0.0.1")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and " INFO aiohttp.server: refused a request that is not valid HTTP" in lines[0], lines


def test_a_text_log_line_cannot_be_split_by_client_text() -> None:
    stream = io.StringIO()
    handler = log_handler("text", stream)
    record = logging.LogRecord("toolpair.access", logging.INFO, __file__, 1, "GET %s 404", ("/a\r\nFAKE",), None)
    record.fields = {"path": "/a\r\nFAKE"}
    handler.handle(record)
    assert stream.getvalue().count("\n") == 1 and "/a\\r\\nFAKE" in stream.getvalue()


async def test_a_hosted_tool_type_never_reaches_a_response_header_as_it_is(llama_proxy: Proxy) -> None:
    tools = [{"type": "web_search\r\nSet-Cookie: a=1"}, {"type": "x" * 5000}, *({"type": f"t{n}"} for n in range(500))]
    answer = await post(llama_proxy.url, "responses", {"input": "hi", "tools": tools})
    assert answer.status == 200, answer.body  # the engine's work reached the client (it was cut off before)
    header = answer.headers["X-Toolpair-Dropped-Tools"]
    assert header.startswith("(invalid),t0,t1,") and header.endswith(",...") and len(header) <= 1024
    assert "Set-Cookie" not in answer.headers


# --- the managed engine's report of a failed request ---------------------------------------------

REPORT = [
    'INFO:     127.0.0.1:1 - "POST /extras/tokenize/count HTTP/1.1" 200 OK',
    "Exception: 1 validation errors:",
    "  {'type': 'missing', 'loc': ('body', 'messages', 0), 'input': {'role': 'function', 'content': 'SECRET'}}",
    "Traceback (most recent call last):",
    '  File "llama_cpp/server/errors.py", line 173, in custom_route_handler',
    "fastapi.exceptions.RequestValidationError: 1 validation errors:",
    "  {'type': 'missing', 'loc': ('body', 'messages', 0), 'input': {'role': 'function', 'content': 'SECRET'}}",
    'INFO:     127.0.0.1:2 - "POST /v1/chat/completions HTTP/1.1" 500 Internal Server Error',
    "llama_perf_context_print: load time = 1 ms",
]


@pytest.mark.parametrize("quote_requests", [False, True])
def test_the_supervisor_leaves_the_engines_failed_request_report_out_of_the_log(
    caplog: pytest.LogCaptureFixture, quote_requests: bool
) -> None:
    """llama-cpp-python's report of a request it failed quotes the request; toolpair relayed it to its log.

    The engine's output is logged at debug level (the error lines at warning): capture all of it.
    """
    supervisor = EngineSupervisor(ChildSpec(["true"], "http://127.0.0.1:1/"), quote_requests=quote_requests)
    with caplog.at_level(logging.DEBUG, logger="toolpair.engine"):
        for line in REPORT:
            supervisor._log_line(line.encode())
    logged = [record.getMessage() for record in caplog.records]
    assert ("SECRET" in "\n".join(logged)) is quote_requests
    assert ("SECRET" in "\n".join(supervisor.recent_log(50))) is quote_requests  # crash reports quote these
    assert logged[0].endswith("200 OK") and logged[-1].endswith("load time = 1 ms")  # the rest is relayed
    assert logged[-2].endswith("500 Internal Server Error")
    if not quote_requests:
        assert len(logged) == 4 and "report of a failed request is left out" in logged[1]
