# ruff: noqa: RUF002  # the fullwidth bar is how DeepSeek's tokenizer spells DSML
"""Calls as ``<invoke name="NAME">`` elements of ``<parameter name="K">V</parameter>``: MiniMax M2 and DSML.

MiniMax M2::

    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">Paris</parameter>
    </invoke>
    </minimax:tool_call>

DeepSeek V3.2 and V4 (DSML) write the same elements with a ``｜DSML｜`` prefix on
each tag name, and say on each parameter whether its value is a string
(``string="true"``: the text as it is) or JSON (``string="false"``)::

    <｜DSML｜function_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜function_calls>

One grammar, so one parser, told the prefix and the block's closing tags. Values
without the attribute (MiniMax), and JSON that does not parse, are typed by the
tool's schema (:mod:`._typed`). Each call goes out at its ``</invoke>``; a block
the reply ends inside keeps the calls that closed, and the rest is text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy.engine.toolcalls._calls import dump_arguments
from proxy.engine.toolcalls._events import ParsedCall, Step, StepState
from proxy.engine.toolcalls._scan import loads_strict, skip_space
from proxy.engine.toolcalls._typed import convert_value, parameter_schemas

__all__ = ["InvokeGrammar", "InvokeParser"]

_LONGEST_TAG = 512


@dataclass(frozen=True)
class InvokeGrammar:
    """One family's spelling of the elements: the tag-name prefix and the tags that close a block.

    With no ``closes`` there is no block: each call is one element, and its own opening
    (:attr:`opener`, up to the name) is the start marker (MiniCPM 5).
    """

    prefix: str
    closes: tuple[str, ...]
    invoke: str = "invoke"
    parameter: str = "parameter"
    cdata: bool = False
    """A value may be wrapped in ``<![CDATA[...]]>`` (MiniCPM 5 wraps any with ``<``, ``&`` or a newline)."""

    @property
    def opener(self) -> str:
        return f'<{self.prefix}{self.invoke} name="'

    def pattern(self, element: str) -> re.Pattern[str]:
        return re.compile(rf'<{re.escape(self.prefix)}{element} name="([^"<>]+)"(?:\s+string="(true|false)")?\s*>')


class InvokeParser:
    """Reads the ``<invoke>`` elements after a block's start marker, up to one of the grammar's closes."""

    counts_malformed = True

    def __init__(self, grammar: InvokeGrammar, tools: Mapping[str, Any]) -> None:
        self._closes = grammar.closes
        self._invoke = grammar.pattern(grammar.invoke)
        self._parameter = grammar.pattern(grammar.parameter)
        self._invoke_close = f"</{grammar.prefix}{grammar.invoke}>"
        self._parameter_close = f"</{grammar.prefix}{grammar.parameter}>"
        self._cdata = grammar.cdata
        self._opener = "" if grammar.closes else grammar.opener  # read before the text: the marker
        self._tools = tools
        self._phase = "block" if grammar.closes else "head"
        self._pos = 0
        self._search = 0
        self._last = 0  # end of the last complete call
        self._calls = 0
        self._name = ""
        self._key = ""
        self._string: str | None = None
        self._values: dict[str, Any] = {}

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
                if not self._value(text):
                    return "more"
                continue
            if self._phase == "block" and self._calls and self._text_follows(text):
                return "done"  # an unclosed block: the calls stand, the rest is text
            tag = self._tag(text, final)
            if tag is None:
                return "more"
            if self._phase in ("block", "head"):
                if tag in self._closes:
                    if not self._calls:
                        return "fail"
                    self._last = self._pos
                    return "done"
                match = self._invoke.fullmatch(tag)
                if match is None or match.group(2) is not None:
                    raise ValueError(f"expected <invoke name=...>, not {tag[:40]!r}")
                self._name, self._values, self._phase = match.group(1), {}, "invoke"
            elif tag == self._invoke_close:
                calls.append(self._call())
                self._calls += 1
                self._last, self._phase = self._pos, "block"
                if self._opener:
                    return "done"  # no block: one element is one call
            else:
                match = self._parameter.fullmatch(tag)
                if match is None:
                    raise ValueError(f"expected <parameter name=...> or </invoke>, not {tag[:40]!r}")
                self._key, self._string = match.group(1), match.group(2)
                self._phase, self._search = "value", self._pos

    def _text_follows(self, text: str) -> bool:
        pos = skip_space(text, self._pos)
        return pos < len(text) and text[pos] != "<"

    def _tag(self, text: str, final: bool) -> str | None:
        """The tag at the next non-space character (which is then passed), None until its ``>`` has come."""
        head = self._opener if self._phase == "head" else ""
        pos = self._pos if head else skip_space(text, self._pos)
        if pos >= len(text):
            return None
        if not head and text[pos] != "<":
            raise ValueError("text between the elements")
        end = text.find(">", pos, pos + _LONGEST_TAG)
        if end < 0:
            if final or len(text) - pos >= _LONGEST_TAG:
                raise ValueError("unterminated tag")
            return None
        self._pos = end + 1
        return head + text[pos : end + 1]

    def _value(self, text: str) -> bool:
        index = text.find(self._parameter_close, self._search)
        if index < 0:
            self._search = max(self._pos, len(text) - len(self._parameter_close) + 1)
            return False
        value = text[self._pos : index]
        if self._cdata and value.startswith("<![CDATA[") and value.endswith("]]>"):
            value = value[len("<![CDATA[") : -len("]]>")]
        self._values[self._key] = value if self._string is None else (self._string, value)
        self._pos, self._phase = index + len(self._parameter_close), "invoke"
        return True

    def _call(self) -> ParsedCall:
        schema = parameter_schemas(self._tools, self._name)
        arguments: dict[str, Any] = {}
        for key, raw in self._values.items():
            if isinstance(raw, tuple):
                string, value = raw
                if string == "true":
                    arguments[key] = value
                    continue
                try:
                    arguments[key] = loads_strict(value)
                    continue
                except ValueError:
                    raw = value
            arguments[key] = convert_value(raw, schema.get(key))
        return ParsedCall(self._name, dump_arguments(arguments))
