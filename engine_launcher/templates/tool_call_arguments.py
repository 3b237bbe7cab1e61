"""Tool-call arguments as chat templates expect them: objects, as vLLM, transformers and llama-server pass them.

A client sends each call's ``function.arguments`` as a JSON string (the OpenAI shape), and
llama-cpp-python (0.3.36) hands that string to the model's chat template unchanged. Templates
written for the other engines walk the arguments (``arguments|items``, ``arguments.items()``,
``arguments|tojson``) and fail on a string, or print it JSON-encoded twice: every request that
carries an assistant turn with tool calls then fails with a 500. Qwen3-Coder, Qwen3.5, MiniMax-M2,
GLM-4.7 and Nemotron 3 are among them (docs/templates.md).

The engine's formatters (``engine_main``) and ``toolpair check-template`` both render through
:func:`render_with_object_arguments`: objects first, and the client's strings where a template
cannot take objects (it was written for strings, as functionary's is). An object prints as the
client's JSON text (:class:`ParsedArguments`), so a template that prints the arguments as they came
(``{{ call.function.arguments }}``, as toolpair's own ChatML template does) renders what it did
before, not a Python dict. Pure: no I/O, and the caller's messages are never changed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

__all__ = ["ParsedArguments", "render_with_object_arguments", "with_object_arguments"]

Rendered = TypeVar("Rendered")


class ParsedArguments(dict[str, Any]):
    """A tool call's arguments parsed from the client's JSON text, which is what ``str()`` gives back.

    >>> parsed = ParsedArguments({"x": 1}, '{"x":1}')
    >>> parsed["x"], str(parsed)
    (1, '{"x":1}')
    """

    __slots__ = ("text",)

    def __init__(self, value: dict[str, Any], text: str) -> None:
        super().__init__(value)
        self.text = text

    def __str__(self) -> str:
        return self.text


def with_object_arguments(messages: Sequence[Any], *, printable: bool = True) -> Sequence[Any]:
    """``messages`` with each tool call's JSON-object string arguments parsed; ``messages`` itself if none are.

    Arguments that are not a string holding a JSON object (already an object, not JSON, a JSON
    array) stay as they are. Changed messages and calls are new dicts; nothing is mutated.
    ``printable`` objects print as the client's text (:class:`ParsedArguments`); plain dicts are
    what transformers and vLLM hand a template.

    >>> call = {"id": "a", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    >>> sent = [{"role": "assistant", "content": None, "tool_calls": [call]}]
    >>> with_object_arguments(sent)[0]["tool_calls"][0]["function"]["arguments"]
    {'x': 1}
    >>> sent[0]["tool_calls"][0]["function"]["arguments"]
    '{"x": 1}'
    """
    out: list[Any] | None = None
    for index, message in enumerate(messages):
        changed = _message_with_object_arguments(message, printable)
        if changed is not message:
            if out is None:
                out = list(messages)
            out[index] = changed
    return messages if out is None else out


def _message_with_object_arguments(message: Any, printable: bool) -> Any:
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    if not isinstance(calls, list):
        return message
    parsed = [_call_with_object_arguments(call, printable) for call in calls]
    if all(new is old for new, old in zip(parsed, calls, strict=True)):
        return message
    return {**message, "tool_calls": parsed}


def _call_with_object_arguments(call: Any, printable: bool) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(arguments := function.get("arguments"), str):
        return call
    try:
        value = json.loads(arguments)
    except ValueError:
        return call
    if not isinstance(value, dict):
        return call
    return {**call, "function": {**function, "arguments": ParsedArguments(value, arguments) if printable else value}}


def render_with_object_arguments(render: Callable[[Sequence[Any]], Rendered], messages: Sequence[Any]) -> Rendered:
    """``render(messages)`` with object arguments, or with the client's strings if the template fails on objects.

    Where both fail, the error is the one the engine gave before toolpair parsed anything.
    """
    parsed = with_object_arguments(messages)
    if parsed is messages:
        return render(messages)
    try:
        return render(parsed)
    except Exception:  # a template raises anything: TypeError, jinja2's errors, its raise_exception
        return render(messages)
