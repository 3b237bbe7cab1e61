"""Tool calls and reasoning lifted out of raw model text, for engines that leave them there.

Formats (``tool_call_format``): ``hermes`` (also Qwen 2.5 and Qwen 3),
``qwen3-coder``, ``mistral``, ``llama3``, ``deepseek-v3.1`` and ``deepseek-r1``,
``dsml`` (DeepSeek V3.2 and V4), ``kimi-k2``, ``harmony`` (gpt-oss), ``glm``
(also Ling, Spark, Laguna), ``minimax-m1``, ``minimax-m2``, ``gemma4``, ``lfm2``
(LFM2 and LFM2.5), ``seed-oss``, ``minicpm5`` (MiniCPM 5), ``hy3`` (Hunyuan
Hy3), ``glimmer`` (Muse Glimmer), ``solar-open``, ``gigachat`` (GigaChat 3
and 3.1), ``minimax-m3``, ``nemotron`` (Nemotron Nano v2), ``cohere`` (Command
R7B, Cohere2), ``apertus``, ``functionary-v3.1``, ``functionary-v3.2``,
``kimi-k3`` (Kimi K3), or ``auto`` for every marked form.
The core is :class:`TextExtractor`, a stream transducer over text;
:class:`ChunkExtractor` applies it to a stream of chunk dicts and
:func:`extract_completion` to a whole reply.
"""

from proxy.engine.toolcalls._chunks import ChunkExtractor, Note, extract_completion
from proxy.engine.toolcalls._detect import detect_tool_call_format, template_opens_think
from proxy.engine.toolcalls._events import Content, Event, IdSource, Reasoning, ToolCall, random_call_id
from proxy.engine.toolcalls._reasoning import ReasoningForm, template_reasoning
from proxy.engine.toolcalls._text import (
    CONTENT_WRAPPERS,
    DEFAULT_REASONING_MARKERS,
    FORMATS,
    MESSAGE_DIALECTS,
    OPENED_BY_PROMPT,
    ExtractOptions,
    TextExtractor,
)
from proxy.engine.toolcalls._typed import convert_value

__all__ = [
    "CONTENT_WRAPPERS",
    "DEFAULT_REASONING_MARKERS",
    "FORMATS",
    "MESSAGE_DIALECTS",
    "OPENED_BY_PROMPT",
    "ChunkExtractor",
    "Content",
    "Event",
    "ExtractOptions",
    "IdSource",
    "Note",
    "Reasoning",
    "ReasoningForm",
    "TextExtractor",
    "ToolCall",
    "convert_value",
    "detect_tool_call_format",
    "extract_completion",
    "random_call_id",
    "template_opens_think",
    "template_reasoning",
]
