"""Render a Chat Completions request into the prompt text the engine will read.

``count_tokens`` must be exact, so toolpair renders the translated request the
way llama-cpp-python's ``hf-tokenizer-config`` chat format does, then lets the
engine tokenize that text (see ``proxy/dialects/anthropic/routes.py``). Rendering as
llama-cpp-python does means three things:

- the request first passes its pydantic models, which keep only the keys they
  declare (a ``reasoning_content`` or a tool's ``strict`` never reaches the
  template);
- an empty assistant message is appended, to open the reply;
- the template is rendered in a sandboxed jinja2 environment with
  ``trim_blocks`` and ``lstrip_blocks``, given ``messages``, ``tools``,
  ``tool_choice``, ``functions``, ``function_call``, ``bos_token`` and
  ``eos_token``.

:func:`estimate_tokens` is the fallback when no template or no tokenizer is
available: one token for every four bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import orjson
from jinja2 import Template
from jinja2.sandbox import ImmutableSandboxedEnvironment

from proxy._types import Body

__all__ = ["ChatTemplate", "TemplateError", "estimate_tokens", "engine_view"]

BYTES_PER_TOKEN = 4
"""The estimate's ratio: English prose runs 4-5 bytes a token, code and JSON 3-4."""


class TemplateError(ValueError):
    """Raised when a template file cannot be read or used."""


def estimate_tokens(size: int) -> int:
    """A rough token count for ``size`` bytes of text: one token per :data:`BYTES_PER_TOKEN`, rounded up.

    >>> estimate_tokens(8), estimate_tokens(9), estimate_tokens(0)
    (2, 3, 0)
    """
    return -(-max(0, size) // BYTES_PER_TOKEN)


# The keys llama-cpp-python's request models declare, per message role.
_MESSAGE_KEYS = {
    "system": ("role", "content"),
    "user": ("role", "content"),
    "assistant": ("role", "content", "tool_calls", "function_call"),
    "tool": ("role", "content", "tool_call_id"),
    "function": ("role", "content", "name"),
}


def _part(part: Any) -> Any:
    if isinstance(part, dict) and part.get("type") == "text":
        return {"type": "text", "text": part.get("text")}
    if isinstance(part, dict) and part.get("type") == "image_url":
        return {"type": "image_url", "image_url": part.get("image_url")}
    return part


def _message(message: Any) -> Any:
    if not isinstance(message, dict):
        return message
    keys = _MESSAGE_KEYS.get(message.get("role", ""), tuple(message))
    out = {key: message[key] for key in keys if key in message}
    if isinstance(out.get("content"), list):
        out["content"] = [_part(part) for part in out["content"]]
    if isinstance(out.get("tool_calls"), list):
        out["tool_calls"] = [
            {"id": c.get("id"), "type": c.get("type"), "function": c.get("function")} if isinstance(c, dict) else c
            for c in out["tool_calls"]
        ]
    return out


def _tool(tool: Any) -> Any:
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(function, dict):
        return tool
    kept = {key: function[key] for key in ("name", "description", "parameters") if key in function}
    return {"type": tool.get("type"), "function": kept}


def engine_view(body: Body) -> Body:
    """The render inputs of a Chat body as llama-cpp-python's request models leave them.

    >>> engine_view({"messages": [{"role": "assistant", "content": "", "reasoning_content": "hm"}],
    ...              "tools": [{"type": "function", "function": {"name": "f", "parameters": {}, "strict": True}}]})
    {'messages': [{'role': 'assistant', 'content': ''}], 'tools': [{'type': 'function', \
'function': {'name': 'f', 'parameters': {}}}], 'tool_choice': None}
    """
    messages = body.get("messages")
    tools = body.get("tools")
    return {
        "messages": [_message(m) for m in messages] if isinstance(messages, list) else [],
        "tools": [_tool(t) for t in tools] if isinstance(tools, list) else None,
        "tool_choice": body.get("tool_choice"),
    }


@dataclass(frozen=True)
class ChatTemplate:
    """A Hugging Face ``tokenizer_config.json``-style chat template, rendered as llama-cpp-python does."""

    source: str
    bos_token: str
    eos_token: str
    path: str = ""

    @classmethod
    def from_file(cls, path: str | Path) -> ChatTemplate:
        try:
            config = orjson.loads(Path(path).read_bytes())
        except OSError as exc:
            raise TemplateError(f"cannot read chat template {path}: {exc.strerror}") from None
        except orjson.JSONDecodeError as exc:
            raise TemplateError(f"chat template {path} is not JSON: {exc}") from None
        if not isinstance(config, dict) or not all(
            isinstance(config.get(key), str) for key in ("chat_template", "bos_token", "eos_token")
        ):
            raise TemplateError(f"chat template {path} needs string chat_template, bos_token and eos_token")
        try:
            _compiled(config["chat_template"])
        except Exception as exc:  # a jinja2 syntax error
            raise TemplateError(f"chat template {path} does not compile: {exc}") from None
        return cls(config["chat_template"], config["bos_token"], config["eos_token"], str(path))

    def render(self, body: Body) -> str:
        """The prompt text for a Chat Completions body, the generation prompt included.

        Raises :class:`TemplateError` when the template fails on this request.

        >>> ChatTemplate("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}", "", "").render(
        ...     {"messages": [{"role": "user", "content": "Hi"}]})
        '<user>Hi<assistant>'
        """
        view = engine_view(body)
        messages = [*view["messages"], {"role": "assistant", "content": ""}]
        try:
            return _compiled(self.source).render(
                messages=messages,
                functions=None,
                function_call=None,
                tools=view["tools"],
                tool_choice=view["tool_choice"],
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except Exception as exc:  # jinja2 raises anything a template does
            raise TemplateError(f"chat template failed on this request: {exc}") from exc


@lru_cache(maxsize=8)
def _compiled(source: str) -> Template:
    return ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(source)
