"""Engine errors as Anthropic errors: an overflowing context becomes ``prompt is too long``.

That wording is what makes Claude Code compact its history, so every path that can carry an
engine's context-overflow message (a translated engine's 400, a native engine's own error shape)
goes through :func:`anthropic_error` or :func:`native_error`.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from proxy.errors import ClientInputError, PromptTooLongError, ToolpairError, UpstreamStatusError

# --- errors ------------------------------------------------------------------------------

_CONTEXT_OVERFLOW = (
    # llama-cpp-python server, vLLM, OpenAI: "maximum context length is 512 tokens. However,
    # you requested 829 tokens (824 in the messages, 5 in the completion)"
    re.compile(r"maximum context length is (?P<limit>\d+) tokens.*?\((?P<prompt>\d+) in the messages"
               r"(?:, (?P<completion>\d+))?", re.S),
    # vLLM: "maximum context length is 4096 tokens. However, your request has 5000 input tokens"
    re.compile(r"maximum context length is (?P<limit>\d+) tokens.*?request has (?P<prompt>\d+) input tokens", re.S),
    # llama-cpp-python's own exception text
    re.compile(r"Requested tokens \((?P<prompt>\d+)\) exceed context window of (?P<limit>\d+)"),
    # llama-server: "request (5000 tokens) exceeds the available context size (4096 tokens)"
    re.compile(r"request \((?P<prompt>\d+) tokens\) exceeds the available context size \((?P<limit>\d+) tokens\)"),
)  # fmt: skip


def context_overflow(engine_message: str) -> ClientInputError | None:
    """The Anthropic error for an engine's "does not fit in the context" message, if it is one.

    A prompt that alone fills the context is ``prompt is too long: N tokens > M
    maximum`` (what makes Claude Code compact); one that only fails with room
    for ``max_tokens`` gets Anthropic's wording for that case.

    >>> context_overflow("This model's maximum context length is 512 tokens. However, you requested "
    ...                  "829 tokens (824 in the messages, 5 in the completion).").message
    'prompt is too long: 824 tokens > 512 maximum'
    >>> context_overflow("no such model") is None
    True
    """
    for pattern in _CONTEXT_OVERFLOW:
        match = pattern.search(engine_message)
        if match is None:
            continue
        prompt, limit = int(match["prompt"]), int(match["limit"])
        completion = match.groupdict().get("completion")
        if prompt >= limit or completion is None:
            return PromptTooLongError(prompt, limit)
        return ClientInputError(
            f"input length and `max_tokens` exceed context limit: {prompt} + {completion} > {limit}, "
            "decrease input length or `max_tokens` and try again",
            param="max_tokens",
        )
    return None


def native_error(status: int, raw: bytes) -> ToolpairError | None:
    """The Anthropic error for a native engine's context overflow; None for any other answer.

    Engines that serve ``/v1/messages`` often answer a prompt too long for the context in their
    own shape (llama-server: ``{"error": {"type": "exceed_context_size_error", "n_prompt_tokens":
    ..., "n_ctx": ...}}``). That one is rewritten, so that Claude Code still sees ``prompt is too
    long`` and can compact. Every other error is the engine's to say, and goes out as it sent it
    (a key-protected engine's 401 stays the engine's, not relabelled as toolpair's).

    >>> native_error(400, b'{"error": {"message": "too big", "n_prompt_tokens": 9000, "n_ctx": 8192}}').message
    'prompt is too long: 9000 tokens > 8192 maximum'
    >>> native_error(400, b'{"type": "error", "error": {"type": "invalid_request_error", "message": "x"}}') is None
    True
    >>> native_error(401, b'{"error": {"code": 401, "message": "Invalid API Key"}}') is None
    True
    """
    try:
        data: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict) and data.get("type") == "error" and isinstance(data.get("error"), dict):
        message = data["error"].get("message")
        overflow = context_overflow(message) if isinstance(message, str) else None
        return overflow if isinstance(overflow, PromptTooLongError) else None
    error = data.get("error", data.get("detail", data)) if isinstance(data, dict) else data
    if isinstance(error, dict):
        prompt, limit = error.get("n_prompt_tokens"), error.get("n_ctx")
        if isinstance(prompt, int) and isinstance(limit, int):
            return PromptTooLongError(prompt, limit)
        error = error.get("message")
    message = error if isinstance(error, str) and error else raw.decode("utf-8", "replace")[:500]
    return context_overflow(message) if message else None


def anthropic_error(error: ToolpairError) -> ToolpairError:
    """The error an Anthropic client is shown: an engine's context overflow becomes ``prompt is too long``.

    >>> anthropic_error(UpstreamStatusError("Requested tokens (900) exceed context window of 512", status=400)).message
    'prompt is too long: 900 tokens > 512 maximum'
    """
    if isinstance(error, UpstreamStatusError) and error.status < 500:
        return context_overflow(error.message) or error
    return error
