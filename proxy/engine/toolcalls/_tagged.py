"""Calls inside ``<tool_call>…</tool_call>``: Hermes, Qwen 2.5 and Qwen 3 JSON, Qwen3-Coder XML, or GLM.

These families share the tag; what follows it decides::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

A call is complete when its JSON object (or ``</function>``) closes, and goes
out then; the closing tag is consumed if it follows, and not required when the
reply ends without it. A GLM call has no such end of its own: it needs ``</tool_call>``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.engine.toolcalls._calls import ValueReader, call_from_object
from proxy.engine.toolcalls._events import ParsedCall, Step
from proxy.engine.toolcalls._glm import GlmReader
from proxy.engine.toolcalls._qwen3coder import FUNCTION_OPEN, FunctionReader
from proxy.engine.toolcalls._scan import skip_space

__all__ = ["TOOL_CALL_OPEN", "TaggedCallParser"]

TOOL_CALL_OPEN = "<tool_call>"
_TOOL_CALL_CLOSE = "</tool_call>"
_JSON_KEYS = ("arguments", "parameters")


class TaggedCallParser:
    """Reads what follows ``<tool_call>`` (or, for Qwen3-Coder, a bare ``<function=``).

    ``close`` is the tag that ends the block: Seed-OSS wraps the same calls in ``<seed:tool_call>``.
    """

    counts_malformed = True

    def __init__(
        self, tools: Mapping[str, Any], *, after_function_tag: bool = False, close: str = _TOOL_CALL_CLOSE
    ) -> None:
        self._tools = tools
        self._close = close
        self._reader: ValueReader | FunctionReader | GlmReader | None = (
            FunctionReader(0, tools) if after_function_tag else None
        )
        self._end: int | None = None
        self._literal = 0  # a <function= inside this block is part of it, even when the block fails

    def step(self, text: str, final: bool) -> Step:
        if self._end is None:
            try:
                read = self._read(text, final)
            except ValueError:
                return Step("fail", literal=self._literal)
            if read is None:
                return Step("fail", literal=self._literal) if final else Step("more")
            self._end, call = read
            return self._closing(text, final, [call])
        return self._closing(text, final, [])

    def _read(self, text: str, final: bool) -> tuple[int, ParsedCall] | None:
        if self._reader is None:
            pos = skip_space(text, 0)
            head = text[pos : pos + len(FUNCTION_OPEN)]
            if head.startswith("{"):
                self._reader = ValueReader(pos)
            elif head.startswith(FUNCTION_OPEN):
                self._reader = FunctionReader(pos + len(FUNCTION_OPEN), self._tools)
                self._literal = pos + len(FUNCTION_OPEN)
            elif head and head[0] not in "<{":
                self._reader = GlmReader(pos, self._tools)
            elif final or not FUNCTION_OPEN.startswith(head):
                raise ValueError("neither a JSON object, <function= nor a name after <tool_call>")
            else:
                return None
        if isinstance(self._reader, (FunctionReader, GlmReader)):
            return self._reader.read(text, final)
        read = self._reader.read(text)
        if read is None:
            return None
        end, value = read
        call = call_from_object(value, _JSON_KEYS)
        if call is None:
            raise ValueError("not a call object")
        return end, call

    def _closing(self, text: str, final: bool, calls: list[ParsedCall]) -> Step:
        assert self._end is not None
        pos = skip_space(text, self._end)
        rest = text[pos : pos + len(self._close)]
        if rest == self._close:
            return Step("done", pos + len(self._close), calls)
        if not final and self._close.startswith(rest):
            return Step("more", calls=calls)
        return Step("done", self._end, calls)
