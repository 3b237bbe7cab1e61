"""Mistral calls: ``[TOOL_CALLS][{"name", "arguments"}, …]`` and ``[TOOL_CALLS]name[ARGS]{…}``.

The second form (Mistral's v11 tokenizer) may carry its ID:
``[TOOL_CALLS]name[CALL_ID]a1b2c3d4e[ARGS]{…}``. Mistral templates require
IDs of exactly 9 alphanumeric characters, so a call without such an ID gets a
new one in that shape.

llama-cpp-python drops control tokens such as ``[TOOL_CALLS]`` from the text it
returns, so with ``bare=True`` a reply that *starts* with the JSON array is
read as calls too, provided every name is one of the request's tools.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from proxy.engine.toolcalls._calls import ValueReader, call_from_object, dump_arguments
from proxy.engine.toolcalls._events import ParsedCall, Step, StepState
from proxy.engine.toolcalls._scan import skip_space

__all__ = ["TOOL_CALLS", "MistralParser"]

TOOL_CALLS = "[TOOL_CALLS]"
_ARGS = "[ARGS]"
_CALL_ID = "[CALL_ID]"
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_MISTRAL_ID = re.compile(r"[A-Za-z0-9]{9}")
_KEYS = ("arguments", "parameters")


def _mistral_call(call: ParsedCall) -> ParsedCall:
    valid = call.id is not None and _MISTRAL_ID.fullmatch(call.id)
    return ParsedCall(call.name, call.arguments, call.id if valid else None, "mistral")


class MistralParser:
    """Reads what follows ``[TOOL_CALLS]``, or, when ``bare``, a reply that opens with ``[``."""

    def __init__(self, known: Collection[str], *, bare: bool = False) -> None:
        self.counts_malformed = not bare
        self._known = known if bare else None
        self._phase = "start"
        self._pos = 0
        self._last = 0  # end of the last complete call
        self._calls = 0
        self._reader: ValueReader | None = None
        self._name = ""
        self._id: str | None = None

    def step(self, text: str, final: bool) -> Step:
        calls: list[ParsedCall] = []
        try:
            state = self._advance(text, final, calls)
        except ValueError:
            state = "fail"
        if state == "fail":
            return Step("fail", self._last, calls)
        if state == "more" and final:
            return Step("done", self._last, calls) if self._calls else Step("fail", 0, calls)
        return Step(state, self._last, calls)

    def _advance(self, text: str, final: bool, calls: list[ParsedCall]) -> StepState:
        while True:
            pos = skip_space(text, self._pos)
            if pos >= len(text):
                return "more"
            char = text[pos]
            if self._phase == "start":
                if char == "[":
                    self._pos, self._phase = pos + 1, "element"
                elif _NAME.match(char) and self._known is None:
                    self._pos, self._phase = pos, "name"
                else:
                    return "fail"
            elif self._phase == "element":
                if char != "{":
                    return "fail"
                self._reader, self._phase = ValueReader(pos), "object"
            elif self._phase == "object":
                assert self._reader is not None
                read = self._reader.read(text)
                if read is None:
                    return "more"
                end, value = read
                call = call_from_object(value, _KEYS, known=self._known)
                if call is None:
                    return "fail"
                self._emit(call, end, calls)
                self._pos, self._phase = end, "separator"
            elif self._phase == "separator":
                if char == ",":
                    self._pos, self._phase = pos + 1, "element"
                elif char == "]":
                    self._last = pos + 1
                    return "done"
                else:
                    return "done"  # an unclosed list: the calls stand, the rest is text
            elif self._phase == "name":
                return self._named(text, final, calls)

    def _named(self, text: str, final: bool, calls: list[ParsedCall]) -> StepState:
        """``name[CALL_ID]id[ARGS]{…}``, the ID part optional."""
        while True:
            if self._reader is not None:
                read = self._reader.read(text)
                if read is None:
                    return "more"
                end, value = read
                if not isinstance(value, dict):
                    return "fail"
                self._emit(ParsedCall(self._name, dump_arguments(value), self._id), end, calls)
                return "done"
            if self._pos >= len(text):
                return "more"
            match = _NAME.match(text, self._pos)
            if match is None or match.end() >= len(text):
                return "fail" if match is None else "more"
            head = text[match.end() : match.end() + len(_CALL_ID)]
            if not self._name and head.startswith(_CALL_ID):
                self._name, self._pos = match.group(), match.end() + len(_CALL_ID)
                continue
            if head.startswith(_ARGS):
                if self._name:
                    self._id = match.group()
                else:
                    self._name = match.group()
                start = skip_space(text, match.end() + len(_ARGS))
                if start >= len(text):
                    return "more"
                if text[start] != "{":
                    return "fail"
                self._reader = ValueReader(start)
                continue
            if _CALL_ID.startswith(head) or _ARGS.startswith(head):
                return "more"
            return "fail"

    def _emit(self, call: ParsedCall, end: int, calls: list[ParsedCall]) -> None:
        calls.append(_mistral_call(call))
        self._calls += 1
        self._last = end
