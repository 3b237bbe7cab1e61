"""Command R7B and Cohere2 calls: a JSON array of ``tool_name``/``parameters`` objects in an action.

As their templates render two calls (after the turn's reasoning, ``<|START_THINKING|>…<|END_THINKING|>``)::

    <|START_ACTION|>[
        {"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"city": "Paris"}},
        {"tool_call_id": "1", "tool_name": "get_time", "parameters": {"city": "Tokyo"}}
    ]<|END_ACTION|>

The array is read by :mod:`._jsonlist`. ``tool_call_id`` is the call's index in
the conversation, which the templates write back themselves from the client's
IDs; it is not kept (a client needs IDs unique across the conversation).

A plain answer stands between tokens of its own (``<|START_RESPONSE|>…<|END_RESPONSE|>`` in
Command R7B, ``<|START_TEXT|>…<|END_TEXT|>`` in Cohere2), which are not content: they are
:data:`COHERE_WRAPPERS`, which the extractor drops.
"""

from __future__ import annotations

from typing import Any

from proxy.engine.toolcalls._calls import call_from_object
from proxy.engine.toolcalls._events import ParsedCall
from proxy.engine.toolcalls._jsonlist import ListFormat

__all__ = ["COHERE", "COHERE_OPEN", "COHERE_WRAPPERS"]

COHERE_OPEN = "<|START_ACTION|>"
COHERE_WRAPPERS = ("<|START_RESPONSE|>", "<|END_RESPONSE|>", "<|START_TEXT|>", "<|END_TEXT|>")


def _action(value: Any) -> ParsedCall | None:
    """One element of the action's array as a call.

    >>> _action({"tool_call_id": "0", "tool_name": "f", "parameters": {"a": 1}})
    ParsedCall(name='f', arguments='{"a":1}', id=None, id_style='openai')
    """
    if not isinstance(value, dict):
        return None
    return call_from_object({"name": value.get("tool_name"), "arguments": value.get("parameters")}, ("arguments",))


COHERE = ListFormat("<|END_ACTION|>", _action)
