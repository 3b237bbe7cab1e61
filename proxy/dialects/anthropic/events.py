"""Anthropic stream events from ``chat.completion.chunk`` dicts: :class:`MessageEvents`, and its SSE form.

Follows the documented grammar (``message_start``, ``ping``, per block ``content_block_start`` /
``_delta`` / ``_stop``, ``message_delta``, ``message_stop``). Stop sequences are matched here, on
the generated text. :class:`MessageFrames` is the same transducer with SSE bytes out, as the
generic streaming handler drives it.

Spec: https://docs.anthropic.com/en/docs/build-with-claude/streaming
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from proxy._types import Body
from proxy.dialects.anthropic.errors import anthropic_error
from proxy.dialects.anthropic.request import Block, new_message_id, new_tool_use_id
from proxy.engine.stop_sequences import StopMatcher
from proxy.errors import (
    Dialect,
    ToolpairError,
    UpstreamError,
    error_event,
)
from proxy.sse import encode_event

log = logging.getLogger("toolpair.anthropic")

Event = dict[str, Any]
"""One Anthropic stream event, e.g. ``{"type": "content_block_stop", "index": 0}``."""


# --- response: stream events -------------------------------------------------------


def stop_reason(finish_reason: str | None, used_tools: bool) -> str:
    """A Chat ``finish_reason`` as an Anthropic ``stop_reason``.

    Engines differ on the finish reason after tool calls, so any tool call
    means ``tool_use`` unless the output was cut short.

    >>> stop_reason("length", True), stop_reason("stop", True), stop_reason("stop", False)
    ('max_tokens', 'tool_use', 'end_turn')
    """
    if finish_reason == "length":
        return "max_tokens"
    if finish_reason == "content_filter":
        return "refusal"
    if used_tools or finish_reason in ("tool_calls", "function_call"):
        return "tool_use"
    return "end_turn"


def _nonempty(value: object) -> str:
    return value if isinstance(value, str) else ""


def _produces_output(delta: Body) -> bool:
    """Whether a chunk carries generated output: the token count when the engine gives no usage."""
    if any(_nonempty(delta.get(key)) for key in ("content", "reasoning_content", "reasoning")):
        return True
    calls = delta.get("tool_calls")
    return isinstance(calls, list) and bool(calls)


class MessageEvents:
    """``chat.completion.chunk`` dicts in, Anthropic stream events out.

    State: whether ``message_start`` went out, the open block (its kind and
    index), the block of each tool call index, the stop-sequence matcher, the
    finish reason and usage. Each :meth:`feed` is one step from the current
    state to the next, returning the events it implies. Orders the Anthropic
    grammar cannot express raise :class:`~proxy.errors.UpstreamError`: a tool
    call that resumes after another began, a tool call with no name, a stream
    that ends with no finish reason, and any input after the message ended.

    >>> events = MessageEvents(model="claude", message_id="msg_1")
    >>> [e["type"] for e in events.feed({"choices": [{"delta": {"content": "Hi"}, "finish_reason": "stop"}]})]
    ['message_start', 'ping', 'content_block_start', 'content_block_delta']
    >>> [e["type"] for e in events.finish()]
    ['content_block_stop', 'message_delta', 'message_stop']
    """

    def __init__(
        self,
        *,
        model: str,
        message_id: str | None = None,
        input_tokens: int = 0,
        stop_sequences: Sequence[str] = (),
    ) -> None:
        self.model = model
        self.message_id = message_id or new_message_id()
        self.input_tokens = input_tokens
        self._stops = StopMatcher(stop_sequences) if stop_sequences else None
        self._started = False
        self._index = -1
        self._open: str | None = None  # kind of the open block
        self._tools: dict[int, int] = {}  # chat tool call index -> block index
        self._open_tool: int | None = None
        self.finish_reason: str | None = None
        self._prompt_tokens: int | None = None
        self._completion_tokens: int | None = None
        self._cached_tokens: int | None = None
        self._counted = 0
        self._held_tokens = 0  # chunks whose text the stop matcher holds back
        self._token_pending = False  # the chunk being fed produced output not yet counted
        self.done = False
        """True once ``message_stop`` went out: by a stop sequence, or :meth:`finish`."""

    # -- steps

    def ping(self) -> list[Event]:
        """A keep-alive while the engine has not answered yet (``message_start`` first if needed)."""
        if self.done:
            return []
        return [*self._start(), {"type": "ping"}]

    def feed(self, chunk: Body) -> list[Event]:
        if self.done:
            raise UpstreamError("the engine sent more after the message ended")
        events = self._start()
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            if isinstance(usage.get("prompt_tokens"), int):
                self._prompt_tokens = usage["prompt_tokens"]
            if isinstance(usage.get("completion_tokens"), int):
                self._completion_tokens = usage["completion_tokens"]
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                self._cached_tokens = details["cached_tokens"]
        choices = chunk.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        delta = choice.get("delta")
        if isinstance(delta, dict):
            self._token_pending = _produces_output(delta)
            self._delta(delta, events)
            if self._token_pending:  # not text held or cut by a stop sequence: it counts now
                self._counted += 1
                self._token_pending = False
            if self.done:
                return events
        finish = choice.get("finish_reason")
        if isinstance(finish, str) and finish:
            self.finish_reason = finish
        return events

    def finish(self) -> list[Event]:
        """End of the engine's stream: close the open block and the message."""
        if self.done:
            return []
        if self.finish_reason is None:
            raise UpstreamError("the engine ended the stream before it finished the message")
        events = self._start()
        # Cut by max_tokens, held text is the start of a stop sequence that never completed: dropped.
        events += self._flush_text(drop=self.finish_reason == "length")
        events += self._close()
        events += self._end(stop_reason(self.finish_reason, bool(self._tools)), None)
        return events

    # -- helpers

    def _start(self) -> list[Event]:
        if self._started:
            return []
        self._started = True
        message: Body = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": self.input_tokens,
                "output_tokens": 0,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }
        return [{"type": "message_start", "message": message}, {"type": "ping"}]

    def _delta(self, delta: Body, events: list[Event]) -> None:
        reasoning = _nonempty(delta.get("reasoning_content")) or _nonempty(delta.get("reasoning"))
        if reasoning:
            if self._open != "thinking":
                events += self._flush_text()
                events += self._open_block({"type": "thinking", "thinking": "", "signature": ""})
            events.append(self._block_delta({"type": "thinking_delta", "thinking": reasoning}))
        content = _nonempty(delta.get("content"))
        if content:
            events += self._text(content)
            if self.done:
                return
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            for position, call in enumerate(calls):
                if isinstance(call, dict):
                    self._tool_call(call, position, events)

    def _text(self, text: str) -> list[Event]:
        stop = None
        if self._stops is not None:
            match = self._stops.feed(text)
            text, stop = match.text, match.stop
            self._count_text(bool(text), stop is not None)
        events: list[Event] = []
        if text:
            if self._open != "text":
                events += self._open_block({"type": "text", "text": ""})
            events.append(self._block_delta({"type": "text_delta", "text": text}))
        if stop is not None:
            events += self._close()
            events += self._end("stop_sequence", stop)
        return events

    def _count_text(self, emitted: bool, stopped: bool) -> None:
        """Count output tokens by what the client gets: chunks wholly inside a stop sequence do not count."""
        token, self._token_pending = self._token_pending, False
        if emitted:
            self._counted += self._held_tokens + (1 if token else 0)
            self._held_tokens = 0
        elif token and not stopped:
            self._held_tokens += 1
        if stopped:
            self._held_tokens = 0

    def _flush_text(self, *, drop: bool = False) -> list[Event]:
        """Let through text held back as a possible stop sequence: the text ended without one.

        With ``drop``, the held text is dropped instead (its tokens were still generated).
        """
        held = self._stops.finish() if self._stops is not None else ""
        self._counted += self._held_tokens
        self._held_tokens = 0
        if not held or drop:
            return []
        events = [] if self._open == "text" else self._open_block({"type": "text", "text": ""})
        events.append(self._block_delta({"type": "text_delta", "text": held}))
        return events

    def _tool_call(self, call: Body, position: int, events: list[Event]) -> None:
        index = call.get("index", position)
        if isinstance(index, (list, dict)):
            raise UpstreamError("the engine sent a tool call whose index is not a number")
        function: Body = call["function"] if isinstance(call.get("function"), dict) else {}
        if index not in self._tools:
            name = function.get("name")
            if not isinstance(name, str) or not name:
                raise UpstreamError("the engine started a tool call without a name")
            call_id = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else new_tool_use_id()
            events += self._flush_text()
            events += self._open_block({"type": "tool_use", "id": call_id, "name": name, "input": {}})
            self._tools[index] = self._index
            self._open_tool = index
        elif self._open_tool != index:
            raise UpstreamError("the engine resumed a tool call after the next one began")
        arguments = _nonempty(function.get("arguments"))
        if arguments:
            events.append(self._block_delta({"type": "input_json_delta", "partial_json": arguments}))

    def _open_block(self, block: Block) -> list[Event]:
        events = self._close()
        self._index += 1
        self._open = block["type"]
        return [*events, {"type": "content_block_start", "index": self._index, "content_block": block}]

    def _block_delta(self, delta: Body) -> Event:
        return {"type": "content_block_delta", "index": self._index, "delta": delta}

    def _close(self) -> list[Event]:
        if self._open is None:
            return []
        self._open = None
        self._open_tool = None
        return [{"type": "content_block_stop", "index": self._index}]

    def _end(self, reason: str, stop: str | None) -> list[Event]:
        self.done = True
        prompt = self._prompt_tokens if self._prompt_tokens is not None else self.input_tokens
        cached = min(prompt, self._cached_tokens or 0)
        # Anthropic's input_tokens leaves out cache reads: clients add the three for the context size.
        usage = {
            "input_tokens": prompt - cached,
            "output_tokens": self._completion_tokens if self._completion_tokens is not None else self._counted,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached,
        }
        delta = {"stop_reason": reason, "stop_sequence": stop}
        return [{"type": "message_delta", "delta": delta, "usage": usage}, {"type": "message_stop"}]


def frames(events: Iterable[Event]) -> list[bytes]:
    """Anthropic events as SSE frames, each named by its type (the SDK skips unnamed frames)."""
    return [encode_event(orjson.dumps(event), event["type"]) for event in events]


class MessageFrames:
    """:class:`MessageEvents` with SSE bytes out, as :func:`proxy.http.streaming.stream_reply` drives it."""

    def __init__(self, events: MessageEvents) -> None:
        self.events = events

    @property
    def done(self) -> bool:
        return self.events.done

    def start(self) -> bytes:
        return b""  # message_start goes out with the first ping or chunk

    def ping(self) -> bytes:
        return b"".join(frames(self.events.ping()))

    def feed(self, chunk: Body) -> bytes:
        return b"".join(frames(self.events.feed(chunk)))

    def finish(self) -> bytes:
        return b"".join(frames(self.events.finish()))

    def fail(self, error: ToolpairError) -> bytes:
        return error_event(anthropic_error(error), Dialect.ANTHROPIC)
