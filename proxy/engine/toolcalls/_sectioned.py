"""Calls in a section of special tokens, each call a head, a JSON object and a closing token.

DeepSeek and Kimi K2 write their calls in one shape: a section token, then per
call an opening token, a *head* that names the function, the arguments as one
JSON object, an optional *tail* and a closing token, then the section's end::

    SECTION (CALL HEAD {json} TAIL CALL_END)+ SECTION_END

So one parser reads them all, given a :class:`SectionFormat` (the tokens and
patterns for the head); the families differ only in that description
(:mod:`._deepseek`, :mod:`._kimi`). A new family of this shape is a new
description, not a new parser.

A call goes out as soon as its JSON object closes; the closing tokens after
it are consumed when they come, and not required when the reply ends without
them. A call cut off or malformed before its object closes fails the block
from there: the calls before it stand, its text stays content and is counted.
No format here carries an ID the client could use, so every call gets a new one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from proxy.engine.toolcalls._calls import ValueReader, dump_arguments
from proxy.engine.toolcalls._events import ParsedCall, Step, StepState
from proxy.engine.toolcalls._scan import skip_space

__all__ = ["SectionFormat", "SectionParser"]

_HEAD_LIMIT = 512
"""Longest head (name and separators) waited for before the block counts as malformed."""


@dataclass(frozen=True)
class SectionFormat:
    """One family's tokens, and how its head names the function."""

    section: str
    """The start marker: the extractor finds it, the parser reads what follows."""
    call: str
    call_end: str
    section_end: str
    heads: tuple[re.Pattern[str], ...]
    """Each matches a whole text between ``call`` and the arguments' ``{``; group ``name`` is the function."""
    tail: tuple[str, ...] = ()
    """Literals that may stand between the arguments and ``call_end`` (DeepSeek R1's closing fence)."""


def _expect(text: str, pos: int, literal: str) -> bool | None:
    """True when ``literal`` stands at ``pos``, None while the text so far could still become it, else False."""
    piece = text[pos : pos + len(literal)]
    if piece == literal:
        return True
    return None if literal.startswith(piece) else False


class SectionParser:
    """Reads what follows a :class:`SectionFormat`'s section token; see :class:`~._events.Step`."""

    counts_malformed = True

    def __init__(self, form: SectionFormat) -> None:
        self._form = form
        self._phase = "between"  # between calls, head, arguments, trailer
        self._pos = 0  # where reading resumes
        self._last = 0  # end of the last complete call, with what closed it
        self._calls = 0
        self._name = ""
        self._reader: ValueReader | None = None
        self._trailer = 0  # which of tail + call_end is next

    def step(self, text: str, final: bool) -> Step:
        calls: list[ParsedCall] = []
        state = self._advance(text, final, calls)
        if state == "more" and final:
            state = "done" if self._phase in ("between", "trailer") else "fail"
        if state == "fail":
            return Step("fail", self._last if self._calls else 0, calls)
        return Step(state, self._last, calls)

    def _advance(self, text: str, final: bool, calls: list[ParsedCall]) -> StepState:
        form = self._form
        while True:
            if self._phase == "between":
                pos = skip_space(text, self._pos)
                if pos >= len(text):
                    return "more"
                opens = _expect(text, pos, form.call)
                if opens:
                    self._pos, self._phase = pos + len(form.call), "head"
                    continue
                closes = _expect(text, pos, form.section_end)
                if closes:
                    self._last = pos + len(form.section_end)
                    return "done" if self._calls else "fail"
                if opens is None or closes is None:
                    return "more"
                return "done" if self._calls else "fail"  # the calls stand; what follows is text
            if self._phase == "head":
                brace = text.find("{", self._pos)
                if brace < 0:
                    return "fail" if len(text) - self._pos > _HEAD_LIMIT else "more"
                match = next((m for h in form.heads if (m := h.fullmatch(text, self._pos, brace))), None)
                if match is None:
                    return "fail"
                self._name = match.group("name")
                self._reader, self._phase = ValueReader(brace), "arguments"
            elif self._phase == "arguments":
                assert self._reader is not None
                try:
                    read = self._reader.read(text)
                except ValueError:
                    return "fail"
                if read is None:
                    return "more"
                end, value = read
                if not isinstance(value, dict):
                    return "fail"
                calls.append(ParsedCall(self._name, dump_arguments(value)))
                self._calls += 1
                self._pos = self._last = end
                self._phase, self._trailer = "trailer", 0
            else:
                trailers = (*form.tail, form.call_end)
                while self._trailer < len(trailers):
                    pos = skip_space(text, self._pos)
                    found = _expect(text, pos, trailers[self._trailer])
                    if found is None:
                        return "more"
                    if found:
                        self._pos = self._last = pos + len(trailers[self._trailer])
                    self._trailer += 1
                self._phase = "between"
