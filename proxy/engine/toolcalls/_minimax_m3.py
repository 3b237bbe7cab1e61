"""MiniMax M3 calls: ``<invoke name="NAME">`` of ``<KEY>V</KEY>`` elements, each tag behind M3's own token.

As MiniMax M3's template renders two calls (line breaks as it writes them)::

    ]<]minimax[>[<tool_call>
    ]<]minimax[>[<invoke name="get_time">]<]minimax[>[<city>Tokyo]<]minimax[>[</city>
    ]<]minimax[>[<utc_offset>9]<]minimax[>[</utc_offset>]<]minimax[>[</invoke>
    ]<]minimax[>[</tool_call>

``]<]minimax[>[`` is the token that tells M3's markup from text that only looks like it, so
every tag is read with it in front, and a ``<city>`` without it is part of a value. Each
parameter is an element named for its key; its text is typed by the tool's schema
(:mod:`._typed`), as MiniMax M2's values are. A call goes out at its ``</invoke>``; a block the
reply ends inside keeps the calls that closed, and the rest is text. Written by hand: M2's
``<parameter name=...>`` reader (:mod:`._invoke`) knows its parameter tag's name in advance,
and here each key is its own tag.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from proxy.engine.toolcalls._events import ParsedCall, Step, StepState
from proxy.engine.toolcalls._scan import skip_space
from proxy.engine.toolcalls._typed import typed_arguments

__all__ = ["MINIMAX_M3_OPEN", "MINIMAX_M3_TOKEN", "MiniMaxM3Parser"]

MINIMAX_M3_TOKEN = "]<]minimax[>["
MINIMAX_M3_OPEN = MINIMAX_M3_TOKEN + "<tool_call>"

_LONGEST_TAG = 512
_INVOKE = re.compile(r'<invoke name="([^"<>]+)">')
_KEY = re.compile(r"<([^\s<>/]+)>")


class MiniMaxM3Parser:
    """Reads the ``<invoke>`` elements after ``]<]minimax[>[<tool_call>``, up to its ``</tool_call>``."""

    counts_malformed = True

    def __init__(self, tools: Mapping[str, Any]) -> None:
        self._tools = tools
        self._phase = "block"  # block, invoke, value
        self._pos = 0
        self._search = 0
        self._last = 0
        self._calls = 0
        self._name = ""
        self._key = ""
        self._values: dict[str, str] = {}

    def step(self, text: str, final: bool) -> Step:
        calls: list[ParsedCall] = []
        try:
            state = self._advance(text, final, calls)
        except ValueError:
            state = "fail"
        if state == "more" and final:
            state = "done" if self._calls and self._phase == "block" else "fail"
        return Step(state, self._last, calls)

    def _advance(self, text: str, final: bool, calls: list[ParsedCall]) -> StepState:
        while True:
            if self._phase == "value":
                close = f"{MINIMAX_M3_TOKEN}</{self._key}>"
                index = text.find(close, self._search)
                if index < 0:
                    self._search = max(self._pos, len(text) - len(close) + 1)
                    return "more"
                self._values[self._key] = text[self._pos : index]
                self._pos, self._phase = index + len(close), "invoke"
                continue
            if self._phase == "block" and self._calls and self._text_follows(text):
                return "done"  # an unclosed block: the calls stand, the rest is text
            tag = self._tag(text, final)
            if tag is None:
                return "more"
            if self._phase == "block":
                if tag == "</tool_call>":
                    if not self._calls:
                        return "fail"
                    self._last = self._pos
                    return "done"
                match = _INVOKE.fullmatch(tag)
                if match is None:
                    raise ValueError(f"expected <invoke name=...>, not {tag[:40]!r}")
                self._name, self._values, self._phase = match.group(1), {}, "invoke"
            elif tag == "</invoke>":
                calls.append(self._call())
                self._calls += 1
                self._last, self._phase = self._pos, "block"
            else:
                match = _KEY.fullmatch(tag)
                if match is None:
                    raise ValueError(f"expected <KEY> or </invoke>, not {tag[:40]!r}")
                self._key, self._phase, self._search = match.group(1), "value", self._pos

    def _text_follows(self, text: str) -> bool:
        pos = skip_space(text, self._pos)
        piece = text[pos : pos + len(MINIMAX_M3_TOKEN)]
        return bool(piece) and not MINIMAX_M3_TOKEN.startswith(piece)

    def _tag(self, text: str, final: bool) -> str | None:
        """The token-led tag at the next non-space character (then passed), None until its ``>`` has come."""
        pos = skip_space(text, self._pos)
        piece = text[pos : pos + len(MINIMAX_M3_TOKEN)]
        if piece != MINIMAX_M3_TOKEN:
            if len(piece) < len(MINIMAX_M3_TOKEN) and MINIMAX_M3_TOKEN.startswith(piece) and not final:
                return None
            raise ValueError("text between the elements")
        start = pos + len(MINIMAX_M3_TOKEN)
        if start >= len(text):
            if final:
                raise ValueError("cut off after the token")
            return None
        if text[start] != "<":
            raise ValueError("the token without a tag")
        end = text.find(">", start, start + _LONGEST_TAG)
        if end < 0:
            if final or len(text) - start >= _LONGEST_TAG:
                raise ValueError("unterminated tag")
            return None
        self._pos = end + 1
        return text[start : end + 1]

    def _call(self) -> ParsedCall:
        return ParsedCall(self._name, typed_arguments(self._tools, self._name, self._values))
