"""Functionary v3.2 replies: segments ``RECIPIENT\\nBODY`` joined by ``>>>``, the first opened by the prompt.

Its template ends the generation prompt with ``>>>``, so the model starts by naming a recipient.
As it renders two calls::

    get_weather
    {"city": "Paris"}>>>get_time
    {"city": "Tokyo", "utc_offset": 9}

``all`` is the user: its body is plain content (``all\\nIt is sunny.``). A recipient that is one of
the request's tools makes its body the call's JSON arguments. Nothing else marks a call, so, as
with Llama 3's unmarked JSON call, only a tool the request offers is one; any other segment (a
recipient the request did not offer, a ``>>>`` in prose) stays text and is not counted. A tool's
body that is not one JSON object stays text and is counted as malformed.

The extractor starts every reply inside the first segment, as it starts one inside an opened
``<think>`` (:class:`~._text.TextExtractor`); a reply that writes the ``>>>`` itself reads the same.
Each later segment starts at :data:`SEGMENT`, a marker like any other format's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from proxy.engine.toolcalls._calls import ValueReader, call_from_object
from proxy.engine.toolcalls._events import Step
from proxy.engine.toolcalls._scan import skip_space

__all__ = ["SEGMENT", "USER", "FunctionaryV32Parser"]

SEGMENT = ">>>"
USER = "all"
"""The recipient whose segment is content."""

_RECIPIENT = re.compile(r"[\w.\-/]*")
_RECIPIENT_LIMIT = 256
"""Longest recipient waited for; a longer line is not a segment's head."""


class FunctionaryV32Parser:
    """Reads one segment after ``>>>`` (or the reply's start); see :class:`~._events.Step`.

    ``counts_malformed`` is decided per segment: only a tool's segment that fails is malformed.
    """

    def __init__(self, tools: Mapping[str, Any]) -> None:
        self._tools = tools
        self.counts_malformed = False
        self._start = 0  # where the recipient begins
        self._name = ""
        self._reader: ValueReader | None = None

    def step(self, text: str, final: bool) -> Step:
        if self._reader is None:
            head = self._head(text, final)
            if head is not None:
                return head
        assert self._reader is not None
        try:
            read = self._reader.read(text)
        except ValueError:
            return Step("fail", literal=self._start)
        if read is None:
            return Step("fail", literal=self._start) if final else Step("more")
        end, value = read
        call = call_from_object({"name": self._name, "arguments": value}, ("arguments",))
        return Step("fail", literal=self._start) if call is None else Step("done", end, [call])

    def _head(self, text: str, final: bool) -> Step | None:
        """The step the recipient line decides; None once a tool's arguments are to be read."""
        if text.startswith(SEGMENT):
            self._start = len(SEGMENT)  # the model wrote the prompt's >>> again
        elif SEGMENT.startswith(text) and text and not final:
            return Step("more")
        line = text.find("\n", self._start, self._start + _RECIPIENT_LIMIT + 1)
        name = text[self._start : line if line >= 0 else len(text)]
        if _RECIPIENT.fullmatch(name) is None or (line < 0 and (final or len(name) > _RECIPIENT_LIMIT)):
            return Step("fail", literal=self._start)  # not a segment's head: text (with the >>> read)
        if line < 0:
            return Step("more")
        if name == USER:
            return Step("done", line + 1)
        if name not in self._tools:
            return Step("fail", literal=line + 1)
        self.counts_malformed = True
        pos = skip_space(text, line + 1)
        if pos == len(text):
            return Step("fail", literal=self._start) if final else Step("more")
        if text[pos] != "{":
            return Step("fail", literal=self._start)
        self._name, self._reader = name, ValueReader(pos)
        return None
