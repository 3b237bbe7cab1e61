"""Which markers a model writes its reasoning between, and whether the prompt already opened them.

Families mark reasoning their own way (``<think>``, Seed's ``<seed:think>``, MiniMax M3's
``<mm:think>``, Kimi K3's ``<|open|>think<|sep|>``, Cohere's ``<|START_THINKING|>``, Hunyuan's
``<think:opensource>``), and many templates open the block in the generation prompt, so the
reply starts inside it with no opening marker at all. Whether they do can depend on template
variables: Qwen3.5's prompt block holds both branches (``<think>\\n`` when thinking is on, a
closed empty block when it is off), which no text search of the template can tell apart.

So both answers come from rendering, as the engine renders: the pair is the one that surrounds
a past turn's reasoning in the render (or, where the template drops past reasoning, the one its
source names), and the prompt opens it when the rendered generation prompt ends with its
opening marker. Pure: template text and variables in, a :class:`ReasoningForm` out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from engine_launcher.templates.chat_template import render_prompt
from engine_launcher.templates.template_check import REASONING_MARKERS

__all__ = ["DEFAULT_REASONING", "REASONING_MARKERS", "ReasoningForm", "template_reasoning"]


@dataclass(frozen=True)
class ReasoningForm:
    """The markers around a model's reasoning, and whether the rendered prompt ends inside them."""

    open: str
    close: str
    opens_in_prompt: bool = False


DEFAULT_REASONING = ReasoningForm("<think>", "</think>")

_PROMPT = "\u2063prompt\u2063"
_REASONING = "\u2063reasoning\u2063"
_ANSWER = "\u2063answer\u2063"


def _render(template: str, messages: list[Any], variables: Mapping[str, Any]) -> str | None:
    try:
        return render_prompt(template, messages, bos_token="", eos_token="", template_kwargs=variables)
    except Exception:  # jinja2 raises anything a template does; this template then tells nothing here
        return None


def _pair_around_reasoning(template: str, variables: Mapping[str, Any]) -> tuple[str, str] | None:
    """The known pair that surrounds a past turn's reasoning in the render, if the template renders it."""
    for field in ("reasoning_content", "thinking", "reasoning"):
        turn = {"role": "assistant", "content": _ANSWER, field: _REASONING}
        text = _render(template, [{"role": "user", "content": _PROMPT}, turn], variables)
        if text is None or _REASONING not in text:
            continue
        before, _, after = text.partition(_REASONING)
        for opening, closing in REASONING_MARKERS:
            if before.rstrip().endswith(opening) and after.lstrip().startswith(closing):
                return opening, closing
    return None


def _pair_named_in(template: str, prompt_tail: str) -> tuple[str, str] | None:
    """The first known pair the template names: both markers, or the opening its prompt ends with.

    The opening alone is not enough: Gemma 4 names ``<|think|>`` as a switch in its system turn, and
    writes neither Solar Open's ``<|end|>`` after it nor ``<|think|>`` at its prompt's end.
    """
    return next(
        ((o, c) for o, c in REASONING_MARKERS if o in template and (c in template or prompt_tail.endswith(o))), None
    )


@lru_cache(maxsize=32)
def _cached(template: str, variables: tuple[tuple[str, Any], ...]) -> ReasoningForm | None:
    return _reasoning(template, dict(variables))


def _reasoning(template: str, given: Mapping[str, Any]) -> ReasoningForm | None:
    prompt = _render(template, [{"role": "user", "content": _PROMPT}], given)
    tail = prompt.rpartition(_PROMPT)[2].rstrip() if prompt is not None else ""
    pair = _pair_around_reasoning(template, given) or _pair_named_in(template, tail)
    if pair is None:
        return None
    return ReasoningForm(pair[0], pair[1], opens_in_prompt=tail.endswith(pair[0]))


def template_reasoning(template: str, variables: Mapping[str, Any] | None = None) -> ReasoningForm | None:
    """How a template's model marks its reasoning, and whether the prompt opens it; None for no reasoning.

    ``variables`` are the template variables the engine renders with (``enable_thinking``, ...).

    >>> qwen = ("{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}"
    ...         "{% if enable_thinking is false %}<think>\\n\\n</think>\\n\\n{% else %}<think>\\n{% endif %}"
    ...         "{% endif %}")
    >>> template_reasoning(qwen)
    ReasoningForm(open='<think>', close='</think>', opens_in_prompt=True)
    >>> template_reasoning(qwen, {"enable_thinking": False}).opens_in_prompt
    False
    >>> template_reasoning("{{ messages[0].content }}") is None
    True
    """
    given = variables or {}
    try:
        return _cached(template, tuple(sorted(given.items())))
    except TypeError:  # a variable that cannot be a cache key (a list, a dict)
        return _reasoning(template, given)
