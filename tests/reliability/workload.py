"""Requests of the three APIs, as agents send them: a tool turn whose results came back out of order.

Every prompt carries :data:`PROMPT_MARK` followed by a serial number, so a test can
look for prompt text where it must not be (log lines) and match what the engine got
with what a client sent.
"""

from __future__ import annotations

from typing import Any

import orjson

from tests.support.conversations import assistant_calls, function_call, tool_result

__all__ = ["APIS", "PATHS", "PROMPT_MARK", "body", "encoded"]

APIS = ("chat", "anthropic", "responses")
PATHS = {"chat": "/v1/chat/completions", "anthropic": "/v1/messages", "responses": "/v1/responses"}
PROMPT_MARK = "PROMPT-TEXT-7f3a"
"""Text that appears in prompts only: never in a log line while body logging is off."""


def _chat(serial: int, stream: bool) -> dict[str, Any]:
    return {
        "model": "mock",
        "stream": stream,
        "max_tokens": 16,
        "messages": [
            {"role": "system", "content": "You run tools."},
            {"role": "user", "content": f"{PROMPT_MARK} {serial}: read both files"},
            assistant_calls(function_call(f"call_a{serial}", "read"), function_call(f"call_b{serial}", "grep")),
            tool_result(f"call_b{serial}", "b finished first"),
            tool_result(f"call_a{serial}", "a finished second"),
        ],
        "tools": [
            {"type": "function", "function": {"name": "read", "parameters": {"type": "object", "properties": {}}}},
            {"type": "function", "function": {"name": "grep", "parameters": {"type": "object", "properties": {}}}},
        ],
    }


def _anthropic(serial: int, stream: bool) -> dict[str, Any]:
    return {
        "model": "claude-sonnet-4-5",
        "stream": stream,
        "max_tokens": 16,
        "system": "You run tools.",
        "messages": [
            {"role": "user", "content": f"{PROMPT_MARK} {serial}: read both files"},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": f"toolu_a{serial}", "name": "read", "input": {}},
                    {"type": "tool_use", "id": f"toolu_b{serial}", "name": "grep", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": f"toolu_b{serial}", "content": "b finished first"},
                    {"type": "tool_result", "tool_use_id": f"toolu_a{serial}", "content": "a finished second"},
                ],
            },
        ],
        "tools": [
            {"name": "read", "input_schema": {"type": "object", "properties": {}}},
            {"name": "grep", "input_schema": {"type": "object", "properties": {}}},
        ],
    }


def _responses(serial: int, stream: bool) -> dict[str, Any]:
    return {
        "model": "mock",
        "stream": stream,
        "store": False,
        "max_output_tokens": 16,
        "instructions": "You run tools.",
        "input": [
            {"role": "user", "content": f"{PROMPT_MARK} {serial}: read both files"},
            {"type": "function_call", "call_id": f"call_a{serial}", "name": "read", "arguments": "{}"},
            {"type": "function_call", "call_id": f"call_b{serial}", "name": "grep", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"call_b{serial}", "output": "b finished first"},
            {"type": "function_call_output", "call_id": f"call_a{serial}", "output": "a finished second"},
        ],
        "tools": [
            {"type": "function", "name": "read", "parameters": {"type": "object", "properties": {}}},
            {"type": "function", "name": "grep", "parameters": {"type": "object", "properties": {}}},
        ],
    }


_BUILDERS = {"chat": _chat, "anthropic": _anthropic, "responses": _responses}


def body(api: str, serial: int = 0, *, stream: bool = True) -> dict[str, Any]:
    """A request of ``api`` with a tool turn whose two results arrive in reverse call order."""
    return _BUILDERS[api](serial, stream)


def encoded(api: str, serial: int = 0, *, stream: bool = True) -> bytes:
    return orjson.dumps(body(api, serial, stream=stream))
