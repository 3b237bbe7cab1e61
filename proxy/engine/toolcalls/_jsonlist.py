"""Calls as one JSON array between a family's two markers.

Several families write all of a turn's calls as a single JSON array of call
objects right after a start marker, and close it with a marker of their own::

    <TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}, ...]</TOOLCALL>
    <|START_ACTION|>[{"tool_call_id": "0", "tool_name": "get_weather", "parameters": {...}}]<|END_ACTION|>
    <|tools_prefix|>[{"get_weather": {"city": "Paris"}}, ...]<|tools_suffix|>

They differ only in the close marker and in how one array element names its
function and arguments, so one parser reads them all, given a
:class:`ListFormat` (:mod:`._nemotron`, :mod:`._cohere`, :mod:`._apertus`).
A new family of this shape is a new description, not a new parser.

The calls go out once the array closes; the close marker is consumed when it
follows, and not required when the reply ends without it. An array that is
not JSON, is empty, or holds anything but calls fails the whole block: its
text stays content and is counted. No family here writes an ID a client
could use (Cohere's ``tool_call_id`` counts calls from 0), so every call gets a new one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy.engine.toolcalls._calls import ValueReader, call_from_object
from proxy.engine.toolcalls._events import ParsedCall, Step
from proxy.engine.toolcalls._scan import skip_space

__all__ = ["ListFormat", "ListParser", "named_call"]

_KEYS = ("arguments", "parameters")


def named_call(value: Any) -> ParsedCall | None:
    """``{"name": ..., "arguments"|"parameters": {...}}``, the common element, as a call.

    >>> named_call({"name": "f", "parameters": {"a": 1}})
    ParsedCall(name='f', arguments='{"a":1}', id=None, id_style='openai')
    """
    call = call_from_object(value, _KEYS)
    return None if call is None else ParsedCall(call.name, call.arguments)


@dataclass(frozen=True)
class ListFormat:
    """One family's array of calls: the marker that closes it, and how an element becomes a call."""

    close: str
    element: Callable[[Any], ParsedCall | None] = named_call
    """An array element as a call, or None when it is not one."""


class ListParser:
    """Reads the JSON array of calls after a :class:`ListFormat`'s start marker; see :class:`~._events.Step`."""

    counts_malformed = True

    def __init__(self, form: ListFormat) -> None:
        self._form = form
        self._reader: ValueReader | None = None
        self._read: tuple[int, list[ParsedCall]] | None = None  # the array's end, and its calls

    def step(self, text: str, final: bool) -> Step:
        if self._read is None:
            try:
                self._read = self._array(text)
            except ValueError:
                return Step("fail")
            if self._read is None:
                return Step("fail") if final else Step("more")
        end, calls = self._read
        close = self._form.close
        pos = skip_space(text, end)
        rest = text[pos : pos + len(close)]
        if rest == close:
            return Step("done", pos + len(close), calls)
        if not final and close.startswith(rest):
            return Step("more")
        return Step("done", end, calls)

    def _array(self, text: str) -> tuple[int, list[ParsedCall]] | None:
        """The array's end and calls once it has closed, None before; ValueError when it holds no calls."""
        if self._reader is None:
            pos = skip_space(text, 0)
            if pos == len(text):
                return None
            if text[pos] != "[":
                raise ValueError("no array of calls after the marker")
            self._reader = ValueReader(pos)
        read = self._reader.read(text)
        if read is None:
            return None
        end, value = read
        calls = [self._form.element(v) for v in value] if isinstance(value, list) else []
        if not calls or None in calls:
            raise ValueError("not an array of calls")
        return end, [c for c in calls if c is not None]
