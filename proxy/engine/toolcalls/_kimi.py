"""Kimi K2 calls: ``functions.NAME:0<|tool_call_argument_begin|>{…}`` in a section of its own tokens.

As Kimi K2's template renders two calls (on one line)::

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>
    {"city": "Paris"}<|tool_call_end|><|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>
    {"city": "Tokyo"}<|tool_call_end|><|tool_calls_section_end|>

``functions.NAME:N`` is the model's own call ID, N counting calls in the reply
(moonshotai's template) or across the conversation (Kimi-K2-Instruct's). It
is not kept: with the first, every reply repeats ``functions.get_weather:0``,
and clients need IDs unique across the conversation. Both templates write
that ID back into the history themselves, from the name and their own count,
whatever ID the client sends, so a minted one loses the model nothing.
"""

from __future__ import annotations

import re

from proxy.engine.toolcalls._sectioned import SectionFormat

__all__ = ["KIMI", "KIMI_SECTION"]

KIMI_SECTION = "<|tool_calls_section_begin|>"

KIMI = SectionFormat(
    section=KIMI_SECTION,
    call="<|tool_call_begin|>",
    call_end="<|tool_call_end|>",
    section_end="<|tool_calls_section_end|>",
    heads=(re.compile(r"\s*(?:functions\.)?(?P<name>[\w.\-/]+):\d+\s*<\|tool_call_argument_begin\|>\s*"),),
)
