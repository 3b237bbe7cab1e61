"""Solar Open calls: ``<|tool_call:begin|>ID<|tool_call:name|>NAME<|tool_call:args|>{…}`` in a section.

As upstage's Solar Open 100B template renders two calls::

    <|tool_calls|><|tool_call:begin|>Kq7Zt3Wm9<|tool_call:name|>get_weather<|tool_call:args|>
    {"city": "Paris"}<|tool_call:end|><|tool_call:begin|>...<|tool_call:end|><|calls|>

The shape of DeepSeek's and Kimi's sections (:mod:`._sectioned`), so it is a description only.
The ID the model writes before the name is its own invention, nine characters it cannot check
against the conversation; the call gets a new one, and the template writes whatever ID the
client sends back with the result.

A plain answer is a message of its own, ``<|content|>`` then the text then ``<|end|>`` (after
reasoning, ``<|begin|>assistant`` opens it): those tokens are :data:`SOLAR_WRAPPERS`, not
content, and the extractor drops them.
"""

from __future__ import annotations

import re

from proxy.engine.toolcalls._sectioned import SectionFormat

__all__ = ["SOLAR", "SOLAR_SECTION", "SOLAR_WRAPPERS"]

SOLAR_SECTION = "<|tool_calls|>"
SOLAR_WRAPPERS = ("<|begin|>assistant", "<|content|>", "<|end|>")

SOLAR = SectionFormat(
    section=SOLAR_SECTION,
    call="<|tool_call:begin|>",
    call_end="<|tool_call:end|>",
    section_end="<|calls|>",
    heads=(re.compile(r"\s*[\w\-]*\s*<\|tool_call:name\|>\s*(?P<name>[\w.\-/]+)\s*<\|tool_call:args\|>\s*"),),
)
