"""Render a Chat Completions request into the prompt text the engine will read.

``count_tokens`` must be exact, so toolpair renders the translated request the
way ``toolpair serve``'s engine renders a template file, then lets the engine
tokenize that text (see ``proxy/dialects/anthropic/routes.py``). That means two
things:

- the request first passes llama-cpp-python's pydantic models, which keep only
  the keys they declare (a ``reasoning_content`` or a tool's ``strict`` never
  reaches the template);
- the template is rendered by :func:`engine_launcher.templates.chat_template.render_prompt`:
  transformers' Jinja dialect, a generation prompt, tool-call arguments as objects.

:func:`estimate_tokens` is the fallback when no template or no tokenizer is
available: one token for every four bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import orjson

from engine_launcher.builder.template_file import TemplateFileError, template_file_parts
from engine_launcher.templates.chat_template import compiled, render_prompt
from proxy._types import Body
from proxy.engine.call_ids import rendered_ids, template_call_id_form

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
    """A Hugging Face ``tokenizer_config.json``-style chat template, rendered as serve's engine renders it."""

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
        try:
            template, bos_token, eos_token = template_file_parts(config)
        except TemplateFileError as exc:
            raise TemplateError(f"chat template {path}: {exc}") from None
        try:
            compiled(template)
        except Exception as exc:  # a jinja2 syntax error
            raise TemplateError(f"chat template {path} does not compile: {exc}") from None
        return cls(template, bos_token, eos_token, str(path))

    @cached_property
    def call_id_form(self) -> str:
        return template_call_id_form(self.source)

    def render(self, body: Body) -> str:
        """The prompt text for a Chat Completions body, the generation prompt included.

        Raises :class:`TemplateError` when the template fails on this request.

        >>> ChatTemplate("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
        ...              "{% if add_generation_prompt %}<assistant>{% endif %}", "", "").render(
        ...     {"messages": [{"role": "user", "content": "Hi"}]})
        '<user>Hi<assistant>'
        """
        view = engine_view(body)
        messages = rendered_ids(view["messages"], self.call_id_form)  # as the engine gets them (adapt)
        try:
            return render_prompt(
                self.source,
                messages,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                tools=view["tools"],
                tool_choice=view["tool_choice"],
                template_kwargs=kwargs if isinstance(kwargs := body.get("chat_template_kwargs"), dict) else None,
            )
        except Exception as exc:  # jinja2 raises anything a template does
            raise TemplateError(f"chat template failed on this request: {exc}") from exc
