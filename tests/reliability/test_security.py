"""Security: keys compared in constant time, headers never renamed on the way to the engine, no prompt in logs.

(The managed engine's loopback listener and its own key are in ``test_managed_engine.py``.)
"""

from __future__ import annotations

import ast
import hmac
import inspect
import io
import logging
import textwrap
import types
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from aiohttp import web
from multidict import CIMultiDict

import proxy.ops.auth
from proxy.ops.auth import KeyRing
from tests.mock_engine import Received, chunk, completion
from tests.reliability.client import post, send
from tests.reliability.conftest import ProxyFactory
from tests.reliability.figures import count, record
from tests.reliability.streams import check_stream
from tests.reliability.workload import APIS, PATHS, PROMPT_MARK, body
from tests.support.logs import captured_logs

KEYS = [f"tp-key-{n}" for n in range(5)]

# --- API keys ---------------------------------------------------------------------------------


def test_keys_are_compared_with_compare_digest_against_every_key_without_an_early_exit() -> None:
    """The comparison loop: hmac.compare_digest on digests, results folded with |=, no return or break inside."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(KeyRing.accepts)))
    loops = [node for node in ast.walk(tree) if isinstance(node, ast.For)]
    assert len(loops) == 2  # over presented values, then over every key
    inner = loops[1]
    calls = [ast.unparse(node.func) for node in ast.walk(inner) if isinstance(node, ast.Call)]
    assert "hmac.compare_digest" in calls
    assert not any(isinstance(node, (ast.Return, ast.Break, ast.If, ast.Compare)) for node in ast.walk(inner))
    assert any(isinstance(node, ast.AugAssign) and isinstance(node.op, ast.BitOr) for node in ast.walk(inner))
    # Every digest has the same length, whatever the key's, so compare_digest's time says nothing of it.
    ring = KeyRing(["a", "b" * 1000])
    assert {len(digest) for digest in ring._digests} == {32}


@pytest.fixture
def comparisons(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[bytes, bytes]]]:
    """Every compare_digest call proxy.ops.auth makes."""
    seen: list[tuple[bytes, bytes]] = []

    def compare(a: bytes, b: bytes) -> bool:
        seen.append((a, b))
        return hmac.compare_digest(a, b)

    monkeypatch.setattr(proxy.ops.auth, "hmac", types.SimpleNamespace(compare_digest=compare))
    yield seen


@pytest.mark.parametrize("presented", ["tp-key-0", "tp-key-4", "tp-key-9", "x", "tp-key-"])
async def test_every_request_is_compared_with_every_key(
    proxy_factory: ProxyFactory, comparisons: list[tuple[bytes, bytes]], presented: str
) -> None:
    async with proxy_factory(api_keys=KEYS) as proxy:
        answer = await post(
            proxy.url, "chat", body("chat", stream=False), headers={"Authorization": f"Bearer {presented}"}
        )
    assert answer.status == (200 if presented in KEYS else 401)
    # The first key matching or none: the same number of comparisons, one per key.
    assert len(comparisons) == len(KEYS)
    assert {len(a) for a, _ in comparisons} == {len(b) for _, b in comparisons} == {32}
    assert len(proxy.engine.received) == (1 if presented in KEYS else 0)
    count("security", "key_checks")


# --- headers on the way to the engine -----------------------------------------------------------

CLIENT_HEADERS: list[tuple[str, str]] = [
    ("X-Custom", "custom-one"),
    ("x-custom", "custom-two"),
    ("X_Underscore", "underscore-value"),
    ("X-Hop", "hop-value"),
    ("Connection", "keep-alive, X-Hop"),
    ("Keep-Alive", "timeout=5"),
    ("Proxy-Authorization", "Basic cHJveHk6c2VjcmV0"),
    ("TE", "trailers"),
    ("Upgrade", "websocket"),
    ("Authorization", "Bearer tp-key-1"),
    ("X-Api-Key", "client-x-api-key"),
    ("X-Request-ID", "client-request-7"),
    ("X-Forwarded-For", "198.51.100.7"),
    ("Accept-Encoding", "gzip"),
    ("Cookie", "session=cookie-value"),
    ("anthropic-version", "2023-06-01"),
    ("OpenAI-Organization", "org-value"),
    ("Accept", "application/json, text/event-stream;q=0.5"),
    ("User-Agent", "reliability-suite/1"),
]
DROPPED_ALWAYS = {"x-hop", "connection", "keep-alive", "proxy-authorization", "te", "upgrade"}
# What toolpair's own client may add: the new hop's framing, toolpair's request id, the engine's key.
OWN = {"host", "content-length", "content-type", "x-request-id", "authorization", "connection"}


def _assert_no_header_renamed(
    sent: Received, client: list[tuple[str, str]], *, keyed: bool, engine_key: str | None
) -> None:
    received = CIMultiDict(sent.headers)
    by_value: dict[str, set[str]] = {}
    for name, value in client:
        by_value.setdefault(value, set()).add(name.lower())
    for name, value in received.items():
        lower = name.lower()
        if value in by_value:
            assert lower in by_value[value], f"the client's {sorted(by_value[value])} reached the engine as {name}"
        else:
            assert lower in OWN, f"{name}: {value} reached the engine, and the client did not send it"
    for name, value in client:
        if name.lower() in DROPPED_ALWAYS:
            assert value not in received.getall(name, []), f"hop-by-hop {name} reached the engine"
    if keyed or engine_key is not None:
        assert "x-api-key" not in received and received.get("Authorization") in (None, f"Bearer {engine_key}")
    if engine_key is not None:
        assert received["Authorization"] == f"Bearer {engine_key}"


@pytest.mark.parametrize("engine_key", [None, "engine-secret"])
@pytest.mark.parametrize("keyed", [False, True])
@pytest.mark.parametrize(("api", "kind"), [(api, "llama-cpp-python") for api in APIS] + [("chat", "generic")])
async def test_no_client_header_reaches_the_engine_as_another_header(
    proxy_factory: ProxyFactory, api: str, kind: str, keyed: bool, engine_key: str | None
) -> None:
    settings: dict[str, Any] = {"engine_kind": kind, "upstream_api_key": engine_key}
    if keyed:
        settings["api_keys"] = KEYS
    async with proxy_factory(**settings) as proxy:
        proxy.engine.tokenizer = True
        headers = CIMultiDict(CLIENT_HEADERS)
        data = orjson.dumps(body(api, stream=False))
        answer = await send(proxy.url + PATHS[api], data=data, headers=headers)
        assert answer.status == 200, answer.body[:300]
        passthrough = await send(proxy.url + "/v1/models", method="GET", headers=headers)
        assert passthrough.status == 200
    assert proxy.engine.received, "nothing reached the engine"
    for sent in proxy.engine.received:
        _assert_no_header_renamed(sent, CLIENT_HEADERS, keyed=keyed, engine_key=engine_key)
    count("security", "header_cases")


# --- prompt text in log lines ------------------------------------------------------------------


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """Every log record at info and above, as the text format writes it."""
    with captured_logs("text", logging.INFO) as stream:
        yield stream


def _echo_error(status: int) -> Any:
    """An engine that refuses the request, quoting it (llama-cpp-python's validation errors do)."""

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        message = f"validation error: input {received.body.decode()[:300]}"
        return web.json_response({"error": {"message": message, "type": "invalid_request_error"}}, status=status)

    return handler


async def _echo_in_band(request: web.Request, received: Received) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(chunk({"role": "assistant", "content": "fine "}))
    error = {"error": {"message": f"engine failed on {received.body.decode()[:300]}", "type": "server_error"}}
    await response.write(b"data: " + orjson.dumps(error) + b"\n\n")
    await response.write_eof()
    return response


async def _malformed_call(request: web.Request, received: Received) -> web.StreamResponse:
    text = f'<tool_call>{{"name": "read", "arguments": {{"path": "{PROMPT_MARK} oops</tool_call> done'
    if received.json().get("stream"):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(chunk({"role": "assistant", "content": ""}) + chunk({"content": text}))
        await response.write(chunk({}, "stop") + b"data: [DONE]\n\n")
        await response.write_eof()
        return response
    return web.json_response(completion(text))


async def _arguments_not_json(request: web.Request, received: Received) -> web.StreamResponse:
    call = {"id": "call_x", "type": "function", "function": {"name": "read", "arguments": f"{PROMPT_MARK} not json"}}
    return web.json_response(completion("", tool_calls=[call]))


SCENARIOS = {
    "served": None,
    "engine refuses, quoting the prompt": _echo_error(400),
    "engine fails, quoting the prompt": _echo_error(500),
    "engine error event quoting the prompt": _echo_in_band,
    "malformed tool call quoting the prompt": _malformed_call,
    "tool arguments that are not JSON": _arguments_not_json,
}


async def _run_scenarios(proxy_factory: ProxyFactory, log_bodies: bool) -> int:
    served = 0
    async with proxy_factory(engine_kind="llama-cpp-python", log_bodies=log_bodies) as proxy:
        proxy.engine.tokenizer = True
        for handler in SCENARIOS.values():
            for api in APIS:
                for stream in (False, True):
                    if handler is not None:
                        proxy.engine.then(handler)
                    answer = await post(proxy.url, api, body(api, served, stream=stream))
                    if handler is None:
                        assert answer.status == 200
                        if stream:
                            assert check_stream(api, answer.body).outcome == "complete"
                    proxy.engine.script.clear()
                    served += 1
    return served


async def test_log_lines_hold_no_prompt_text_unless_body_logging_is_on(
    proxy_factory: ProxyFactory, captured: io.StringIO
) -> None:
    requests = await _run_scenarios(proxy_factory, log_bodies=False)
    quiet = captured.getvalue()
    assert "malformed auto tool call kept as text: <" in quiet  # the paths that used to quote ran
    assert "arguments are not JSON; sending an empty input: <" in quiet
    assert PROMPT_MARK not in quiet, [line for line in quiet.splitlines() if PROMPT_MARK in line][:3]

    captured.seek(0)
    captured.truncate()
    await _run_scenarios(proxy_factory, log_bodies=True)
    assert PROMPT_MARK in captured.getvalue()  # so the check above can fail
    record("security", log_privacy_requests=requests, log_privacy_scenarios=len(SCENARIOS))
