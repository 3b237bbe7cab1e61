"""Small incremental scanners shared by the format parsers.

Model text arrives a few characters at a time; these remember how far they
have read, so each character is looked at once however the text is split.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

__all__ = ["BracketScanner", "held_suffix", "loads_strict", "skip_space"]

_SPACE = re.compile(r"\s*")


def skip_space(text: str, pos: int) -> int:
    """Index of the first non-whitespace character at or after ``pos``."""
    match = _SPACE.match(text, pos)
    return match.end() if match else pos


def held_suffix(text: str, markers: Iterable[str]) -> int:
    """Length of the longest end of ``text`` that could still grow into one of ``markers``.

    >>> held_suffix("see <tool_ca", ["<tool_call>"]), held_suffix("done", ["<tool_call>"])
    (8, 0)
    """
    longest = 0
    size = len(text)
    for marker in markers:
        start = text.find(marker[0], max(0, size - len(marker) + 1))
        while 0 <= start < size - longest:
            if marker.startswith(text[start:]):
                longest = size - start
                break
            start = text.find(marker[0], start + 1)
    return longest


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads_strict(text: str) -> Any:
    """Parse JSON as clients will (no NaN or Infinity), big integers kept exact; ValueError if invalid."""
    return json.loads(text, parse_constant=_reject_constant)


class BracketScanner:
    """Finds where a bracketed value that opens at ``start`` closes, in text that keeps growing.

    Knows string literals (with backslash escapes) so brackets inside them do
    not count. Does not check syntax: the caller parses the closed value.

    >>> s = BracketScanner(0); s.end('{"a": "}"'), s.end('{"a": "}"}')
    (None, 10)
    """

    __slots__ = ("_depth", "_inside", "_outside", "_pos", "_quote", "_quotes")

    def __init__(self, start: int, quotes: str = '"', brackets: str = "{}[]") -> None:
        self._pos = start
        self._depth = 0
        self._quote = ""
        self._quotes = quotes
        self._outside = re.compile("[" + re.escape(quotes + brackets) + "]")
        self._inside = {q: re.compile("[" + re.escape("\\" + q) + "]") for q in quotes}

    def end(self, text: str) -> int | None:
        """Index just past the closing bracket, or None while it has not come yet."""
        pos = self._pos
        size = len(text)
        while pos < size:
            if self._quote:
                inside = self._inside[self._quote].search(text, pos)
                if inside is None:
                    pos = size
                    break
                if inside.group() == "\\":
                    if inside.end() >= size:
                        self._pos = inside.start()  # read the escape again with what follows it
                        return None
                    pos = inside.end() + 1
                    continue
                self._quote = ""
                pos = inside.end()
                continue
            match = self._outside.search(text, pos)
            if match is None:
                pos = size
                break
            char = match.group()
            pos = match.end()
            if char in self._quotes:
                self._quote = char
            elif char in "{[(":
                self._depth += 1
            else:
                self._depth -= 1
                if self._depth <= 0:
                    self._pos = pos
                    return pos
        self._pos = pos
        return None
