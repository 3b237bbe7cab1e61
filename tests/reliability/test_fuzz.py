"""Fuzz: generated JSON bodies posted to every route through the real HTTP stack.

Two kinds of body: random JSON structures, and valid agent requests (a tool turn
whose results came back out of order) with a few fields replaced, removed or added
at any depth. For each, within a deadline:

- toolpair never answers 5xx (the mock engine here never does, so any 5xx is
  toolpair's), and every 4xx is toolpair's own, in the route's dialect;
- a 200 is whole: a stream that is complete and well-formed, or a JSON object;
- whenever the engine was called, the ordering invariants hold in what it received:
  the tool results are exactly the client's (none added, none lost), each run is in
  call order when its IDs allow it (unique nonempty strings naming the same calls)
  and in received order otherwise; for the generic kind, a Chat body in which nothing
  moves reaches the engine byte for byte.

The expected order is computed here from the rule itself, not by toolpair's code.
Example counts are modest, so the whole module runs in seconds.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Sequence
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.mock_engine import MockEngine
from tests.reliability.client import post, send
from tests.reliability.conftest import Proxy, ProxyFactory
from tests.reliability.figures import count
from tests.reliability.streams import check_error_body, check_stream
from tests.reliability.workload import body

EXAMPLES = 100

# --- strategies ---------------------------------------------------------------------------------

KEYS = st.sampled_from(
    ["type", "role", "content", "name", "id", "tool_call_id", "tool_use_id", "call_id", "tools", "tool_calls",
     "function", "arguments", "input", "output", "text", "messages", "stream", "model", "max_tokens", "n",
     "tool_choice", "system", "source", "parameters", "previous_response_id", "store", "namespace", "x"]
)  # fmt: skip
WORDS = st.sampled_from(
    ["user", "assistant", "tool", "system", "developer", "function", "text", "image", "image_url", "tool_use",
     "tool_result", "function_call", "function_call_output", "custom_tool_call", "message", "auto", "none",
     "custom", "allowed_tools", "namespace", "required", "any", "json_schema", "input_text", "reasoning",
     "call_a0", "call_b0", "toolu_a0", "toolu_b0", "web_search", ""]
)  # fmt: skip
LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
    WORDS,
)
JSON = st.recursive(
    LEAVES,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(KEYS, inner, max_size=4)),
    max_leaves=16,
)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            found += _paths(value, (*prefix, index))
    return found


_REMOVE = object()


def _mutate(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    """``doc`` with the value at ``path`` replaced (or removed); the input is not changed."""
    if not path:
        return doc if value is _REMOVE else value
    doc = copy.deepcopy(doc)
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    if value is _REMOVE:
        del parent[last]
    else:
        parent[last] = value
    return doc


@st.composite
def near_valid(draw: st.DrawFn, api: str) -> Any:
    """A valid request of ``api`` with one to three fields replaced, removed or added."""
    doc: Any = body(api, draw(st.integers(0, 3)), stream=draw(st.booleans()))
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(doc)
        path = draw(st.sampled_from(paths))
        action = draw(st.sampled_from(["replace", "remove", "add"]))
        if action == "add":
            target: Any = doc
            for step in path:
                target = target[step]
            if isinstance(target, dict):
                doc = _mutate(doc, (*path, draw(KEYS)), draw(JSON))
            elif isinstance(target, list):
                doc = _mutate(
                    doc, path, [*target[: (at := draw(st.integers(0, len(target))))], draw(JSON), *target[at:]]
                )
        elif action == "remove" and path:
            doc = _mutate(doc, path, _REMOVE)
        else:
            doc = _mutate(doc, path, draw(JSON))
    return doc


# --- the ordering rule, written from its statement -----------------------------------------------


def _orderable(calls: Sequence[Any], results: Sequence[Any]) -> bool:
    """Unique nonempty string IDs on both sides, naming the same calls."""
    plain = all(isinstance(i, str) and i for i in [*calls, *results])
    return plain and len(set(calls)) == len(calls) == len(results) == len(set(results)) and set(calls) == set(results)


def expected_chat(messages: Any) -> list[Any]:
    """The ``tool_call_id`` of every tool message, in the order the engine must get them."""
    out: list[Any] = []
    if not isinstance(messages, list):
        return out
    index = 0
    while index < len(messages):
        message = messages[index]
        index += 1
        if not isinstance(message, dict):
            continue
        if message.get("role") == "tool":
            out.append(message.get("tool_call_id"))
            continue
        calls = message.get("tool_calls") if message.get("role") == "assistant" else None
        if not isinstance(calls, list) or not calls:
            continue
        run = []
        while index < len(messages) and isinstance(messages[index], dict) and messages[index].get("role") == "tool":
            run.append(messages[index].get("tool_call_id"))
            index += 1
        call_ids = [call.get("id") if isinstance(call, dict) else None for call in calls]
        out += call_ids if _orderable(call_ids, run) else run
    return out


def expected_anthropic(messages: list[Any]) -> list[Any]:
    """The ``tool_use_id`` of every tool_result block, in engine order (the translation keeps block order)."""
    out: list[Any] = []
    index = 0
    while index < len(messages):
        message = messages[index]
        index += 1
        content = message["content"] if isinstance(message["content"], list) else []
        if message["role"] != "assistant":
            out += [b["tool_use_id"] for b in content if b["type"] == "tool_result"]
            continue
        calls = [b["id"] for b in content if b["type"] == "tool_use"]
        if not calls:
            continue
        run: list[Any] = []
        while index < len(messages) and messages[index]["role"] == "user":
            blocks = messages[index]["content"] if isinstance(messages[index]["content"], list) else []
            run += [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"]
            index += 1
        out += calls if _orderable(calls, run) else run
    return out


def expected_responses(items: list[Any]) -> list[Any]:
    """The ``call_id`` of every output item, in engine order."""
    calls_kinds, outputs = ("function_call", "custom_tool_call"), ("function_call_output", "custom_tool_call_output")
    out: list[Any] = []
    index = 0
    while index < len(items):
        if items[index].get("type") not in calls_kinds:
            if items[index].get("type") in outputs:
                out.append(items[index]["call_id"])
            index += 1
            continue
        calls = []
        while index < len(items) and items[index].get("type") in calls_kinds:
            calls.append(items[index]["call_id"])
            index += 1
        run = []
        while index < len(items) and items[index].get("type") in outputs:
            run.append(items[index]["call_id"])
            index += 1
        out += calls if _orderable(calls, run) else run
    return out


def _engine_ids(sent: Any) -> list[Any]:
    messages = sent.get("messages") if isinstance(sent, dict) else None
    return [m.get("tool_call_id") for m in messages or [] if isinstance(m, dict) and m.get("role") == "tool"]


# --- the test -----------------------------------------------------------------------------------

ROUTES = [
    ("chat", "llama-cpp-python"),
    ("chat", "generic"),
    ("anthropic", "llama-cpp-python"),
    ("count_tokens", "llama-cpp-python"),
    ("responses", "llama-cpp-python"),
]


@pytest.fixture
async def proxies(engine: MockEngine, proxy_factory: ProxyFactory) -> AsyncIterator[dict[str, Proxy]]:
    engine.tokenizer = True
    async with (
        proxy_factory(engine_kind="llama-cpp-python") as llama,
        proxy_factory(engine_kind="generic") as plain,
    ):
        yield {"llama-cpp-python": llama, "generic": plain}


async def _check(proxy: Proxy, kind: str, route: str, doc: Any) -> None:
    engine = proxy.engine
    engine.received.clear()
    raw = orjson.dumps(doc)
    if route == "count_tokens":
        answer = await send(proxy.url + "/v1/messages/count_tokens", data=raw, deadline=10)
        assert answer.status == 200 and isinstance(answer.json()["input_tokens"], int), answer.body[:300]
        return
    api = route
    answer = await post(proxy.url, api, raw, deadline=10)
    assert answer.status < 500, answer.body[:500]
    chats = [r for r in engine.received if r.path.endswith("/chat/completions")]
    if answer.status >= 400:
        assert answer.toolpairs, answer.body[:300]
        check_error_body(api, answer.body)
        assert chats == [], "a request toolpair refused reached the engine"
        count("fuzz", "refused")
        return
    if answer.headers.get("Content-Type", "").startswith("text/event-stream"):
        assert check_stream(api, answer.body).outcome == "complete"
    else:
        assert isinstance(answer.json(), dict)
    # One generation; after a stream, possibly the one-token usage replay of the same request.
    assert 1 <= len(chats) <= 2, [r.body[:200] for r in chats]
    sent = chats[0].json()
    if len(chats) == 2:
        replay = chats[1].json()
        assert sent.get("stream") is True and replay.get("max_tokens") == 1 and not replay.get("stream")
        assert replay["messages"] == sent["messages"]
    if api == "chat":
        assert _engine_ids(sent) == expected_chat(doc["messages"])
        received = [m.get("tool_call_id") for m in doc["messages"] if isinstance(m, dict) and m.get("role") == "tool"]
        if kind == "generic" and received == expected_chat(doc["messages"]):
            assert chats[0].body == raw  # nothing moved: the client's own bytes
    elif api == "anthropic":
        assert _engine_ids(sent) == expected_anthropic(doc["messages"])
    else:
        items = doc.get("input")
        assert _engine_ids(sent) == (expected_responses(items) if isinstance(items, list) else [])
    count("fuzz", "served")


@pytest.mark.parametrize(("route", "kind"), ROUTES)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
async def test_generated_bodies_never_get_a_5xx_and_keep_the_ordering_rule(
    proxies: dict[str, Proxy], route: str, kind: str, data: st.DataObject
) -> None:
    api = "anthropic" if route == "count_tokens" else route
    doc = data.draw(st.one_of(near_valid(api), JSON), label="body")
    await _check(proxies[kind], kind, route, doc)
    count("fuzz", "bodies")
