"""Muse Glimmer replies (its ATEM protocol): messages to recipients, each call an ``<atem:function_calls>`` block.

After the prompt's ``<|start|>assistant`` the model writes messages as harmony does, the
recipient in the header and each message ended by ``<|eom|>`` (more follow) or ``<|eot|>``::

     to=self<|message|>Two cities, two calls.<|eom|>
    <|start|>assistant to=get_weather<|message|><atem:function_calls>
    <atem:invoke name="get_weather">
    <atem:parameter name="city">Paris</atem:parameter>
    </atem:invoke>
    </atem:function_calls><|eom|>
    <|start|>assistant to=user<|message|>It is warm in Paris.<|eot|>

``self`` is reasoning, ``user`` content, any other recipient a tool. So
:class:`~._harmony.HarmonyReader` reads the messages, told this dialect, and a call's body
is :mod:`._invoke`'s grammar with an ``atem:`` prefix (values typed by the tool's schema;
the template writes lists and objects as JSON, strings as they are).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.engine.toolcalls._events import ParsedCall
from proxy.engine.toolcalls._harmony import HarmonyDialect
from proxy.engine.toolcalls._invoke import InvokeGrammar, InvokeParser

__all__ = ["GLIMMER", "GLIMMER_OPEN"]

GLIMMER_OPEN = "<atem:function_calls>"
_ATEM = InvokeGrammar("atem:", ("</atem:function_calls>",))


def _atem_body(name: str, body: str, tools: Mapping[str, Any]) -> list[ParsedCall] | None:
    """The calls of one message's ``<atem:function_calls>`` block; None unless it is that block and only it."""
    text = body.strip()
    if not text.startswith(GLIMMER_OPEN):
        return None
    rest = text[len(GLIMMER_OPEN) :]
    step = InvokeParser(_ATEM, tools).step(rest, final=True)
    if step.state != "done" or rest[step.consumed :].strip():
        return None
    return step.calls or None


GLIMMER = HarmonyDialect(("<|eom|>", "<|eot|>"), "", _atem_body, reasoning_to="self", content_to="user")
