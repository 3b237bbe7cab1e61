"""A request shaped like the ones Claude Code 2.1.x sends, with every oddity seen in real traffic.

The wording is made up; the shape is what matters: a billing stamp as the
first system block, ``cache_control`` on blocks, ``thinking: adaptive``,
``context_management``, ``output_config.effort``, ``metadata.user_id`` holding
a JSON string, 14 tools of about 55 KB (one with ``defer_loading``), a
mid-conversation ``role: "system"`` message, and two parallel Grep results sent
back in the order they finished (fast first), one with ``is_error``.
"""

from __future__ import annotations

from typing import Any

TOOL_NAMES = [
    "Task", "Bash", "Glob", "Grep", "LS", "ExitPlanMode", "Read",
    "Edit", "MultiEdit", "Write", "NotebookEdit", "WebFetch", "TodoWrite", "WebSearch",
]  # fmt: skip
STAMP = "x-anthropic-billing-header: cc_version=2.1.37.0d9; cc_entrypoint=cli; cch=fa690;"


def _tool(name: str) -> dict[str, Any]:
    paragraph = (
        f"The {name} tool does one job for the agent. Use it when the task needs it, give it precise "
        "arguments, and read its output carefully before deciding on the next step. "
    )
    properties = {
        f"{name.lower()}_arg_{i}": {"type": "string", "description": f"Argument {i} of {name}. " * 6} for i in range(6)
    }
    tool: dict[str, Any] = {
        "name": name,
        "description": paragraph * 16,
        "input_schema": {
            "type": "object",
            "properties": properties,
            "required": [f"{name.lower()}_arg_0"],
            "additionalProperties": False,
            "$schema": "http://json-schema.org/draft-07/schema#",
        },
    }
    if name == "WebSearch":
        tool["defer_loading"] = True
    if name == "TodoWrite":
        tool["cache_control"] = {"type": "ephemeral"}
    return tool


def claude_code_request(stream: bool = True) -> dict[str, Any]:
    grep_slow = {"type": "tool_use", "id": "toolu_01SLOW", "name": "Grep", "input": {"grep_arg_0": "def slow"}}
    grep_fast = {"type": "tool_use", "id": "toolu_02FAST", "name": "Grep", "input": {"grep_arg_0": "def fast"}}
    return {
        "model": "claude-sonnet-4-5-20250929",
        "max_tokens": 32000,
        "stream": stream,
        "system": [
            {"type": "text", "text": STAMP},
            {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>\nContext for this session.\n</system-reminder>"},
                    {"type": "text", "text": "Find slow and fast.", "cache_control": {"type": "ephemeral"}},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Two searches in parallel.", "signature": "EqQBCkYIBxgCKkA"},
                    {"type": "text", "text": "Searching both."},
                    grep_slow,
                    grep_fast,
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_02FAST", "content": "fast.py:3: def fast():"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_01SLOW",
                        "content": [{"type": "text", "text": "grep: slow.py: Permission denied"}],
                        "is_error": True,
                        "cache_control": {"type": "ephemeral"},
                    },
                ],
            },
            # Claude Code puts these after a user turn (the API allows them only there).
            {"role": "system", "content": [{"type": "text", "text": "Skills available: none."}]},
        ],
        "tools": [_tool(name) for name in TOOL_NAMES],
        "metadata": {"user_id": '{"device_id":"d1","account_uuid":"","session_id":"s1"}'},
        "thinking": {"type": "adaptive"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
        "temperature": 1,
    }
