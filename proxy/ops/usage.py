"""Token usage read off an engine response as it streams past, without holding it.

Engines report ``usage`` near the end of a JSON body, and in the last chunks
of a stream (OpenAI with ``include_usage``, llama-server, vLLM). Anthropic
streams put ``input_tokens`` in the first event and ``output_tokens`` in the
last. So :class:`UsageScanner` keeps only the first and the last ``window``
bytes of the body it sees, and reads the last ``"usage"`` object in each when
asked. The bytes it is fed are never changed: the relay stays byte-identical.

A ``"usage"`` key cannot be faked by model text: inside a JSON string its
quotes are escaped, so the pattern ``"usage":`` never matches there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["Usage", "UsageScanner", "find_usage"]

_KEY = b'"usage"'
_TO_OBJECT = re.compile(rb"[ \t\r\n]*:[ \t\r\n]*(?=\{)")
"""What may stand between the key and its object: JSON whitespace and the colon (one C call, not a byte loop)."""


@dataclass(frozen=True)
class Usage:
    """Tokens one response reported; ``None`` where it did not say."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            _add(self.prompt_tokens, other.prompt_tokens), _add(self.completion_tokens, other.completion_tokens)
        )

    def over(self, earlier: Usage) -> Usage:
        """This usage, with counts it lacks taken from ``earlier`` (a later report wins)."""
        return Usage(
            self.prompt_tokens if self.prompt_tokens is not None else earlier.prompt_tokens,
            self.completion_tokens if self.completion_tokens is not None else earlier.completion_tokens,
        )


def _add(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else a + b


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _usage_of(obj: Any) -> Usage | None:
    """OpenAI names (prompt/completion) or Anthropic and Responses names (input/output)."""
    if not isinstance(obj, dict):
        return None
    prompt = _count(obj.get("prompt_tokens", obj.get("input_tokens")))
    completion = _count(obj.get("completion_tokens", obj.get("output_tokens")))
    if prompt is None and completion is None:
        return None
    return Usage(prompt, completion)


_MAX_CLOSES = 16
"""Closing braces tried per usage object; real ones nest two or three objects at most."""


def _object_at(data: bytes, start: int) -> Any:
    """The JSON object opening at ``start``, or None if it is cut off or not JSON.

    Tries each following ``}`` as the end, in C: a JSON value has exactly one
    end, so the first prefix that parses is the whole object (a ``}`` inside a
    string leaves the prefix unparseable).
    """
    end = start
    for _ in range(_MAX_CLOSES):
        end = data.find(b"}", end) + 1
        if end == 0:
            return None
        try:
            return orjson.loads(data[start:end])
        except orjson.JSONDecodeError:
            continue
    return None


def find_usage(data: bytes) -> Usage | None:
    """The last complete ``"usage"`` object in ``data`` that holds token counts.

    >>> find_usage(b'{"id":"x","usage":{"prompt_tokens":5,"completion_tokens":1}}')
    Usage(prompt_tokens=5, completion_tokens=1)
    >>> find_usage(b'data: {"usage": null}\\n\\ndata: [DONE]') is None
    True
    """
    end = len(data)
    while True:
        at = data.rfind(_KEY, 0, end)
        if at < 0:
            return None
        end = at
        to_object = _TO_OBJECT.match(data, at + len(_KEY))
        if to_object is None:
            continue
        usage = _usage_of(_object_at(data, to_object.end()))
        if usage is not None:
            return usage


class UsageScanner:
    """Watch a response body go by; report the usage it carried.

    Copies at most ``window`` bytes from the start and ``2 * window`` from the
    end, whatever the body's size; a body that comes in one chunk (a reply read
    whole) is not copied at all, only referred to. The answer does not depend
    on how the body was split into chunks.
    """

    def __init__(self, window: int = 8192) -> None:
        self._window = window
        self._only: bytes | None = None
        """The first chunk, held as it is until a second comes: most bodies read whole come in one."""
        self._head = bytearray()
        self._tail = bytearray()
        self._seen = 0

    def feed(self, chunk: bytes) -> None:
        if self._only is not None:  # a second chunk: from here on, the copied windows
            only, self._only = self._only, None
            self._head += only[: self._window]
            self._tail += only
        elif not self._seen:
            self._seen = len(chunk)
            self._only = chunk
            return
        self._seen += len(chunk)
        if len(self._head) < self._window:
            self._head += chunk[: self._window - len(self._head)]
        self._tail += chunk
        if len(self._tail) > 2 * self._window:
            del self._tail[: -self._window]

    def result(self) -> Usage | None:
        """Usage from the last report near the end, completed from one near the start."""
        only = self._only
        # One chunk is the head and the tail: slices of it, no bytearray.
        last = find_usage(only[-self._window :] if only is not None else bytes(self._tail[-self._window :]))
        if self._seen <= self._window:  # the head is the whole body, already read
            return last
        first = find_usage(only[: self._window] if only is not None else bytes(self._head))
        if first is None or last is None:
            return last or first
        return last.over(first)
