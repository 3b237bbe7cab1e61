"""GigaChat 3 and 3.1 calls: one JSON ``{"name": …, "arguments": {…}}`` after the call's own header.

GigaChat 3's template writes a call as a message of its own, in the role ``function call``, after
the assistant's (empty) message::

    <|message_sep|>\\n\\nfunction call<|role_sep|>\\n{"name": "get_weather", "arguments": {"city": "Paris"}}

GigaChat 3.1's marks it with a token, in the assistant's message::

    <|function_call|>{"name": "get_weather", "arguments": {"city": "Paris"}}

Both templates render one call a turn (the first of ``tool_calls``). The JSON is Llama 3's call
object with ``arguments``, so Llama 3's reader (:class:`~._llama3.Llama3Parser`) reads it, ending
at ``<|message_sep|>``. No ID is written; each call gets a new one.
"""

from __future__ import annotations

__all__ = ["GIGACHAT_END", "GIGACHAT_OPENERS"]

GIGACHAT_OPENERS = ("<|function_call|>", "<|message_sep|>\n\nfunction call<|role_sep|>")
"""GigaChat 3.1's token, and GigaChat 3's header of a ``function call`` message."""

GIGACHAT_END = ("<|message_sep|>",)
