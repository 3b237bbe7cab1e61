"""Each API's thinking controls, as the switch the engine reads: one mapping for every route.

Clients say "think" or "don't" in their API's own words: Anthropic ``thinking`` (``enabled``
with ``budget_tokens``, ``adaptive``, ``disabled``) and ``output_config.effort``, Responses
``reasoning.effort``, Chat ``reasoning_effort``. A local model's switch is its chat template's
``enable_thinking`` variable (Qwen3, DeepSeek V3.1, GLM, Granite, ...; a template without it
ignores it) and, for templates that read it, ``reasoning_effort`` (gpt-oss). llama-server takes
both per request as ``chat_template_kwargs``, and a thinking budget as
``reasoning_budget_tokens`` (checked against its build 11434: its ``/v1/messages`` maps
``thinking`` to neither, and passes ``chat_template_kwargs`` through; ``docs/apis.md`` has the
table). toolpair's engine for ``toolpair serve`` takes ``chat_template_kwargs`` per request too
(:mod:`engine_launcher.inside.engine_main`).

Pure: :func:`anthropic_switch`, :func:`responses_switch` and :func:`chat_switch` read a request;
:func:`with_switch` returns the body with the switch added, the client's own
``chat_template_kwargs`` winning key by key, or the same body when there is nothing to add.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy._types import Body
from proxy.errors import ClientInputError

__all__ = ["NO_SWITCH", "ThinkingSwitch", "anthropic_switch", "chat_switch", "responses_switch", "with_switch"]

BUDGET_FIELD = "reasoning_budget_tokens"
"""llama-server's per-request thinking budget (Chat and Responses bodies)."""

_ANTHROPIC_EFFORTS = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}
"""Anthropic's efforts as the three that templates know (gpt-oss: low, medium, high)."""

_OPENAI_EFFORTS: dict[str, tuple[bool, str | None]] = {
    "none": (False, None),
    "minimal": (True, "low"),
    "low": (True, "low"),
    "medium": (True, "medium"),
    "high": (True, "high"),
    "xhigh": (True, "high"),
}
"""OpenAI's ``reasoning_effort`` values: whether to think, and at what effort."""


@dataclass(frozen=True)
class ThinkingSwitch:
    """What a request asked of the model's thinking; None where it said nothing."""

    enable: bool | None = None
    effort: str | None = None
    """``low``, ``medium`` or ``high``."""
    budget: int | None = None
    """Tokens the thinking may take (Anthropic ``budget_tokens``)."""

    @property
    def asked(self) -> bool:
        return self.enable is not None or self.effort is not None or self.budget is not None


NO_SWITCH = ThinkingSwitch()


def anthropic_switch(thinking: object, output_config: object = None) -> ThinkingSwitch:
    """Anthropic's ``thinking`` and ``output_config.effort``.

    ``enabled`` (with its budget), ``adaptive`` and ``between_tools`` turn thinking on, ``disabled``
    off; efforts above ``high`` are ``high``.

    >>> anthropic_switch({"type": "adaptive"}, {"effort": "max"})
    ThinkingSwitch(enable=True, effort='high', budget=None)
    >>> anthropic_switch({"type": "enabled", "budget_tokens": 2048})
    ThinkingSwitch(enable=True, effort=None, budget=2048)
    >>> anthropic_switch({"type": "disabled"}).enable
    False
    """
    enable: bool | None = None
    budget: int | None = None
    if isinstance(thinking, dict):
        kind = thinking.get("type")
        if kind in ("enabled", "adaptive", "between_tools"):
            enable = True
            tokens = thinking.get("budget_tokens")
            if kind == "enabled" and isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0:
                budget = tokens
        elif kind == "disabled":
            enable = False
    elif thinking is not None:
        raise ClientInputError("thinking must be an object", param="thinking")
    effort = output_config.get("effort") if isinstance(output_config, dict) else None
    return ThinkingSwitch(enable, _ANTHROPIC_EFFORTS.get(effort) if isinstance(effort, str) else None, budget)


def _openai_effort(effort: object) -> ThinkingSwitch:
    if not isinstance(effort, str) or effort not in _OPENAI_EFFORTS:
        return NO_SWITCH
    enable, level = _OPENAI_EFFORTS[effort]
    return ThinkingSwitch(enable, level)


def responses_switch(reasoning: object) -> ThinkingSwitch:
    """Responses ``reasoning.effort``: ``none`` turns thinking off, any other effort on.

    >>> responses_switch({"effort": "none"}), responses_switch({"effort": "xhigh"}).effort
    (ThinkingSwitch(enable=False, effort=None, budget=None), 'high')
    """
    return _openai_effort(reasoning.get("effort")) if isinstance(reasoning, dict) else NO_SWITCH


def chat_switch(body: Body) -> ThinkingSwitch:
    """Chat ``reasoning_effort``, as for Responses.

    >>> chat_switch({"reasoning_effort": "minimal"})
    ThinkingSwitch(enable=True, effort='low', budget=None)
    """
    return _openai_effort(body.get("reasoning_effort"))


def with_switch(body: Body, switch: ThinkingSwitch, *, budget: bool = True) -> Body:
    """``body`` with the switch as the engine reads it; the client's own keys win.

    ``chat_template_kwargs`` gets ``enable_thinking`` and ``reasoning_effort`` where the client's own
    ``chat_template_kwargs`` does not set them; ``reasoning_budget_tokens`` is added when thinking is on
    with a budget, ``budget`` allows it (the route reads it) and the client did not send one. The same
    ``body`` comes back when nothing is added.

    >>> with_switch({"chat_template_kwargs": {"enable_thinking": True}}, ThinkingSwitch(False, "low"))
    {'chat_template_kwargs': {'enable_thinking': True, 'reasoning_effort': 'low'}}
    >>> body = {"model": "m"}
    >>> with_switch(body, NO_SWITCH) is body
    True
    """
    if not switch.asked:
        return body
    own: Any = body.get("chat_template_kwargs")
    if own is not None and not isinstance(own, dict):
        raise ClientInputError("chat_template_kwargs must be an object", param="chat_template_kwargs")
    kwargs = dict(own or {})
    if switch.enable is not None:
        kwargs.setdefault("enable_thinking", switch.enable)
    if switch.effort is not None:
        kwargs.setdefault("reasoning_effort", switch.effort)
    changed: Body = {}
    if kwargs != (own or {}):
        changed["chat_template_kwargs"] = kwargs
    thinking = kwargs.get("enable_thinking") is not False
    if budget and switch.budget is not None and thinking and BUDGET_FIELD not in body:
        changed[BUDGET_FIELD] = switch.budget
    return {**body, **changed} if changed else body
