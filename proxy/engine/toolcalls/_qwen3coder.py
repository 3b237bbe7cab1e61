"""Qwen3-Coder XML calls, with parameter values typed by the tool's JSON schema (:mod:`._typed`).

::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

Values are raw text between the tags, one newline trimmed at each end. A
missing ``</parameter>`` is tolerated (the next ``<parameter=`` or
``</function>`` ends the value), as Qwen3-Coder models sometimes drop it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from proxy.engine.toolcalls._events import ParsedCall
from proxy.engine.toolcalls._scan import skip_space
from proxy.engine.toolcalls._typed import typed_arguments

__all__ = ["FUNCTION_OPEN", "FunctionReader"]

FUNCTION_OPEN = "<function="
_FUNCTION_CLOSE = "</function>"
_PARAMETER_OPEN = "<parameter="
_PARAMETER_CLOSE = "</parameter>"
_VALUE_ENDS = (_PARAMETER_CLOSE, _PARAMETER_OPEN, _FUNCTION_CLOSE)
_NAME = re.compile(r"[^\s<>]+")
_LONGEST_NAME = 256


class FunctionReader:
    """Reads ``NAME>`` and the parameters of one ``<function=`` block, which opened at ``start``."""

    __slots__ = ("_name", "_param", "_phase", "_pos", "_search", "_tools", "_values")

    def __init__(self, start: int, tools: Mapping[str, Any]) -> None:
        self._pos = start
        self._phase = "name"
        self._name = ""
        self._param = ""
        self._search = start
        self._values: dict[str, str] = {}
        self._tools = tools

    def read(self, text: str, final: bool) -> tuple[int, ParsedCall] | None:
        """``(end, call)`` once ``</function>`` has come; None while undecided; ValueError if malformed."""
        while True:
            if self._phase == "name":
                name = self._tag_name(text, final)
                if name is None:
                    return None
                self._name, self._phase = name, "body"
            elif self._phase == "body":
                pos = skip_space(text, self._pos)
                rest = text[pos : pos + len(_PARAMETER_OPEN)]
                if rest.startswith(_PARAMETER_OPEN):
                    self._pos, self._phase = pos + len(_PARAMETER_OPEN), "parameter"
                elif text.startswith(_FUNCTION_CLOSE, pos):
                    return pos + len(_FUNCTION_CLOSE), self._call()
                elif not final and (_PARAMETER_OPEN.startswith(rest) or _FUNCTION_CLOSE.startswith(rest)):
                    return None
                else:
                    raise ValueError("expected <parameter= or </function>")
            elif self._phase == "parameter":
                param = self._tag_name(text, final)
                if param is None:
                    return None
                self._param, self._phase, self._search = param, "value", self._pos
            elif not self._value(text, final):
                return None

    def _tag_name(self, text: str, final: bool) -> str | None:
        close = text.find(">", self._pos, self._pos + _LONGEST_NAME + 1)
        if close < 0:
            if final or len(text) - self._pos > _LONGEST_NAME or "\n" in text[self._pos :]:
                raise ValueError("unterminated tag name")
            return None
        name = text[self._pos : close].strip()
        if not _NAME.fullmatch(name):
            raise ValueError(f"bad name {name!r}")
        self._pos = close + 1
        return name

    def _value(self, text: str, final: bool) -> bool:
        found = [(i, end) for end in _VALUE_ENDS if (i := text.find(end, self._search)) >= 0]
        if not found:
            if final:
                raise ValueError("unterminated parameter value")
            self._search = max(self._pos, len(text) - len(_PARAMETER_CLOSE))
            return False
        index, end = min(found)
        value = text[self._pos : index]
        value = value[1:] if value.startswith("\n") else value
        value = value[:-1] if value.endswith("\n") else value
        self._values[self._param] = value
        self._pos = index + len(end) if end == _PARAMETER_CLOSE else index
        self._phase = "body"
        return True

    def _call(self) -> ParsedCall:
        return ParsedCall(self._name, typed_arguments(self._tools, self._name, self._values))
