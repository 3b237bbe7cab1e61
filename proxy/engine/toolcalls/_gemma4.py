"""Gemma 4 calls: ``<|tool_call>call:NAME{key:value,…}<tool_call|>``, with Gemma's own quoting.

::

    <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3,tags:[<|"|>x<|"|>]}<tool_call|>

Keys are bare words; strings sit between ``<|"|>`` marks (so they need no
escapes); numbers, booleans and null are bare JSON words; lists and nested
objects are bracketed. The quoting says what is a string, so no schema is
needed. A call is read once its ``<tool_call|>`` has come; no JSON library
reads this syntax, so it is a small recursive-descent reader here, with a depth
limit for untrusted text.
"""

from __future__ import annotations

import re
from typing import Any

from proxy.engine.toolcalls._calls import dump_arguments
from proxy.engine.toolcalls._events import ParsedCall, Step
from proxy.engine.toolcalls._scan import loads_strict

__all__ = ["GEMMA4_OPEN", "Gemma4Parser", "read_gemma_value"]

GEMMA4_OPEN = "<|tool_call>"
_CLOSE = "<tool_call|>"
_QUOTE = '<|"|>'
_HANDOVER = "<|tool_response>"
"""What Gemma 4 31B's template writes right after a turn's last call instead of ``<turn|>``: the
model hands the turn over to the tools with it. It is the turn's close, not content; an engine
that does not stop on it leaves it in the text, so a parser takes it with the call before it."""
_HEAD = re.compile(r"\s*call:([^\s{<>]+)\s*")
_KEY = re.compile(r"\s*([^\s:,{}\[\]<>]+)\s*:")
_WORD = re.compile(r"[^,{}\[\]<]+")
_SPACE = re.compile(r"\s*")
_DEEPEST = 64


class _Reader:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def space(self) -> None:
        match = _SPACE.match(self.text, self.pos)
        self.pos = match.end() if match else self.pos

    def value(self, depth: int) -> Any:
        if depth > _DEEPEST:
            raise ValueError("nested too deep")
        self.space()
        text, pos = self.text, self.pos
        if text.startswith(_QUOTE, pos):
            end = text.find(_QUOTE, pos + len(_QUOTE))
            if end < 0:
                raise ValueError("unterminated string")
            self.pos = end + len(_QUOTE)
            return text[pos + len(_QUOTE) : end]
        if text.startswith("{", pos):
            return self.mapping(depth)
        if text.startswith("[", pos):
            self.pos += 1
            items: list[Any] = []
            while not self.closes("]", items):
                items.append(self.value(depth + 1))
            return items
        word = _WORD.match(text, pos)
        if word is None:
            raise ValueError(f"no value at {pos}")
        self.pos = word.end()
        return loads_strict(word.group().strip())

    def mapping(self, depth: int) -> dict[str, Any]:
        self.pos += 1  # past "{"
        result: dict[str, Any] = {}
        while not self.closes("}", result):
            self.space()
            if self.text.startswith(_QUOTE, self.pos):
                key = self.value(depth + 1)
                self.space()
                if not self.text.startswith(":", self.pos):
                    raise ValueError("expected ':'")
                self.pos += 1
            else:
                match = _KEY.match(self.text, self.pos)
                if match is None:
                    raise ValueError(f"no key at {self.pos}")
                key, self.pos = match.group(1), match.end()
            result[key] = self.value(depth + 1)
        return result

    def closes(self, bracket: str, so_far: object) -> bool:
        """Past ``bracket`` (True) or a separator (False) once ``so_far`` has items; False at the first."""
        self.space()
        if self.text.startswith(bracket, self.pos):
            self.pos += 1
            return True
        if so_far:
            if not self.text.startswith(",", self.pos):
                raise ValueError(f"expected ',' or {bracket!r}")
            self.pos += 1
        return False


def read_gemma_value(text: str) -> Any:
    """One Gemma-quoted value, the whole of ``text``; ValueError if it is not one.

    >>> read_gemma_value('{a:<|"|>x, y<|"|>,b:[1,true,null],c:{d:-2.5}}')
    {'a': 'x, y', 'b': [1, True, None], 'c': {'d': -2.5}}
    """
    reader = _Reader(text)
    value = reader.value(0)
    reader.space()
    if reader.pos != len(text):
        raise ValueError("text after the value")
    return value


class Gemma4Parser:
    """Reads ``call:NAME{…}`` up to ``<tool_call|>`` after a ``<|tool_call>`` marker, and a
    ``<|tool_response>`` hand-over right after it."""

    counts_malformed = True

    def __init__(self) -> None:
        self._search = 0

    def step(self, text: str, final: bool) -> Step:
        end = text.find(_CLOSE, self._search)
        if end < 0:
            if final:
                return Step("fail")
            self._search = max(0, len(text) - len(_CLOSE) + 1)
            return Step("more")
        head = _HEAD.match(text, 0, end)
        if head is None or not text.startswith("{", head.end()):
            return Step("fail")
        try:
            arguments = read_gemma_value(text[head.end() : end])
        except (ValueError, RecursionError):
            return Step("fail")
        if not isinstance(arguments, dict):
            return Step("fail")
        consumed = end + len(_CLOSE)
        after = text[consumed : consumed + len(_HANDOVER)]
        if after == _HANDOVER:
            consumed += len(_HANDOVER)
        elif not final and _HANDOVER.startswith(after):
            return Step("more")  # the hand-over may be coming
        return Step("done", consumed, [ParsedCall(head.group(1), dump_arguments(arguments))])
