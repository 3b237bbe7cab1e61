"""How ``toolpair serve``'s engine turns messages into a prompt: one answer for the engine, the check and count_tokens.

The engine is llama-cpp-python with toolpair's changes (``engine_main``). Its ``Jinja2ChatFormatter``
renders a model's own template by calling :func:`render_prompt`: transformers' Jinja dialect (``{% break %}``,
``tojson`` with json.dumps' keywords, the ``{% generation %}`` tag), in a sandbox with
``trim_blocks`` and ``lstrip_blocks``, given ``add_generation_prompt``, ``raise_exception``,
``strftime_now`` and the request's ``tools``. A template file (``serve --chat-template-file``, and
the bundled model's ChatML) is rendered the same way: llama-cpp-python alone gives a file plain
jinja2 and, instead of a generation prompt, appends an empty assistant message, which real
templates close (``<|im_start|>assistant\\n<|im_end|>``), so the model answered after a finished,
empty turn. Tool-call arguments reach the template as objects (:mod:`.tool_call_arguments`).

``toolpair check-template`` (:mod:`.template_check`) and the Anthropic ``count_tokens`` estimate
(``proxy.engine.token_count``) render through the same :func:`render_prompt`: one renderer, so they
show what the engine reads. Pure: text in, text out.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from functools import lru_cache
from typing import Any

from jinja2 import Template, nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment

from engine_launcher.templates.tool_call_arguments import render_with_object_arguments, with_object_arguments

__all__ = [
    "FORMATTER_NAMES",
    "TemplateSandbox",
    "compiled",
    "render_prompt",
    "request_template_kwargs",
    "template_inputs",
]

_LIST_METHODS = frozenset({"append", "extend", "insert", "pop", "remove", "clear", "reverse", "sort"})
_given_lists: ContextVar[frozenset[int] | None] = ContextVar("given_lists", default=None)


def _lists_in(value: Any, found: set[int]) -> None:
    if isinstance(value, list | tuple):
        if isinstance(value, list):
            found.add(id(value))
        for item in value:
            _lists_in(item, found)
    elif isinstance(value, dict):
        for item in value.values():
            _lists_in(item, found)


@contextmanager
def template_inputs(*values: Any) -> Iterator[None]:
    """While rendering with ``values`` (messages, tools, ...), their lists are the caller's: no template changes them.

    Outside such a block :class:`TemplateSandbox` lets no list change, as jinja2's immutable sandbox.
    """
    found: set[int] = set()
    for value in values:
        _lists_in(value, found)
    token = _given_lists.set(frozenset(found))
    try:
        yield
    finally:
        _given_lists.reset(token)


class TemplateSandbox(ImmutableSandboxedEnvironment):
    """jinja2's immutable sandbox, but a template may use list methods on the lists it builds itself.

    Kimi K2's template keeps a queue (``ids.append(...)``), which the immutable sandbox refuses, so
    the model could not be served at all; llama-server's Jinja engine allows it. Lists the caller
    handed in (see :func:`template_inputs`) stay unchangeable, and every attribute jinja2's sandbox
    calls unsafe (``__class__``, ``func_globals``, ...) stays refused.
    """

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        given = _given_lists.get()
        if type(obj) is list and attr in _LIST_METHODS and given is not None and id(obj) not in given:
            return SandboxedEnvironment.is_safe_attribute(self, obj, attr, value)
        return super().is_safe_attribute(obj, attr, value)


FORMATTER_NAMES = frozenset(
    {
        "messages",
        "functions",
        "function_call",
        "tools",
        "tool_choice",
        "eos_token",
        "bos_token",
        "raise_exception",
        "add_generation_prompt",
        "strftime_now",
    }
)
"""What the engine's Jinja formatter hands the template itself: a request's template kwargs do not replace these."""


def request_template_kwargs(kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """A request's ``chat_template_kwargs`` as the template sees them: all but the formatter's own names.

    >>> request_template_kwargs({"enable_thinking": False, "messages": []})
    {'enable_thinking': False}
    """
    return {k: v for k, v in (kwargs or {}).items() if k not in FORMATTER_NAMES}


def _raise_exception(message: str) -> None:
    raise ValueError(message)


def _strftime_now(form: str) -> str:
    return datetime.now().strftime(form)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """transformers' ``tojson``: json.dumps with its keywords, not HTML-escaped as jinja2's own is."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _Generation(Extension):
    """``{% generation %}...{% endgeneration %}``: transformers marks the assistant's tokens with it.

    Rendering only needs its body, as it is."""

    tags = {"generation"}  # noqa: RUF012 - jinja2 declares it on Extension as a plain attribute

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


@lru_cache(maxsize=8)
def compiled(text: str) -> Template:
    """``text`` compiled in transformers' dialect, once: a long template takes a while to compile.

    Raises jinja2's ``TemplateSyntaxError`` for a template that does not compile.
    """
    environment = TemplateSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _Generation])
    environment.filters["tojson"] = _tojson
    return environment.from_string(text)


def render_prompt(
    text: str,
    messages: Sequence[Any],
    *,
    bos_token: str,
    eos_token: str,
    tools: Any = None,
    tool_choice: Any = None,
    functions: Any = None,
    function_call: Any = None,
    strftime_now: Callable[[str], str] = _strftime_now,
    as_transformers: bool = False,
    template_kwargs: Mapping[str, Any] | None = None,
    add_generation_prompt: bool = True,
) -> str:
    """The prompt the engine renders from ``messages`` with template ``text``; raises what the template raises.

    ``functions`` and ``function_call``: a request's (OpenAI's older names for tools), as the engine
    hands them to the template.

    ``as_transformers``: as transformers' ``apply_chat_template`` renders it (vLLM, and the dialect
    llama-server's ``--jinja`` follows): the same, but arguments as plain dicts and no fallback to strings.
    ``template_kwargs``: ``chat_template_kwargs`` (``enable_thinking``), which the engine adds to what
    the template sees: its load-time ones, a request's over them
    (:func:`engine_launcher.inside.engine_main.take_template_kwargs_per_request`). No list handed in
    (messages, tools, functions, kwargs) is changed by the template: the load-time kwargs outlive the request.
    ``add_generation_prompt`` False renders a finished conversation (the model's own turns as written).

    >>> render_prompt("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    ...               "{% if add_generation_prompt %}<assistant>{% endif %}",
    ...               [{"role": "user", "content": "Hi"}], bos_token="", eos_token="")
    '<user>Hi<assistant>'
    """
    template = compiled(text)
    extra = request_template_kwargs(template_kwargs)

    def render(messages: Sequence[Any]) -> str:
        with template_inputs(messages, tools, tool_choice, functions, function_call, extra):
            return template.render(
                {
                    **extra,
                    "messages": messages,
                    "eos_token": eos_token,
                    "bos_token": bos_token,
                    "raise_exception": _raise_exception,
                    "add_generation_prompt": add_generation_prompt,
                    "functions": functions,
                    "function_call": function_call,
                    "tools": tools,
                    "tool_choice": tool_choice,
                    "strftime_now": strftime_now,
                }
            )

    if as_transformers:
        return render(with_object_arguments(messages, printable=False))
    return render_with_object_arguments(render, messages)
