"""What a chat template says about the model's output: its tool-call format, and open reasoning.

Pure functions over the template's Jinja source, for whoever knows the
template in use (``toolpair serve`` does; a sidecar does not, and uses
``auto`` or the configured format).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from proxy.engine.toolcalls._deepseek import DEEPSEEK_CALLS
from proxy.engine.toolcalls._functionary_v32 import SEGMENT, USER
from proxy.engine.toolcalls._glimmer import GLIMMER_OPEN
from proxy.engine.toolcalls._hy3 import HY3_SUFFIX
from proxy.engine.toolcalls._kimi import KIMI_SECTION
from proxy.engine.toolcalls._kimi_k3 import KIMI_K3_TOKENS
from proxy.engine.toolcalls._minicpm import MINICPM5_OPEN
from proxy.engine.toolcalls._minimax_m3 import MINIMAX_M3_TOKEN
from proxy.engine.toolcalls._reasoning import template_reasoning
from proxy.engine.toolcalls._seed import SEED_OPEN
from proxy.engine.toolcalls._solar import SOLAR

__all__ = ["detect_tool_call_format", "template_opens_think"]

_ENDIF = re.compile(r"\{%-?\s*endif")


def detect_tool_call_format(template: str) -> str:
    """The tool-call format a template teaches its model, or ``none``.

    >>> detect_tool_call_format('{{ "<tool_call>\\n" }}{"name": ..., "arguments": ...}')
    'hermes'
    >>> detect_tool_call_format("<tool_call>\\n<function=NAME>\\n<parameter=P>")
    'qwen3-coder'
    >>> detect_tool_call_format("<tool_call>{{ tc.name }}<arg_key>{{ k }}</arg_key><arg_value>")
    'glm'
    >>> detect_tool_call_format("{{ message.content }}")
    'none'
    """
    if GLIMMER_OPEN in template:
        return "glimmer"
    if "<|channel|>" in template and "<|message|>" in template:
        return "harmony"
    if DEEPSEEK_CALLS in template:
        return "deepseek-r1" if "```json" in template else "deepseek-v3.1"
    if KIMI_SECTION in template:
        return "kimi-k2"
    if all(token in template for token in KIMI_K3_TOKENS):
        return "kimi-k3"
    if MINIMAX_M3_TOKEN in template:
        return "minimax-m3"
    if SOLAR.call in template and SOLAR.section in template:
        return "solar-open"
    if "<|function_call|>" in template or ("'function call'" in template and "<|role_sep|>" in template):
        return "gigachat"
    if SEED_OPEN in template:
        return "seed-oss"
    if HY3_SUFFIX in template and "<tool_sep" in template:
        return "hy3"
    if MINICPM5_OPEN in template and '<param name="' in template:
        return "minicpm5"
    if "<function=" in template and "<parameter=" in template:
        return "qwen3-coder"
    if "<arg_key>" in template and "<arg_value>" in template:
        return "glm"
    if "<|tool_call>" in template and "<tool_call|>" in template:
        return "gemma4"
    if "<|tool_call_start|>" in template or "<|tool_list_start|>" in template:
        return "lfm2"
    if "<TOOLCALL>" in template:
        return "nemotron"
    if "<|START_ACTION|>" in template:
        return "cohere"
    if "<|tools_prefix|>" in template:
        return "apertus"
    if SEGMENT + USER in template:
        return "functionary-v3.2"  # '>>>all\n' opens its plain answer
    if "<function=" in template and "</function>" in template:
        return "functionary-v3.1"  # after qwen3-coder, whose <function= holds <parameter=
    if "<minimax:tool_call>" in template:
        return "minimax-m2"
    if "<tool_calls>" in template:
        return "apriel" if "<tool_calls>[" in template else "minimax-m1"
    if "｜DSML｜" in template:  # noqa: RUF001  (DeepSeek spells DSML with fullwidth bars)
        return "dsml"
    if "<tool_call>" in template:
        return "hermes"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|python_tag|>" in template or ("ipython" in template and '"parameters"' in template):
        return "llama3"
    return "none"


def template_opens_think(template: str, variables: Mapping[str, Any] | None = None) -> bool:
    """Whether the rendered generation prompt ends inside the model's reasoning block.

    Rendered, not searched: Qwen3.5's prompt block holds both an opened and a closed ``<think>``,
    and which one the model gets depends on ``variables`` (see :mod:`._reasoning`).

    >>> template_opens_think("{% if add_generation_prompt %}{{ '<|Assistant|><think>\\n' }}{% endif %}")
    True
    >>> template_opens_think("{% if add_generation_prompt %}<think>\\n\\n</think>\\n\\n{% endif %}")
    False
    """
    form = template_reasoning(template, variables)
    return form is not None and form.opens_in_prompt
