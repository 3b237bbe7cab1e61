"""The plan for one chat request: which bytes go out, and what happens to the reply, per engine kind."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.config import ConfigError, Settings
from proxy.dialects.chat.request import plan_engine_request
from proxy.engine.plan import engine_setup, reply_plan

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
LCP = engine_setup(Settings(engine_kind="llama-cpp-python"))


def plan_of(body: dict[str, Any], **settings: Any) -> Any:
    return reply_plan(body, engine_setup(Settings(**settings)))


@pytest.mark.parametrize(
    ("settings", "body", "calls", "reasoning", "usage"),
    [
        ({"engine_kind": "llama-cpp-python"}, {"tools": TOOLS}, "auto", True, False),
        ({"engine_kind": "llama-cpp-python"}, {"tools": TOOLS, "tool_choice": "none"}, None, True, False),
        ({"engine_kind": "llama-cpp-python"}, {}, None, True, False),
        ({"engine_kind": "llama-cpp-python", "tool_call_format": "qwen3-coder", "reasoning": False},
         {"tools": TOOLS}, "qwen3-coder", False, False),
        ({"engine_kind": "llama-cpp-python", "reasoning": False},
         {"stream": True, "stream_options": {"include_usage": True}}, None, False, True),
        ({"engine_kind": "llama-server", "tool_call_format": "hermes"}, {"tools": TOOLS}, "hermes", False, False),
        ({"engine_kind": "generic", "tool_call_format": "mistral"}, {"tools": TOOLS}, "mistral", False, False),
    ],
)  # fmt: skip
def test_reply_plan(settings: dict[str, Any], body: dict[str, Any], calls: Any, reasoning: bool, usage: bool) -> None:
    plan = plan_of(body, **settings)
    assert (plan.extract.calls, plan.extract.reasoning, plan.usage) == (calls, reasoning, usage)
    assert plan.extract.tools == ({"f": {"type": "object"}} if calls else {})


@pytest.mark.parametrize(
    ("settings", "body"),
    [
        ({}, {"tools": TOOLS, "stream": True, "stream_options": {"include_usage": True}}),
        ({"engine_kind": "llama-server"}, {"tools": TOOLS, "stream": True, "stream_options": {"include_usage": True}}),
        ({"engine_kind": "llama-cpp-python", "tool_call_format": "none", "reasoning": False}, {"tools": TOOLS}),
    ],
)
def test_replies_relayed_untouched(settings: dict[str, Any], body: dict[str, Any]) -> None:
    assert plan_of(body, **settings) is None


def test_parallel_tool_calls_false_and_think_in_prompt_reach_the_extractor() -> None:
    setup = engine_setup(Settings(engine_kind="llama-cpp-python", think_in_prompt=True))
    plan = reply_plan({"tools": TOOLS, "parallel_tool_calls": False}, setup)
    assert plan is not None and plan.extract.parallel is False and plan.extract.think_open is True


def test_request_bytes_kept_when_nothing_moves_and_rewritten_when_adapted() -> None:
    raw = b'{"messages": [{"role": "user", "content": "hi"}],  "tools": []}'
    plan = plan_engine_request(raw, LCP)
    assert plan.body is raw and plan.adapted == ()
    adapted = plan_engine_request(b'{"messages": [{"role": "developer", "content": "hi"}]}', LCP)
    assert orjson.loads(adapted.body) == {"messages": [{"role": "system", "content": "hi"}]}
    assert adapted.adapted == ("adapt_messages",)


@pytest.mark.parametrize(
    ("settings", "message"),
    [({"engine_kind": "vllm"}, "engine_kind: expected one of"), ({"tool_call_format": "xml"}, "unknown format 'xml'")],
)
def test_bad_engine_settings(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        engine_setup(Settings(**settings))
