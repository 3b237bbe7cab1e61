"""Qwen3-Coder XML calls, with parameter values converted to the tool's JSON-schema types.

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

import ast
import re
from collections.abc import Mapping
from typing import Any

from proxy.engine.toolcalls._calls import dump_arguments
from proxy.engine.toolcalls._events import ParsedCall
from proxy.engine.toolcalls._scan import loads_strict, skip_space

__all__ = ["FUNCTION_OPEN", "FunctionReader", "convert_value"]

FUNCTION_OPEN = "<function="
_FUNCTION_CLOSE = "</function>"
_PARAMETER_OPEN = "<parameter="
_PARAMETER_CLOSE = "</parameter>"
_VALUE_ENDS = (_PARAMETER_CLOSE, _PARAMETER_OPEN, _FUNCTION_CLOSE)
_NAME = re.compile(r"[^\s<>]+")
_LONGEST_NAME = 256


def _schema_types(schema: Any) -> list[str]:
    if not isinstance(schema, dict):
        return []
    kind = schema.get("type")
    if isinstance(kind, str):
        return [kind]
    if isinstance(kind, list):
        return [k for k in kind if isinstance(k, str)]
    types: list[str] = []
    for key in ("anyOf", "oneOf"):
        for option in schema.get(key) or ():
            types.extend(t for t in _schema_types(option) if t not in types)
    if not types and isinstance(schema.get("enum"), list):
        types = sorted({_JSON_TYPE.get(type(v), "string") for v in schema["enum"]})
    return types


_JSON_TYPE: dict[type, str] = {bool: "boolean", int: "integer", float: "number", dict: "object", list: "array"}


def _as_type(value: str, kind: str) -> tuple[bool, Any]:
    text = value.strip()
    if kind in ("integer", "number", "object", "array"):
        try:
            parsed = loads_strict(text)
        except ValueError:
            if kind not in ("object", "array"):
                return False, None
            try:  # Python-style literals ({'a': True}) that models sometimes write
                parsed = ast.literal_eval(text)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                return False, None
        if kind == "integer" and isinstance(parsed, float) and parsed.is_integer() and "." not in text:
            parsed = int(parsed)
        wanted = {"integer": (int,), "number": (int, float), "object": (dict,), "array": (list,)}[kind]
        ok = isinstance(parsed, wanted) and not isinstance(parsed, bool)
        return ok, parsed
    if kind == "boolean" and text.lower() in ("true", "false"):
        return True, text.lower() == "true"
    if kind == "null" and text.lower() in ("null", "none"):
        return True, None
    return False, None


def convert_value(value: str, schema: Any) -> Any:
    """A parameter's text as the type its schema names; text stays text when nothing fits.

    >>> convert_value("3", {"type": "integer"}), convert_value("3", {"type": "string"})
    (3, '3')
    >>> convert_value('{"a": [1]}', {"type": "object"}), convert_value("TRUE", {"type": ["null", "boolean"]})
    ({'a': [1]}, True)
    """
    types = _schema_types(schema)
    for kind in types:
        if kind == "string":
            continue
        ok, parsed = _as_type(value, kind)
        if ok:
            return parsed
    return value


def _parameters_schema(tools: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    schema = tools.get(name)
    properties = schema.get("properties") if isinstance(schema, dict) else None
    return properties if isinstance(properties, dict) else {}


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
        schema = _parameters_schema(self._tools, self._name)
        arguments = {k: convert_value(v, schema.get(k)) for k, v in self._values.items()}
        return ParsedCall(self._name, dump_arguments(arguments))
