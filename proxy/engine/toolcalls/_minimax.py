"""MiniMax calls: M2's ``<minimax:tool_call>`` of ``<invoke>`` elements, and M1's ``<tool_calls>`` of JSON lines.

M2 (the grammar is :mod:`._invoke`'s)::

    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">Paris</parameter>
    </invoke>
    </minimax:tool_call>

M1, one JSON object a line::

    <tool_calls>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    {"name": "get_weather", "arguments": {"city": "Oslo"}}
    </tool_calls>

A JSON array of such objects in the same tag is read too: it is how Apriel
writes its calls.
"""

from __future__ import annotations

from proxy.engine.toolcalls._calls import ValueReader, call_from_object
from proxy.engine.toolcalls._events import ParsedCall, Step, StepState
from proxy.engine.toolcalls._invoke import InvokeGrammar
from proxy.engine.toolcalls._scan import skip_space

__all__ = ["MINIMAX_M1_OPEN", "MINIMAX_M2", "MINIMAX_M2_OPEN", "MiniMaxM1Parser"]

MINIMAX_M2_OPEN = "<minimax:tool_call>"
MINIMAX_M2 = InvokeGrammar("", ("</minimax:tool_call>",))
MINIMAX_M1_OPEN = "<tool_calls>"
_M1_CLOSE = "</tool_calls>"
_KEYS = ("arguments", "parameters")


class MiniMaxM1Parser:
    """Reads the JSON call objects after ``<tool_calls>``, up to ``</tool_calls>``."""

    counts_malformed = True

    def __init__(self) -> None:
        self._pos = 0
        self._last = 0  # end of the last complete call
        self._calls = 0
        self._reader: ValueReader | None = None

    def step(self, text: str, final: bool) -> Step:
        calls: list[ParsedCall] = []
        try:
            state = self._advance(text, final, calls)
        except ValueError:
            state = "fail"
        if state == "more" and final:
            state = "done" if self._calls and self._reader is None else "fail"
        return Step(state, self._last, calls)

    def _advance(self, text: str, final: bool, calls: list[ParsedCall]) -> StepState:
        while True:
            if self._reader is not None:
                read = self._reader.read(text)
                if read is None:
                    return "more"
                end, value = read
                found = [call_from_object(v, _KEYS) for v in (value if isinstance(value, list) else [value])]
                if not found or None in found:
                    return "fail"
                calls.extend(c for c in found if c is not None)
                self._calls += len(found)
                self._reader, self._pos = None, end
                self._last = end
                continue
            pos = skip_space(text, self._pos)
            rest = text[pos : pos + len(_M1_CLOSE)]
            if rest.startswith(("{", "[")):
                self._reader = ValueReader(pos)
            elif rest == _M1_CLOSE:
                if not self._calls:
                    return "fail"
                self._last = pos + len(_M1_CLOSE)
                return "done"
            elif _M1_CLOSE.startswith(rest):
                return "more"
            else:
                return "done" if self._calls else "fail"  # an unclosed block: the calls stand, the rest is text
