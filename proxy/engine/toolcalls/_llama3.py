"""Llama 3.x calls: JSON ``{"name": …, "parameters": {…}}`` and the ``<|python_tag|>`` form.

After ``<|python_tag|>`` come JSON calls (several separated by ``;``) or a
built-in tool call in Python syntax, ``brave_search.call(query="…")``, whose
keyword arguments must be literals. The message may end with ``<|eom_id|>``.

A reply that *starts* with a JSON object (``bare=True``) is a call only when
it has the call's shape and names one of the request's tools; anything else
is an ordinary JSON answer and stays text, uncounted. llama-cpp-python drops
special tokens such as ``<|python_tag|>`` from its text, which leaves exactly
this bare form.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Collection

from proxy.engine.toolcalls._calls import ValueReader, call_from_object, dump_arguments
from proxy.engine.toolcalls._events import ParsedCall, Step, StepState
from proxy.engine.toolcalls._scan import BracketScanner, skip_space

__all__ = ["PYTHON_TAG", "Llama3Parser", "python_call"]

PYTHON_TAG = "<|python_tag|>"
_END_TOKENS = ("<|eom_id|>", "<|eot_id|>")
_KEYS = ("parameters", "arguments")
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*\.?")


def python_call(source: str) -> ParsedCall | None:
    """``tool.call(k=literal, …)`` or ``tool(k=literal, …)`` as a call; None if it is not that.

    >>> python_call('brave_search.call(query="weather in Oslo")')
    ParsedCall(name='brave_search', arguments='{"query":"weather in Oslo"}', id=None, id_style='openai')
    """
    try:
        node = ast.parse(source, mode="eval").body
        if not isinstance(node, ast.Call) or node.args:
            return None
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "call" and isinstance(func.value, ast.Name):
            name = func.value.id
        elif isinstance(func, ast.Name):
            name = func.id
        else:
            return None
        arguments = {}
        for keyword in node.keywords:
            if keyword.arg is None:
                return None
            value = ast.literal_eval(keyword.value)
            arguments[keyword.arg] = list(value) if isinstance(value, tuple) else value
        return ParsedCall(name, dump_arguments(arguments))
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        return None


class Llama3Parser:
    """Reads what follows ``<|python_tag|>``, or, when ``bare``, a reply that opens with ``{``."""

    def __init__(self, known: Collection[str], *, bare: bool = False, ends: tuple[str, ...] = _END_TOKENS) -> None:
        self.counts_malformed = not bare
        self._ends = ends
        self._bare = bare
        self._known = known if bare else None
        self._phase = "item"
        self._pos = 0
        self._last = 0
        self._calls = 0
        self._reader: ValueReader | None = None
        self._scanner: BracketScanner | None = None
        self._start = 0

    def step(self, text: str, final: bool) -> Step:
        calls: list[ParsedCall] = []
        try:
            state = self._advance(text, calls)
        except ValueError:
            state = "fail"
        if state == "more" and final:
            state = "done" if self._calls else "fail"
        if state == "fail" and self._calls:
            state = "done"  # what follows the calls is text
        return Step(state, self._last, calls)

    def _advance(self, text: str, calls: list[ParsedCall]) -> StepState:
        while True:
            pos = skip_space(text, self._pos)
            if self._phase in ("item", "separator") and pos >= len(text):
                return "more"
            if self._phase == "separator":
                if text.startswith(";", pos):
                    self._pos, self._phase = pos + 1, "item"
                    continue
                for token in self._ends:
                    if text.startswith(token, pos):
                        self._last = pos + len(token)
                        return "done"
                if any(token.startswith(text[pos : pos + len(token)]) for token in self._ends):
                    return "more"
                if text[pos] != "{":
                    return "done"
                self._phase = "item"
            if self._phase == "item":
                char = text[pos]
                if char == "{":
                    self._reader, self._phase = ValueReader(pos), "object"
                elif not self._bare and _DOTTED.match(char):
                    self._scanner, self._start, self._phase = None, pos, "python"
                else:
                    return "fail"
            if self._phase == "object":
                assert self._reader is not None
                read = self._reader.read(text)
                if read is None:
                    return "more"
                end, value = read
                call = call_from_object(value, _KEYS, known=self._known)
                if call is None:
                    return "fail"
            else:
                found = self._python(text)
                if found is None:
                    return "more"
                end, call = found
            calls.append(call)
            self._calls += 1
            self._pos = self._last = end
            self._phase = "separator"

    def _python(self, text: str) -> tuple[int, ParsedCall] | None:
        if self._scanner is None:
            match = _DOTTED.match(text, self._start)
            assert match is not None
            if match.end() >= len(text):
                return None
            if text[match.end()] != "(" or match.group().endswith("."):
                raise ValueError("not a call")
            self._scanner = BracketScanner(match.end(), quotes="\"'", brackets="()[]{}")
        end = self._scanner.end(text)
        if end is None:
            return None
        call = python_call(text[self._start : end])
        if call is None:
            raise ValueError("not a literal call")
        return end, call
