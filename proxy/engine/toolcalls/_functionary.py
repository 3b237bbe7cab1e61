"""Functionary v3.1 calls: ``<function=NAME>{...}</function>``, one after another, then ``<|eom_id|>``.

As its template renders two calls (after the turn's content, on one line)::

    <function=get_weather>{"city": "Paris"}</function><function=get_time>{"city": "Tokyo"}</function><|eom_id|>

Qwen3-Coder opens its calls with ``<function=`` too, but writes XML parameters
after the ``>``; this reader takes only a JSON object there, so it serves
``functionary-v3.1`` alone. Each ``<function=`` block is one call; the
extractor finds the next. ``</function>`` is consumed when it follows, and
not required when the reply ends without it; an end-of-message token after
it (``<|eom_id|>``, ``<|eot_id|>``: the engine may print it) is consumed too.
"""

from __future__ import annotations

import re

from proxy.engine.toolcalls._calls import ValueReader, call_from_object
from proxy.engine.toolcalls._events import ParsedCall, Step
from proxy.engine.toolcalls._scan import skip_space

__all__ = ["FunctionaryParser"]

_HEAD = re.compile(r"(?P<name>[\w.\-/]+)>")
_HEAD_LIMIT = 256
"""Longest name waited for before the block counts as malformed."""
_CLOSE = "</function>"
_END_TOKENS = ("<|eom_id|>", "<|eot_id|>")


class FunctionaryParser:
    """Reads ``NAME>{...}</function>`` after ``<function=``; see :class:`~._events.Step`."""

    counts_malformed = True

    def __init__(self) -> None:
        self._reader: ValueReader | None = None
        self._name = ""
        self._call: tuple[int, ParsedCall] | None = None  # the object's end, and the call

    def step(self, text: str, final: bool) -> Step:
        if self._call is None:
            try:
                self._call = self._read(text)
            except ValueError:
                return Step("fail")
            if self._call is None:
                return Step("fail") if final else Step("more")
        end, call = self._call
        after = _after_call(text, end, final)
        return Step("more") if after is None else Step("done", after, [call])

    def _read(self, text: str) -> tuple[int, ParsedCall] | None:
        """The call once its JSON object has closed, None before; ValueError when it is not one."""
        if self._reader is None:
            head = _HEAD.match(text)
            if head is None:
                if ">" in text or len(text) > _HEAD_LIMIT or not re.fullmatch(r"[\w.\-/]*", text):
                    raise ValueError("no function name after <function=")
                return None
            pos = skip_space(text, head.end())
            if pos == len(text):
                return None
            if text[pos] != "{":
                raise ValueError("no JSON arguments after the name")
            self._name, self._reader = head.group("name"), ValueReader(pos)
        read = self._reader.read(text)
        if read is None:
            return None
        end, value = read
        call = call_from_object({"name": self._name, "arguments": value}, ("arguments",))
        if call is None:
            raise ValueError("the arguments are not an object")
        return end, call


def _after_call(text: str, end: int, final: bool) -> int | None:
    """Where the block ends: past ``</function>`` and an end-of-message token that follow; None while undecided."""
    pos = skip_space(text, end)
    rest = text[pos : pos + len(_CLOSE)]
    if rest == _CLOSE:
        end = pos + len(_CLOSE)
        pos = skip_space(text, end)
    elif not final and _CLOSE.startswith(rest):
        return None
    for token in _END_TOKENS:
        rest = text[pos : pos + len(token)]
        if rest == token:
            return pos + len(token)
        if not final and token.startswith(rest):
            return None
    return end
