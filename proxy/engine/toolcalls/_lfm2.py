"""LFM2 and LFM2.5 calls: a Python list of calls with keyword arguments between two markers.

::

    <|tool_call_start|>[get_weather(city='Paris', days=3), get_weather(city='Oslo')]<|tool_call_end|>

Python call syntax, so Python's own parser reads it (:func:`ast.parse`), and
each argument is a literal read by :func:`ast.literal_eval`: nothing is ever
evaluated. A name may be dotted (``tools.get_weather``); positional
arguments, or anything but literals, make the call malformed.
"""

from __future__ import annotations

import ast

from proxy.engine.toolcalls._calls import dump_arguments
from proxy.engine.toolcalls._events import ParsedCall, Step

__all__ = ["LFM2_OPEN", "Lfm2Parser", "python_calls"]

LFM2_OPEN = "<|tool_call_start|>"
_CLOSE = "<|tool_call_end|>"
_LONGEST = 1 << 20
"""Longest call list read, so that a runaway reply cannot make the parser build a huge tree."""


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}"
    raise ValueError("not a function name")


def python_calls(text: str) -> list[ParsedCall]:
    """The calls in a Python list (or a single call) of keyword-argument calls; ValueError if it is not one.

    >>> python_calls("[f(a=1, b='x'), g.h()]")
    [ParsedCall(name='f', arguments='{"a":1,"b":"x"}', id=None, id_style='openai'), \
ParsedCall(name='g.h', arguments='{}', id=None, id_style='openai')]
    """
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, MemoryError, RecursionError) as exc:
        raise ValueError("not Python") from exc
    nodes = tree.elts if isinstance(tree, (ast.List, ast.Tuple)) else [tree]
    calls = []
    for node in nodes:
        if not isinstance(node, ast.Call) or node.args:
            raise ValueError("not a call with keyword arguments")
        arguments = {}
        for keyword in node.keywords:
            if keyword.arg is None:
                raise ValueError("**arguments")
            arguments[keyword.arg] = ast.literal_eval(keyword.value)
        calls.append(ParsedCall(_name(node.func), dump_arguments(arguments)))
    if not calls:
        raise ValueError("no calls")
    return calls


class Lfm2Parser:
    """Reads the call list after ``<|tool_call_start|>`` once ``<|tool_call_end|>`` has come."""

    counts_malformed = True

    def __init__(self) -> None:
        self._search = 0

    def step(self, text: str, final: bool) -> Step:
        end = text.find(_CLOSE, self._search)
        if end < 0:
            if final or len(text) > _LONGEST:
                return Step("fail")
            self._search = max(0, len(text) - len(_CLOSE) + 1)
            return Step("more")
        try:
            calls = python_calls(text[:end])
        except (ValueError, TypeError, MemoryError, RecursionError):
            return Step("fail")
        return Step("done", end + len(_CLOSE), calls)
