"""GLM 4.6/4.7 calls (also Ling 3.0, Spark 2.5, Poolside Laguna): key and value pairs after the name.

::

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    <arg_key>days</arg_key>
    <arg_value>3</arg_value>
    </tool_call>

GLM 4.7 writes no newline after the name (``<tool_call>get_weather<arg_key>``).
The template writes a string value as it is and anything else as JSON, so a
value is raw text, typed by the tool's schema (:mod:`._typed`). These calls
share ``<tool_call>`` with Hermes; :class:`~._tagged.TaggedCallParser` tells
them apart by what follows the tag. A call is complete only at
``</tool_call>``: without it, another pair could still have come.

Hunyuan Hy3 writes the same pairs with a suffix on every tag name and a separator
after the name (``<tool_call:opensource>NAME<tool_sep:opensource>``, see :mod:`._hy3`):
the reader is told both.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from proxy.engine.toolcalls._events import ParsedCall
from proxy.engine.toolcalls._scan import skip_space
from proxy.engine.toolcalls._typed import typed_arguments

__all__ = ["ARG_KEY_OPEN", "GlmReader"]

ARG_KEY_OPEN = "<arg_key>"
_ARG_KEY_CLOSE = "</arg_key>"
_ARG_VALUE_OPEN = "<arg_value>"
_ARG_VALUE_CLOSE = "</arg_value>"
_TOOL_CALL_CLOSE = "</tool_call>"
_TAGS = (ARG_KEY_OPEN, _ARG_KEY_CLOSE, _ARG_VALUE_OPEN, _ARG_VALUE_CLOSE, _TOOL_CALL_CLOSE)
_NAME = re.compile(r"[^\s<>]+")
_NAME_END = re.compile(r"[<\s]")
_LONGEST_NAME = 256


class GlmReader:
    """Reads ``NAME`` and its ``<arg_key>``/``<arg_value>`` pairs, from ``start`` up to ``</tool_call>``."""

    __slots__ = ("_key", "_name", "_phase", "_pos", "_search", "_separator", "_tags", "_tools", "_values")

    def __init__(self, start: int, tools: Mapping[str, Any], *, suffix: str = "", separator: str = "") -> None:
        self._tags = tuple(tag.replace(">", suffix + ">") for tag in _TAGS)
        self._separator = separator
        self._pos = start
        self._search = start
        self._phase = "name"
        self._name = ""
        self._key = ""
        self._values: dict[str, str] = {}
        self._tools = tools

    def read(self, text: str, final: bool) -> tuple[int, ParsedCall] | None:
        """``(index of </tool_call>, call)`` once it has come; None while undecided; ValueError if malformed."""
        key_open, key_close, value_open, value_close, call_close = self._tags
        while True:
            if self._phase == "name":
                if not self._read_name(text, final):
                    return None
            elif self._phase == "separator":
                if text.startswith(self._separator, self._pos):
                    self._pos, self._phase = self._pos + len(self._separator), "pair"
                elif self._undecided(text, self._pos, final, (self._separator,)):
                    return None
                else:
                    raise ValueError(f"expected {self._separator}")
            elif self._phase == "pair":
                pos = skip_space(text, self._pos)
                if text.startswith(key_open, pos):
                    self._pos = self._search = pos + len(key_open)
                    self._phase = "key"
                elif text.startswith(call_close, pos):
                    return pos, ParsedCall(self._name, typed_arguments(self._tools, self._name, self._values))
                elif self._undecided(text, pos, final, (key_open, call_close)):
                    return None
                else:
                    raise ValueError(f"expected {key_open} or {call_close}")
            elif self._phase == "value-open":
                pos = skip_space(text, self._pos)
                if text.startswith(value_open, pos):
                    self._pos = self._search = pos + len(value_open)
                    self._phase = "value"
                elif self._undecided(text, pos, final, (value_open,)):
                    return None
                else:
                    raise ValueError(f"expected {value_open}")
            else:
                close = key_close if self._phase == "key" else value_close
                found = self._until(text, close, final)
                if found is None:
                    return None
                if self._phase == "key":
                    self._key, self._phase = found.strip(), "value-open"
                else:
                    self._values[self._key] = found
                    self._phase = "pair"

    @staticmethod
    def _undecided(text: str, pos: int, final: bool, tags: tuple[str, ...]) -> bool:
        rest = text[pos:]
        return not final and any(tag.startswith(rest) for tag in tags)

    def _read_name(self, text: str, final: bool) -> bool:
        end = _NAME_END.search(text, self._pos, self._pos + _LONGEST_NAME + 1)
        if end is None:
            if final or len(text) - self._pos > _LONGEST_NAME:
                raise ValueError("unterminated call name")
            return False
        name = text[self._pos : end.start()]
        if not _NAME.fullmatch(name):
            raise ValueError(f"bad call name {name!r}")
        self._name, self._pos = name, end.start()
        self._phase = "separator" if self._separator else "pair"
        return True

    def _until(self, text: str, close: str, final: bool) -> str | None:
        """The text from the current position to ``close``, which is then passed; None before it comes."""
        index = text.find(close, self._search)
        if index < 0:
            if final:
                raise ValueError(f"no {close}")
            self._search = max(self._pos, len(text) - len(close) + 1)
            return None
        found = text[self._pos : index]
        self._pos = index + len(close)
        return found
