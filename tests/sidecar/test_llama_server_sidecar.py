"""``toolpair proxy --upstream URL`` in front of a real llama.cpp llama-server, with no other flags.

What a user gets from the drop-in: llama-server is detected; the three APIs reach it natively with
tool results in call order and nothing else changed (a recording hop between toolpair and
llama-server keeps each request as llama-server received it); everything toolpair does not exist to
change (``n``, ``developer``, custom tools, errors, metrics, credentials, a reply cut by
``max_tokens``) comes back as llama-server answers it direct.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.sidecar.llama_server import NEEDS_LLAMA_SERVER, SidecarStack, module_stack, start_llama_server, start_sidecar
from tests.support.conversations import assistant_calls, function_call, tool_result

pytestmark = NEEDS_LLAMA_SERVER

KEY = "engine-key-1"

# --- the conversation: two calls, their results sent back in the order they finished (b first)

READ = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
ASK = "Read a.py and b.py, then say which one prints."
CHAT_TOOLS = [{"type": "function", "function": {"name": "read", "description": "Read a file", "parameters": READ}}]
CHAT_CALLS = assistant_calls(
    function_call("call_a", "read", '{"path": "a.py"}'), function_call("call_b", "read", '{"path": "b.py"}')
)
CHAT_A = tool_result("call_a", "print('a')")
CHAT_B = tool_result("call_b", "x = 1")

ANTHROPIC_TOOLS = [{"name": "read", "description": "Read a file", "input_schema": READ}]
ANTHROPIC_CALLS = {
    "role": "assistant",
    "content": [
        {"type": "tool_use", "id": "toolu_a", "name": "read", "input": {"path": "a.py"}},
        {"type": "tool_use", "id": "toolu_b", "name": "read", "input": {"path": "b.py"}},
    ],
}
ANTHROPIC_A = {"type": "tool_result", "tool_use_id": "toolu_a", "content": "print('a')"}
ANTHROPIC_B = {"type": "tool_result", "tool_use_id": "toolu_b", "content": "x = 1"}

RESPONSES_TOOLS = [{"type": "function", "name": "read", "description": "Read a file", "parameters": READ}]
RESPONSES_CALLS = [
    {"type": "function_call", "call_id": "call_a", "name": "read", "arguments": '{"path": "a.py"}'},
    {"type": "function_call", "call_id": "call_b", "name": "read", "arguments": '{"path": "b.py"}'},
]
RESPONSES_A = {"type": "function_call_output", "call_id": "call_a", "output": "print('a')"}
RESPONSES_B = {"type": "function_call_output", "call_id": "call_b", "output": "x = 1"}


def chat_body(results: list[Any], **extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": ASK}, CHAT_CALLS, *results]
    return {"model": "m", "messages": messages, "tools": CHAT_TOOLS, "max_tokens": 8, "temperature": 0, **extra}


def anthropic_body(results: list[Any], **extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": ASK}, ANTHROPIC_CALLS, {"role": "user", "content": results}]
    return {"model": "m", "max_tokens": 8, "temperature": 0, "tools": ANTHROPIC_TOOLS, "messages": messages, **extra}


def responses_body(results: list[Any], **extra: Any) -> dict[str, Any]:
    items = [{"role": "user", "content": ASK}, *RESPONSES_CALLS, *results]
    return {"model": "m", "max_output_tokens": 8, "temperature": 0, "tools": RESPONSES_TOOLS, "input": items, **extra}


APIS = {
    "chat": ("/v1/chat/completions", chat_body, [CHAT_B, CHAT_A], [CHAT_A, CHAT_B]),
    "anthropic": ("/v1/messages", anthropic_body, [ANTHROPIC_B, ANTHROPIC_A], [ANTHROPIC_A, ANTHROPIC_B]),
    "responses": ("/v1/responses", responses_body, [RESPONSES_B, RESPONSES_A], [RESPONSES_A, RESPONSES_B]),
}


# --- the stack: llama-server <- recording hop <- toolpair proxy (no flags), and a key-protected llama-server


class Stack(SidecarStack):
    def start_sidecars(self, upstream: str) -> None:
        self.toolpair = self.keep(start_sidecar(self.tmp, upstream))
        # A key-protected llama-server without --metrics, and toolpair in front of it.
        self.keyed = self.keep(start_llama_server(self.binary, self.tmp, "--api-key", KEY))
        self.keyed_toolpair = self.keep(start_sidecar(self.tmp, self.keyed.url))


stack = module_stack(Stack, "llama-server", "--metrics")


class Answer:
    def __init__(self, status: int, headers: Any, body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def json(self) -> Any:
        return orjson.loads(self.body)

    def events(self) -> list[Any]:
        found = re.findall(rb"^data: (.*)$", self.body, re.M)
        return [orjson.loads(data) for data in found if data.strip() != b"[DONE]"]


async def send(
    url: str, path: str, body: Any = None, headers: dict[str, str] | None = None, method: str = "POST"
) -> Answer:
    data = None if body is None else orjson.dumps(body)
    sent = {"Content-Type": "application/json", **(headers or {})} if data is not None else headers or {}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session,
        session.request(method, url + path, data=data, headers=sent) as response,
    ):
        return Answer(response.status, response.headers, await response.read())


def received_json(stack: Stack, path: str) -> tuple[Any, dict[str, str]]:
    assert stack.hop is not None
    sent = stack.hop.last(path)
    return orjson.loads(sent.body), {k.lower(): v for k, v in sent.headers.items()}


# --- detection


def test_a_new_user_sees_llama_server_detected_in_the_banner(stack: Stack) -> None:
    log = stack.toolpair.log.read_text()
    assert 'engine:         llama-server (detected: /health answered with "Server: llama.cpp"' in log, log
    assert "/v1/messages:   native (the engine serves it)   /v1/responses: native when the engine takes it whole" in log
    assert stack.hop is not None and stack.hop.paths()[:2] == ["/health", "/props"]  # how it told


# --- the three APIs, results out of order


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("api", list(APIS))
async def test_results_reach_llama_server_in_call_order_and_nothing_else_changes(
    stack: Stack, api: str, stream: bool
) -> None:
    path, make, shuffled, ordered = APIS[api]
    client_headers = {"Authorization": "Bearer client-key", "X-Client-Trace": "t-1"}
    through = await send(stack.toolpair.url, path, make(shuffled, stream=stream), client_headers)
    assert through.status == 200, through.body
    body, headers = received_json(stack, path)
    assert body == make(ordered, stream=stream)  # the results moved; every other field is the client's
    assert headers["authorization"] == "Bearer client-key" and headers["x-client-trace"] == "t-1"
    # The same request sent direct in call order is answered alike (greedy decoding: the same text).
    direct = await send(stack.engine.url, path, make(ordered, stream=stream))
    assert direct.status == 200
    if not stream:
        assert _text(api, through.json()) == _text(api, direct.json())
        return
    assert through.headers["Content-Type"].startswith("text/event-stream")
    assert _stream_text(api, through.events()) == _stream_text(api, direct.events())
    if api == "chat":  # llama.cpp's own extras survive the relay
        assert any("timings" in event for event in through.events())
    if api == "anthropic":  # llama-server counts the prompt itself
        start = through.events()[0]
        assert start["type"] == "message_start" and start["message"]["usage"]["input_tokens"] > 0


def _text(api: str, data: Any) -> str:
    if api == "chat":
        return str(data["choices"][0]["message"].get("content"))
    if api == "anthropic":
        return "".join(block.get("text", "") for block in data["content"])
    return "".join(p.get("text", "") for item in data["output"] for p in item.get("content", []) or [])


def _stream_text(api: str, events: list[Any]) -> str:
    if api == "chat":
        return "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
    if api == "anthropic":
        return "".join(e["delta"].get("text", "") for e in events if e.get("type") == "content_block_delta")
    return "".join(e["delta"] for e in events if e.get("type") == "response.output_text.delta")


# --- what toolpair has no business changing


async def test_n_2_returns_two_choices(stack: Stack) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "n": 2}
    answer = await send(stack.toolpair.url, "/v1/chat/completions", body)
    assert answer.status == 200, answer.body
    assert [c["index"] for c in answer.json()["choices"]] == [0, 1]
    assert received_json(stack, "/v1/chat/completions")[0] == body


async def test_developer_role_and_custom_tools_are_llama_servers_to_handle(stack: Stack) -> None:
    developer = {"model": "m", "max_tokens": 3, "messages": [
        {"role": "developer", "content": "Answer briefly."}, {"role": "user", "content": "Hi"}]}  # fmt: skip
    answer = await send(stack.toolpair.url, "/v1/chat/completions", developer)
    assert answer.status == 200, answer.body
    assert received_json(stack, "/v1/chat/completions")[0] == developer  # not rewritten to system
    custom = {**developer, "tools": [{"type": "custom", "custom": {"name": "sh"}}]}
    through = await send(stack.toolpair.url, "/v1/chat/completions", custom)
    direct = await send(stack.engine.url, "/v1/chat/completions", custom)
    assert (through.status, through.json()) == (direct.status, direct.json())  # llama-server's own refusal
    # Its own answer: a 500 that names the tool type, as direct (not toolpair's 400 in its place).
    assert through.status == 500 and "Unsupported tool type" in through.json()["error"]["message"]


async def test_allowed_tools_is_narrowed_since_llama_server_would_read_it_as_auto(stack: Stack) -> None:
    second = {"type": "function", "function": {"name": "write", "parameters": READ}}
    choice = {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
        {"type": "function", "function": {"name": "read"}}]}}  # fmt: skip
    body = {"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "Hi"}],
            "tools": [*CHAT_TOOLS, second], "tool_choice": choice}  # fmt: skip
    answer = await send(stack.toolpair.url, "/v1/chat/completions", body)
    assert answer.status == 200, answer.body
    sent = received_json(stack, "/v1/chat/completions")[0]
    assert sent == {**body, "tool_choice": "auto", "tools": CHAT_TOOLS}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_a_reply_cut_by_max_tokens_comes_back_as_llama_server_sent_it(stack: Stack, stream: bool) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0}
    body["stream"] = stream
    through = await send(stack.toolpair.url, "/v1/chat/completions", body)
    direct = await send(stack.engine.url, "/v1/chat/completions", body)
    assert through.status == direct.status == 200
    if stream:
        assert _stream_text("chat", through.events()) == _stream_text("chat", direct.events())
    else:
        assert through.json()["choices"] == direct.json()["choices"]
        assert through.json()["choices"][0]["finish_reason"] == "length"


# --- metrics


def _families(text: str) -> set[str]:
    return set(re.findall(r"^# TYPE (\S+)", text, re.M))


async def test_a_scrape_through_toolpair_keeps_every_engine_family_and_header(stack: Stack) -> None:
    direct = await send(stack.engine.url, "/metrics", method="GET")
    through = await send(stack.toolpair.url, "/metrics", method="GET")
    assert direct.status == through.status == 200
    engine_families = _families(direct.body.decode())
    assert any(name.startswith("llamacpp:") for name in engine_families)
    families = _families(through.body.decode())
    assert engine_families <= families
    assert {name for name in families - engine_families if not name.startswith("toolpair_")} == set()
    assert "toolpair_requests_total" in families  # toolpair's own, appended
    for name in direct.headers:
        if name.lower() not in ("date", "content-length", "keep-alive", "connection"):
            assert through.headers.get(name) == direct.headers[name], name  # Process-Start-Time-Unix among them
    assert "Process-Start-Time-Unix" in through.headers
    own = await send(stack.toolpair.url, "/toolpair/metrics", method="GET")
    assert own.status == 200 and _families(own.body.decode()) == families - engine_families


async def test_without_its_metrics_flag_llama_server_answers_501_through_toolpair_too(stack: Stack) -> None:
    key = {"Authorization": f"Bearer {KEY}"}
    direct = await send(stack.keyed.url, "/metrics", headers=key, method="GET")
    through = await send(stack.keyed_toolpair.url, "/metrics", headers=key, method="GET")
    assert direct.status == through.status == 501
    assert through.json() == direct.json()


# --- credentials


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}),
        ("/v1/messages", {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}),
        ("/v1/responses", {"model": "m", "max_output_tokens": 2, "input": "Hi"}),
    ],
    ids=["chat", "anthropic", "responses"],
)
async def test_a_key_protected_llama_server_checks_the_clients_key_through_toolpair(
    stack: Stack, path: str, body: Any
) -> None:
    for wrong in ({"Authorization": "Bearer wrong"}, {"x-api-key": "wrong"}, {}):
        direct = await send(stack.keyed.url, path, body, wrong)
        through = await send(stack.keyed_toolpair.url, path, body, wrong)
        assert through.status == direct.status == 401, wrong
        assert through.json() == direct.json() and "toolpair" not in through.body.decode()
    for right in ({"Authorization": f"Bearer {KEY}"}, {"x-api-key": KEY}):
        answer = await send(stack.keyed_toolpair.url, path, body, right)
        assert answer.status == 200, (right, answer.body)


async def test_count_tokens_is_llama_servers_count_with_the_clients_key(stack: Stack) -> None:
    body = anthropic_body([ANTHROPIC_A, ANTHROPIC_B])
    key = {"x-api-key": KEY}
    direct = await send(stack.keyed.url, "/v1/messages/count_tokens", body, key)
    through = await send(stack.keyed_toolpair.url, "/v1/messages/count_tokens", body, key)
    assert direct.status == through.status == 200
    assert through.json() == direct.json() and through.headers["X-Toolpair-Token-Count"] == "exact"


# --- the route plan: native only when llama-server takes the request whole

FIXTURES = Path(__file__).parent.parent / "fixtures"
REFUSED_BY_LLAMA_SERVER = {
    "assistant_item_without_type": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "hello"}]},
        {"role": "user", "content": "again"},
    ],
    "reasoning_without_content": [
        {"role": "user", "content": "hi"},
        {"type": "reasoning", "summary": [], "encrypted_content": "opaque"},
        *RESPONSES_CALLS,
        RESPONSES_A,
        RESPONSES_B,
    ],
    "tool_output_parts": [
        {"role": "user", "content": ASK},
        *RESPONSES_CALLS,
        {**RESPONSES_A, "output": [{"type": "output_text", "text": "print('a')"}]},
        RESPONSES_B,
    ],
}


@pytest.mark.parametrize("reason", list(REFUSED_BY_LLAMA_SERVER))
async def test_a_shape_llama_server_refuses_is_answered_through_the_translation(stack: Stack, reason: str) -> None:
    body = {"model": "m", "max_output_tokens": 4, "tools": RESPONSES_TOOLS, "input": REFUSED_BY_LLAMA_SERVER[reason]}
    direct = await send(stack.engine.url, "/v1/responses", body)
    assert direct.status == 400, direct.body  # llama-server's own converter refuses it
    through = await send(stack.toolpair.url, "/v1/responses", body)
    assert through.status == 200, through.body
    assert through.headers["X-Toolpair-Route"] == f"translate; reason={reason}"
    assert through.json()["object"] == "response"


async def test_codex_tools_all_reach_llama_server_and_a_whole_request_stays_native(stack: Stack) -> None:
    codex = orjson.loads((FIXTURES / "codex_0_169_request.json").read_bytes())
    codex.update(stream=False, max_output_tokens=4)
    through = await send(stack.toolpair.url, "/v1/responses", codex)
    assert through.status == 200, through.body
    assert through.headers["X-Toolpair-Route"] == "translate; reason=tool_type"
    sent, _ = received_json(stack, "/v1/chat/completions")
    names = {t["function"]["name"] for t in sent["tools"]}
    assert {"exec_command", "multi_agent_v1__spawn_agent", "get_goal"} <= names  # namespace tools kept
    plain = await send(stack.toolpair.url, "/v1/responses", responses_body([RESPONSES_B, RESPONSES_A]))
    assert plain.status == 200 and plain.headers["X-Toolpair-Route"] == "native; reason=whole"
    assert received_json(stack, "/v1/responses")[0]["input"][-2:] == [RESPONSES_A, RESPONSES_B]
    anthropic = await send(stack.toolpair.url, "/v1/messages", anthropic_body([ANTHROPIC_A, ANTHROPIC_B]))
    assert anthropic.headers["X-Toolpair-Route"] == "native; reason=whole"
    metrics = await send(stack.toolpair.url, "/toolpair/metrics", method="GET")
    text = metrics.body.decode()
    assert 'toolpair_api_routes_total{api="responses",reason="tool_type",route="translate"}' in text
    assert 'toolpair_api_routes_total{api="responses",reason="whole",route="native"}' in text
