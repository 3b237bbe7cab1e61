"""What a chat template says about the model's output: its tool-call format, and open reasoning.

Pure functions over the template's Jinja source, for whoever knows the
template in use (``toolpair serve`` does; a sidecar does not, and uses
``auto`` or the configured format).
"""

from __future__ import annotations

import re

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
    if "<function=" in template and "<parameter=" in template:
        return "qwen3-coder"
    if "<arg_key>" in template and "<arg_value>" in template:
        return "glm"
    if "<|tool_call>" in template and "<tool_call|>" in template:
        return "gemma4"
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


def template_opens_think(template: str) -> bool:
    """Whether the generation prompt ends inside ``<think>``, so the reply starts as reasoning.

    >>> template_opens_think("{% if add_generation_prompt %}{{ '<|Assistant|><think>\\n' }}{% endif %}")
    True
    >>> template_opens_think("{% if add_generation_prompt %}<think>\\n\\n</think>\\n\\n{% endif %}")
    False
    """
    start = template.rfind("add_generation_prompt")
    if start < 0:
        return False
    block = template[start:]
    end = _ENDIF.search(block)
    if end is not None:
        block = block[: end.start()]
    return "<think>" in block and "</think>" not in block
