"""Turning a parsed JSON object into a call, and arguments into the JSON text clients expect."""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from proxy.engine.toolcalls._events import IdStyle, ParsedCall
from proxy.engine.toolcalls._scan import BracketScanner, loads_strict

__all__ = ["ValueReader", "call_from_object", "dump_arguments"]


def dump_arguments(arguments: dict[str, Any]) -> str:
    """Arguments as compact JSON text, non-ASCII kept, as OpenAI sends them.

    >>> dump_arguments({"city": "Zürich", "days": 2})
    '{"city":"Zürich","days":2}'
    """
    return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))


def call_from_object(
    value: Any,
    keys: tuple[str, ...],
    *,
    known: Collection[str] | None = None,
    id_style: IdStyle = "openai",
) -> ParsedCall | None:
    """A call from ``{"name": ..., <one of keys>: {...}}``, or None when the object is not one.

    Arguments may also come double-encoded, as a JSON string holding an object.
    ``known`` limits names to the request's tools (for forms with no marker).

    >>> call_from_object({"name": "f", "arguments": {"a": 1}}, ("arguments",))
    ParsedCall(name='f', arguments='{"a":1}', id=None, id_style='openai')
    >>> call_from_object({"name": "f", "arguments": [1]}, ("arguments",)) is None
    True
    """
    if not isinstance(value, dict):
        return None
    name = value.get("name")
    if not isinstance(name, str) or not name.strip() or (known is not None and name not in known):
        return None
    arguments: Any = {}
    for key in keys:
        if key in value:
            arguments = value[key]
            break
    if isinstance(arguments, str):
        try:
            arguments = loads_strict(arguments) if arguments.strip() else {}
        except ValueError:
            return None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return None
    call_id = value.get("id")
    return ParsedCall(name, dump_arguments(arguments), call_id if isinstance(call_id, str) else None, id_style)


class ValueReader:
    """Reads one JSON object or array that starts at ``start`` in growing text."""

    __slots__ = ("_scanner", "_start")

    def __init__(self, start: int) -> None:
        self._start = start
        self._scanner = BracketScanner(start)

    def read(self, text: str) -> tuple[int, Any] | None:
        """``(end, value)`` once the value has closed, None before; ValueError if it is not JSON."""
        end = self._scanner.end(text)
        if end is None:
            return None
        return end, loads_strict(text[self._start : end])
