"""Hostile input: a corpus of bad requests across the three APIs, sent over bare sockets to toolpair.

toolpair runs as its own process (``python -m proxy proxy --engine-kind
llama-cpp-python``, text logs) in front of a mock engine, and every request of the
corpus goes over a raw socket, since a client library would refuse to send most of
them. Each case says what must happen:

- ``refused``: a 4xx that toolpair produces, in the route's dialect
  (``X-Toolpair-Error``, an OpenAI or Anthropic error body), and the engine never
  sees the request;
- ``http``: not HTTP that can be served (smuggling attempts, bad lengths, oversized
  lines): aiohttp's parser answers 4xx before any route runs; the engine sees nothing;
- ``served``: an odd but valid request, answered once toolpair made the odd part
  safe (a request id it replaces, a tool name it will not echo into a header);
- ``forwarded``: what toolpair passes on by design: a Chat ``tool_call_id`` that is
  not a string keeps the received order and the engine gets the client's bytes.

Every answer must come within a deadline and carry no traceback. After the whole
corpus toolpair must answer its health check, serve each API, and have written only
well-formed log lines (no line a client could forge).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from tests.mock_engine import MockEngine
from tests.reliability.figures import count, maximum, record
from tests.reliability.processes import EngineThread, Process, rss_kib, start_toolpair
from tests.reliability.rawhttp import chunked, exchange, request
from tests.reliability.streams import check_error_body, check_stream
from tests.reliability.workload import APIS, PATHS, body

LIMIT = 64 * 1024 * 1024  # toolpair's default max_body_bytes
DEADLINE = 30.0
JSON_HEADERS = (("Content-Type", "application/json"), ("anthropic-version", "2023-06-01"))
CHUNKED = ("Transfer-Encoding", "chunked")


@dataclass(frozen=True)
class Bad:
    name: str
    api: str  # the route's dialect: chat, anthropic or responses
    raw: Callable[[], bytes]  # built when the case runs: some are tens of megabytes
    expect: str  # refused, http, served, forwarded
    status: int = 400


def _post(api: str, payload: bytes, *headers: tuple[str, str], path: str | None = None) -> Callable[[], bytes]:
    return lambda: request("POST", path or PATHS[api], payload, (*JSON_HEADERS, *headers))


def _json(api: str, value: Any) -> Callable[[], bytes]:
    return _post(api, orjson.dumps(value))


def _valid(api: str, **changes: Any) -> dict[str, Any]:
    """A valid non-stream request of ``api`` with fields replaced (``...`` removes one)."""
    data = body(api, stream=False)
    for key, value in changes.items():
        if value is ...:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def _with_result_id(api: str, value: Any) -> dict[str, Any]:
    """A valid request whose first tool result names its call by ``value``."""
    data = body(api, stream=False)
    if api == "chat":
        data["messages"][3]["tool_call_id"] = value
    elif api == "anthropic":
        data["messages"][2]["content"][0]["tool_use_id"] = value
    else:
        data["input"][3]["call_id"] = value
    return data


def _million(api: str) -> bytes:
    """A million messages or input items, the last one broken (about 30 MB: under the size limit)."""
    one = b'{"role":"user","content":"x"}'
    broken = {
        "chat": b'{"role": 5, "content": "x"}',
        "anthropic": b'{"role": "robot", "content": "x"}',
        "responses": b'{"type": "no_such_item"}',
    }[api]
    key = b"input" if api == "responses" else b"messages"
    head = b'{"model":"m",' + (b'"max_tokens":4,' if api == "anthropic" else b"")
    return head + b'"' + key + b'":[' + b",".join([one] * 999_999 + [broken]) + b"]}"


def _common(api: str) -> Iterator[Bad]:
    """What every route refuses: broken encodings, broken JSON, depth, size, count."""
    field = b"input" if api == "responses" else b"messages"
    text = b'{"' + field + b'": [{"role": "user", "content": "\xff\xfe"}]}'
    deep = b"[" * 10_000 + b"]" * 10_000
    for name, payload in [
        ("invalid UTF-8 in a string", text),
        ("invalid UTF-8, bare bytes", b"\xff\xfe\xfd\xfc"),
        ("truncated JSON", b'{"' + field + b'": ['),
        ("empty body", b""),
        ("JSON null", b"null"),
        ("JSON array", b"[]"),
        ("JSON string", b'"hello"'),
        ("JSON number", b"12"),
        ("trailing garbage", b'{"' + field + b'": []} and more'),
        ("byte order mark", b'\xef\xbb\xbf{"' + field + b'": []}'),
        ("lone surrogate escape", b'{"' + field + b'": "\\ud800"}'),
        ("NaN literal", b'{"' + field + b'": [], "temperature": NaN}'),
        ("arrays nested 10,000 deep", deep),
        ("JSON nested 10,000 deep in a field", b'{"' + field + b'": ' + deep + b"}"),
    ]:
        yield Bad(f"{api}: {name}", api, _post(api, payload), "refused")
    path = PATHS[api]
    yield Bad(
        f"{api}: 1 GB Content-Length announced, 1 byte sent",
        api,
        lambda: request("POST", path, b"{", JSON_HEADERS, length=1 << 30),
        "refused",
        413,
    )
    yield Bad(
        f"{api}: a chunked body over the limit",
        api,
        lambda: (
            request("POST", path, None, (*JSON_HEADERS, ("Transfer-Encoding", "chunked"))) + chunked(b" " * (LIMIT + 1))
        ),
        "refused",
        413,
    )
    yield Bad(f"{api}: a million messages, the last one broken", api, lambda: _post(api, _million(api))(), "refused")


IMAGE = {"type": "image_url", "image_url": {"url": "data:,"}}
CHAT_BAD: list[tuple[str, dict[str, Any]]] = [
    ("messages is a string", _valid("chat", messages="hi")),
    ("messages is an object", _valid("chat", messages={"a": 1})),
    ("messages is missing", _valid("chat", messages=...)),
    ("role is a list", _valid("chat", messages=[{"role": ["user"], "content": "x"}])),
    ("role is a number", _valid("chat", messages=[{"role": 5, "content": "x"}])),
    ("role is an object", _valid("chat", messages=[{"role": {"r": 1}, "content": None}])),
    ("n is 2", _valid("chat", n=2)),
    ("n is a string", _valid("chat", n="two")),
    ("n is negative", _valid("chat", n=-1)),
    ("a part type that is a number", _valid("chat", messages=[{"role": "system", "content": [{"type": 5}]}])),
    ("an image part (the model cannot see)", _valid("chat", messages=[{"role": "user", "content": [IMAGE]}])),
    ("an input_audio part", _valid("chat", messages=[{"role": "user", "content": [{"type": "input_audio"}]}])),
    ("a custom tool", _valid("chat", tools=[{"type": "custom", "custom": {"name": "x"}}])),
    ("tool_choice custom", _valid("chat", tool_choice={"type": "custom", "custom": {"name": "x"}})),
    ("allowed_tools without a mode", _valid("chat", tool_choice={"type": "allowed_tools", "allowed_tools": {}})),
]  # fmt: skip

ANTHROPIC_BAD: list[tuple[str, dict[str, Any]]] = [
    ("messages is a string", _valid("anthropic", messages="x")),
    ("a message that is a number", _valid("anthropic", messages=[1])),
    ("role robot", _valid("anthropic", messages=[{"role": "robot", "content": "x"}])),
    ("role is a number", _valid("anthropic", messages=[{"role": 5, "content": "x"}])),
    ("content is a number", _valid("anthropic", messages=[{"role": "user", "content": 5}])),
    ("a block type that is a number", _valid("anthropic", messages=[{"role": "user", "content": [{"type": 5}]}])),
    ("tool_use_id is an object", _with_result_id("anthropic", {"a": 1})),
    ("tool_use_id is a number", _with_result_id("anthropic", 7)),
    ("tools is a string", _valid("anthropic", tools="x")),
    ("a tool name that is a number", _valid("anthropic", tools=[{"name": 5}])),
    ("tool_choice is a string", _valid("anthropic", tool_choice="auto")),
    ("tool_choice tool without a name", _valid("anthropic", tool_choice={"type": "tool"})),
    ("max_tokens is a string", _valid("anthropic", max_tokens="10")),
    ("max_tokens is 0", _valid("anthropic", max_tokens=0)),
    ("stop_sequences is a string", _valid("anthropic", stop_sequences="x")),
    ("thinking is a string", _valid("anthropic", thinking="yes")),
    ("model is a number", _valid("anthropic", model=5)),
    ("an image without a source", _valid("anthropic", messages=[{"role": "user", "content": [{"type": "image"}]}])),
    ("system is a number", _valid("anthropic", system=5)),
    ("temperature is a string", _valid("anthropic", temperature="hot")),
]

RESPONSES_BAD: list[tuple[str, dict[str, Any], int]] = [
    ("input is a number", _valid("responses", input=5), 400),
    ("an item that is a number", _valid("responses", input=[5]), 400),
    ("an item type that is an object", _valid("responses", input=[{"type": {"t": 1}}]), 400),
    ("an item type that is a list", _valid("responses", input=[{"type": ["function_call"]}]), 400),
    ("call_id is an object", _with_result_id("responses", {"a": 1}), 400),
    ("call_id is a number", _with_result_id("responses", 7), 400),
    ("call_id is empty", _with_result_id("responses", ""), 400),
    ("tools is a string", _valid("responses", tools="x"), 400),
    ("a tool type that is a number", _valid("responses", tools=[{"type": 5}]), 400),
    ("tool_choice is a number", _valid("responses", tool_choice=5), 400),
    ("tool_choice function without a name", _valid("responses", tool_choice={"type": "function"}), 400),
    ("text.format.type yaml", _valid("responses", text={"format": {"type": "yaml"}}), 400),
    ("max_output_tokens is negative", _valid("responses", max_output_tokens=-1), 400),
    ("max_output_tokens is a string", _valid("responses", max_output_tokens="5"), 400),
    ("stream is a string", _valid("responses", stream="yes"), 400),
    ("store is a string", _valid("responses", store="no"), 400),
    ("background is true", _valid("responses", background=True), 400),
    ("previous_response_id is a number", _valid("responses", previous_response_id=5), 400),
    ("previous_response_id is unknown", _valid("responses", previous_response_id="resp_nope"), 404),
    ("an input_file part", _valid("responses", input=[{"role": "user", "content": [{"type": "input_file"}]}]), 400),
    ("temperature is a string", _valid("responses", temperature="hot"), 400),
]


def _head(line: bytes, *fields: bytes, body: bytes = b"") -> bytes:
    """A request line and header lines as given, byte for byte."""
    return b"\r\n".join([line, b"Host: t", *fields]) + b"\r\n\r\n" + body


CHAT_LINE = b"POST /v1/chat/completions HTTP/1.1"
MESSAGES_LINE = b"POST /v1/messages HTTP/1.1"
PROTOCOL: list[tuple[str, bytes]] = [
    ("Content-Length with Transfer-Encoding (smuggling)",
     _head(CHAT_LINE, b"Content-Length: 5", b"Transfer-Encoding: chunked", body=b"0\r\n\r\n")),
    ("two different Content-Lengths", _head(MESSAGES_LINE, b"Content-Length: 5", b"Content-Length: 6", body=b"{}{}{}")),
    ("Content-Length -1", _head(b"POST /v1/responses HTTP/1.1", b"Content-Length: -1")),
    ("Content-Length abc", _head(CHAT_LINE, b"Content-Length: abc")),
    ("a chunk size that is not hex",
     _head(MESSAGES_LINE, b"Transfer-Encoding: chunked", body=b"zz\r\nhello\r\n0\r\n\r\n")),
    ("a method with a control character", _head(b"P\x01ST /v1/chat/completions HTTP/1.1")),
    ("a request line over 8 KiB", _head(b"GET /v1/" + b"a" * 100_000 + b" HTTP/1.1")),
    ("a header over 8 KiB", _head(b"GET /health HTTP/1.1", b"X-Big: " + b"a" * 100_000)),
    ("2,000 headers", _head(b"GET /health HTTP/1.1", *(b"X-%d: 1" % i for i in range(2000)))),
    ("a TLS handshake", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 100),
    ("HTTP/9.9", _head(b"GET /health HTTP/9.9")),
    ("a request id with a control character",
     _head(CHAT_LINE, b"X-Request-ID: a\x01b", b"Content-Length: 2", body=b"{}")),
    ("a request id folded over two lines (obs-fold)",
     _head(MESSAGES_LINE, b"X-Request-ID: a", b" b", b"Content-Length: 2", body=b"{}")),
]  # fmt: skip


def corpus() -> list[Bad]:
    cases: list[Bad] = []
    for api in APIS:
        cases += _common(api)
    cases += [Bad(f"chat: {name}", "chat", _json("chat", value), "refused") for name, value in CHAT_BAD]
    cases += [Bad(f"anthropic: {name}", "anthropic", _json("anthropic", v), "refused") for name, v in ANTHROPIC_BAD]
    cases += [
        Bad(f"responses: {name}", "responses", _json("responses", value), "refused", status)
        for name, value, status in RESPONSES_BAD
    ]
    crlf = "/v1/responses/abc%0d%0aSet-Cookie:%20a=1"
    get_crlf = Bad(
        "responses: GET an id holding CR LF", "responses", lambda: request("GET", crlf, None), "refused", 404
    )
    cases.append(get_crlf)
    cases += [Bad(f"http: {name}", "chat", lambda raw=raw: raw, "http") for name, raw in PROTOCOL]
    # Odd but valid: made safe, then served.
    for name, value in [
        ("spaces and quotes", 'a b"c'),
        ("5,000 characters", "r" * 5000),
        ("Latin-1 bytes", "caf\xe9"),
    ]:
        raw = _post("chat", orjson.dumps(_valid("chat")), ("X-Request-ID", value))
        cases.append(Bad(f"chat: request id with {name}", "chat", raw, "served", 200))
    hosted = [
        ("a hosted tool type with CR LF", [{"type": "web_search\r\nSet-Cookie: a=1"}]),
        ("a hosted tool type of 20,000 characters", [{"type": "w" * 20_000}]),
        ("100,000 distinct hosted tool types", [{"type": f"hosted_{n}"} for n in range(100_000)]),
    ]
    for name, tools in hosted:
        cases.append(
            Bad(f"responses: {name}", "responses", _json("responses", _valid("responses", tools=tools)), "served", 200)
        )
    elsewhere = "http://203.0.113.9:9/v1/chat/completions"  # absolute form: must still go to the engine
    absolute = lambda: request("POST", elsewhere, orjson.dumps(_valid("chat")), JSON_HEADERS)  # noqa: E731
    cases.append(Bad("chat: an absolute URL naming another host", "chat", absolute, "served", 200))
    # By design: ordering keeps the received order, and the engine gets the client's bytes.
    for name, value in [("an object", {"a": 1}), ("a number", 7), ("a string with CR LF", "a\r\nX-Injected: 1")]:
        raw = _json("chat", _with_result_id("chat", value))
        cases.append(Bad(f"chat: tool_call_id is {name}", "chat", raw, "forwarded", 200))
    return cases


CORPUS = corpus()


@dataclass
class Target:
    toolpair: Process
    engine: MockEngine
    address: tuple[str, int]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    engine = MockEngine(tokenizer=True)
    thread = EngineThread(engine)
    url = thread.start()
    tmp = tmp_path_factory.mktemp("hostile")
    toolpair = start_toolpair(tmp, "proxy", "--upstream", url, "--engine-kind", "llama-cpp-python")
    host, port = toolpair.url.removeprefix("http://").split(":")
    record("hostile_input", rss_before_mib=round(rss_kib(toolpair.pid) / 1024, 1))
    try:
        yield Target(toolpair, engine, (host, int(port)))
    finally:
        toolpair.stop()
        thread.stop()


def _check_refused(case: Bad, status: int, headers: dict[str, str], raw: bytes) -> None:
    assert status == case.status, raw[:300]
    assert "x-toolpair-error" in headers, headers
    error = check_error_body(case.api, raw)
    assert error.get("source") == "toolpair", error


@pytest.mark.parametrize("case", CORPUS, ids=[case.name for case in CORPUS])
async def test_a_bad_request_gets_a_clean_answer_in_bounded_time(target: Target, case: Bad) -> None:
    engine = target.engine
    before = len(engine.received)
    reply = await exchange(target.address, case.raw(), deadline=DEADLINE)
    assert b"Traceback" not in reply.body and b"Traceback" not in reply.head
    if case.expect == "refused":
        _check_refused(case, reply.status, reply.headers, reply.body)
        assert len(engine.received) == before, "a request toolpair refused reached the engine"
    elif case.expect == "http":
        assert 400 <= reply.status < 500, reply.head
        assert len(engine.received) == before
    else:
        assert reply.status == case.status, reply.body[:300]
        assert len(engine.received) == before + 1  # once, and nothing else
        sent = engine.received[-1]
        if case.expect == "forwarded":
            # The received order is kept (the engine adaptation only fills the null assistant content).
            sent_ids = [m.get("tool_call_id") for m in sent.json()["messages"]]
            client = orjson.loads(case.raw().split(b"\r\n\r\n", 1)[1])
            assert sent_ids == [m.get("tool_call_id") for m in client["messages"]]
        assert all("\r" not in v and "\n" not in v for v in reply.headers.values())
        assert "set-cookie" not in reply.headers and "x-injected" not in {k.lower() for k in sent.headers}
        request_id = reply.headers["x-request-id"]
        assert re.fullmatch(r"[A-Za-z0-9._:+=/-]{1,128}", request_id) and sent.headers["X-Request-ID"] == request_id
        dropped = reply.headers.get("x-toolpair-dropped-tools", "")
        assert len(dropped) <= 1100 and re.fullmatch(r"[A-Za-z0-9_.:(),-]*", dropped.replace(",...", "")), dropped
    count("hostile_input", f"{case.expect}")
    count("hostile_input", "tried")
    maximum("hostile_input", "slowest_answer_s", round(reply.seconds, 2))


async def test_after_the_corpus_toolpair_is_healthy_and_its_log_is_well_formed(target: Target) -> None:
    reply = await exchange(target.address, request("GET", "/health", None))
    assert reply.status == 200 and orjson.loads(reply.body) == {"status": "ok"}
    assert target.toolpair.process.poll() is None
    for api in APIS:
        payload = orjson.dumps(body(api, 1))
        answer = await exchange(target.address, request("POST", PATHS[api], payload, JSON_HEADERS))
        assert answer.status == 200 and check_stream(api, answer.body).outcome == "complete"
    log = target.toolpair.tail(size=1 << 30)
    lines = log.splitlines()
    assert lines and all(re.match(r"\d{4}-\d\d-\d\dT", line) for line in lines), [
        line for line in lines if not re.match(r"\d{4}-\d\d-\d\dT", line)
    ][:5]
    assert "Traceback" not in log and " ERROR " not in log
    record("hostile_input", rss_after_mib=round(rss_kib(target.toolpair.pid) / 1024, 1), log_lines=len(lines))


def test_the_corpus_covers_the_three_apis() -> None:
    assert len(CORPUS) >= 60
    assert {case.api for case in CORPUS} == set(APIS)
