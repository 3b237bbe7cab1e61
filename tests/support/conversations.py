"""The conversation toolpair exists for, in Chat messages: one assistant turn making two calls at once,
then their results, usually in the order the tools finished.

Tests build it here rather than each writing its own copy; the builders keep every id, name,
argument text and result that a test's assertions name.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "RESULT_A",
    "RESULT_B",
    "TWO_CALLS",
    "WEATHER_QUESTION",
    "WEATHER_TOOL",
    "anthropic_calls",
    "assistant_calls",
    "function_call",
    "parallel_weather",
    "tool_result",
    "tool_use",
    "weather_call",
    "weather_calls",
    "weather_uses",
]


def function_call(call_id: str, name: str = "f", arguments: str = "{}") -> dict[str, Any]:
    """One entry of a Chat assistant message's ``tool_calls``."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def weather_call(call_id: str, city: str, *, compact: bool = True) -> dict[str, Any]:
    """``get_weather(city)``; ``compact`` writes the arguments as '{"city":"X"}', else '{"city": "X"}'."""
    arguments = json.dumps({"city": city}, separators=(",", ":") if compact else None)
    return function_call(call_id, "get_weather", arguments)


def assistant_calls(*calls: dict[str, Any], content: str | None = None) -> dict[str, Any]:
    """The assistant turn that makes ``calls`` in parallel."""
    return {"role": "assistant", "content": content, "tool_calls": list(calls)}


def tool_result(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


TWO_CALLS = assistant_calls(function_call("call_a"), function_call("call_b"))
"""Two parallel calls of ``f`` with no arguments, ids ``call_a`` then ``call_b``."""
RESULT_A = tool_result("call_a", "1")
RESULT_B = tool_result("call_b", "2")

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
"""The Chat tool that ``weather_call`` calls."""

WEATHER_QUESTION = {"role": "user", "content": "Weather in Paris and Oslo?"}


def weather_calls(
    ids: tuple[str, str] = ("call_paris", "call_oslo"), *, compact: bool = True, content: str | None = None
) -> dict[str, Any]:
    """The assistant turn that calls ``get_weather`` for Paris and for Oslo at once, with ``ids`` in that order."""
    paris, oslo = ids
    return assistant_calls(
        weather_call(paris, "Paris", compact=compact), weather_call(oslo, "Oslo", compact=compact), content=content
    )


def parallel_weather(
    paris: str, oslo: str, *, ids: tuple[str, str] = ("call_paris", "call_oslo"), compact: bool = True
) -> list[dict[str, Any]]:
    """The case toolpair exists for: :data:`WEATHER_QUESTION`, :func:`weather_calls`, then the results ``paris``
    and ``oslo`` in the order the tools finished, Oslo's first, so that a proxy must put Paris's back in front."""
    return [
        WEATHER_QUESTION,
        weather_calls(ids, compact=compact),
        tool_result(ids[1], oslo),
        tool_result(ids[0], paris),
    ]


def tool_use(use_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """One Anthropic ``tool_use`` block."""
    return {"type": "tool_use", "id": use_id, "name": name, "input": arguments}


def anthropic_calls(
    *uses: dict[str, Any], thinking: str | None = None, text: str | None = None, signature: str = "s"
) -> dict[str, Any]:
    """The Anthropic assistant turn that makes ``uses`` in parallel, after a thinking and a text block when given."""
    content: list[dict[str, Any]] = []
    if thinking is not None:
        content.append({"type": "thinking", "thinking": thinking, "signature": signature})
    if text is not None:
        content.append({"type": "text", "text": text})
    return {"role": "assistant", "content": [*content, *uses]}


def weather_uses(ids: tuple[str, str] = ("toolu_a", "toolu_b")) -> list[dict[str, Any]]:
    """Anthropic's form of :func:`weather_calls`: ``get_weather`` for Paris and for Oslo, with ``ids`` in that order."""
    paris, oslo = ids
    return [tool_use(paris, "get_weather", {"city": "Paris"}), tool_use(oslo, "get_weather", {"city": "Oslo"})]
