"""Kimi K3 calls: ``<|open|>call tool="NAME"<|sep|>`` elements in the reply's ``tools`` section.

Kimi K3 writes its whole reply as sections, each opened by ``<|open|>TAG ATTRS<|sep|>`` and
closed by ``<|close|>TAG<|sep|>``: reasoning in ``think`` (read as reasoning, its markers from
the template), the answer in ``response``, then the calls in ``tools``. As its template renders
two calls (on one line)::

    <|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>
    <|open|>call tool="get_weather" index="1"<|sep|>
    <|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>
    <|close|>call<|sep|>...<|close|>tools<|sep|>

Each argument says its JSON type: a ``string`` is the text as it is, any other type is the
value's JSON (text that does not parse is typed by the tool's schema, :mod:`._typed`). A call
may instead hold its arguments as one ``<|open|>json type="object"<|sep|>{...}<|close|>json<|sep|>``.
Attribute values escape ``&`` and ``"`` as ``&amp;`` and ``&quot;``. The ``response`` section's
own tokens are not content: they are the format's :data:`KIMI_K3_WRAPPERS`, which the extractor
drops. A call goes out at its ``<|close|>call<|sep|>``; a section the reply ends inside keeps the
calls that closed, and the rest is text.

Written by hand: the element readers beside it (:mod:`._invoke`, :mod:`._minimax_m3`) read
``<...>`` tags, and here a tag is two special tokens around a name and its attributes.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping
from typing import Any

from proxy.engine.toolcalls._calls import dump_arguments
from proxy.engine.toolcalls._events import ParsedCall, Step, StepState
from proxy.engine.toolcalls._scan import loads_strict, skip_space
from proxy.engine.toolcalls._typed import convert_value, parameter_schemas

__all__ = ["KIMI_K3_OPEN", "KIMI_K3_TOKENS", "KIMI_K3_WRAPPERS", "KimiK3Parser"]

_OPEN = "<|open|>"
_CLOSE = "<|close|>"
_SEP = "<|sep|>"
KIMI_K3_TOKENS = (_OPEN, _SEP)
"""The tokens every tag is made of: a template that writes both teaches this format."""
KIMI_K3_OPEN = f"{_OPEN}tools{_SEP}"
KIMI_K3_WRAPPERS = (f"{_OPEN}response{_SEP}", f"{_CLOSE}response{_SEP}", f"{_CLOSE}message{_SEP}", "<|end_of_msg|>")
"""The tokens around the answer and the message, which are not content."""

_LONGEST_TAG = 512
_TAG = re.compile(r"(\w+)((?:\s+\w+=\"[^\"]*\")*)\s*")
_ATTRIBUTE = re.compile(r'(\w+)="([^"]*)"')


class KimiK3Parser:
    """Reads the ``call`` elements after ``<|open|>tools<|sep|>``, up to ``<|close|>tools<|sep|>``."""

    counts_malformed = True

    def __init__(self, tools: Mapping[str, Any]) -> None:
        self._tools = tools
        self._phase = "block"  # block, call, value
        self._pos = 0
        self._search = 0
        self._last = 0  # end of the last complete call
        self._calls = 0
        self._name = ""
        self._value_tag = ""  # argument or json
        self._attributes: dict[str, str] = {}
        self._arguments: dict[str, Any] = {}

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
                return "done"  # an unclosed section: the calls stand, the rest is text
            tag = self._tag(text, final)
            if tag is None:
                return "more"
            opens, name, attributes = tag
            if self._phase == "block":
                if not opens and name == "tools":
                    if not self._calls:
                        return "fail"
                    self._last = self._pos
                    return "done"
                if not opens or name != "call" or "tool" not in attributes:
                    raise ValueError(f"expected <|open|>call tool=..., not {name!r}")
                self._name, self._arguments, self._phase = attributes["tool"], {}, "call"
            elif not opens and name == "call":
                calls.append(ParsedCall(self._name, dump_arguments(self._arguments)))
                self._calls += 1
                self._last, self._phase = self._pos, "block"
            elif opens and (name == "json" or (name == "argument" and "key" in attributes)):
                self._value_tag, self._attributes = name, attributes
                self._phase, self._search = "value", self._pos
            else:
                raise ValueError(f"expected an argument, json or the call's close, not {name!r}")

    def _text_follows(self, text: str) -> bool:
        pos = skip_space(text, self._pos)
        piece = text[pos : pos + len(_OPEN)]
        return bool(piece) and not _OPEN.startswith(piece) and not _CLOSE.startswith(piece)

    def _tag(self, text: str, final: bool) -> tuple[bool, str, dict[str, str]] | None:
        """The tag at the next non-space character (then passed): (opens, name, attributes); None until whole."""
        pos = skip_space(text, self._pos)
        if pos >= len(text):
            return None
        opens = text.startswith(_OPEN, pos)
        token = _OPEN if opens else _CLOSE
        if not opens and not text.startswith(_CLOSE, pos):
            piece = text[pos : pos + len(_CLOSE)]
            if not final and (_OPEN.startswith(piece) or _CLOSE.startswith(piece)):
                return None
            raise ValueError("text between the elements")
        start = pos + len(token)
        end = text.find(_SEP, start, start + _LONGEST_TAG)
        if end < 0:
            if final or len(text) - start >= _LONGEST_TAG:
                raise ValueError("unterminated tag")
            return None
        match = _TAG.fullmatch(text, start, end)
        if match is None or (not opens and match.group(2)):
            raise ValueError(f"not a tag: {text[start:end][:40]!r}")
        self._pos = end + len(_SEP)
        attributes = {k: html.unescape(v) for k, v in _ATTRIBUTE.findall(match.group(2))}
        return opens, match.group(1), attributes

    def _value(self, text: str) -> bool:
        close = f"{_CLOSE}{self._value_tag}{_SEP}"
        index = text.find(close, self._search)
        if index < 0:
            self._search = max(self._pos, len(text) - len(close) + 1)
            return False
        value = text[self._pos : index]
        if self._value_tag == "json":
            parsed = loads_strict(value)
            if not isinstance(parsed, dict):
                raise ValueError("the json element does not hold an object")
            self._arguments.update(parsed)
        else:
            key = self._attributes["key"]
            self._arguments[key] = self._typed(key, value, self._attributes.get("type"))
        self._pos, self._phase = index + len(close), "call"
        return True

    def _typed(self, key: str, value: str, kind: str | None) -> Any:
        if kind == "string":
            return value
        if kind is not None:
            try:
                return loads_strict(value)
            except ValueError:
                pass
        return convert_value(value, parameter_schemas(self._tools, self._name).get(key))
