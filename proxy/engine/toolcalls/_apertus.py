"""Apertus calls: a JSON array of one-key objects, each the function's name holding its arguments.

As its template renders two calls (after the turn's content)::

    <|tools_prefix|>[{"get_weather": {"city": "Paris"}}, {"get_time": {"city": "Tokyo"}}]<|tools_suffix|>

The array is read by :mod:`._jsonlist`.
"""

from __future__ import annotations

from typing import Any

from proxy.engine.toolcalls._calls import call_from_object
from proxy.engine.toolcalls._events import ParsedCall
from proxy.engine.toolcalls._jsonlist import ListFormat

__all__ = ["APERTUS", "APERTUS_OPEN"]

APERTUS_OPEN = "<|tools_prefix|>"


def _named_object(value: Any) -> ParsedCall | None:
    """``{NAME: {...}}`` as a call; None for anything with more or fewer keys.

    >>> _named_object({"f": {"a": 1}}), _named_object({"f": {}, "g": {}})
    (ParsedCall(name='f', arguments='{"a":1}', id=None, id_style='openai'), None)
    """
    if not isinstance(value, dict) or len(value) != 1:
        return None
    ((name, arguments),) = value.items()
    return call_from_object({"name": name, "arguments": arguments}, ("arguments",))


APERTUS = ListFormat("<|tools_suffix|>", _named_object)
