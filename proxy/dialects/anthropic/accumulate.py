"""Anthropic stream events in, the final message out: :class:`MessageAccumulator`.

:func:`message_from_completion` is a non-stream completion put through the event transducer and
the accumulator, so both answers take the same path.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import orjson

from proxy._types import Body
from proxy.dialects.anthropic.events import Event, MessageEvents
from proxy.dialects.anthropic.request import Block
from proxy.ops.privacy import private

log = logging.getLogger("toolpair.anthropic")


# --- response: accumulating a message ------------------------------------------------


def _tool_input(buffer: str) -> Any:
    if not buffer:
        return {}
    try:
        value = orjson.loads(buffer)
    except orjson.JSONDecodeError:
        log.warning("a tool call's arguments are not JSON; sending an empty input: %s", private(buffer[:200]))
        return {}
    if not isinstance(value, dict):
        log.warning("a tool call's arguments are not a JSON object; sending an empty input: %s", private(buffer[:200]))
        return {}
    return value


class MessageAccumulator:
    """Anthropic stream events in, the final message out, checking the grammar on the way.

    The same state and steps as the anthropic SDK's accumulator, stricter:
    ``message_start`` first, blocks opened in index order, deltas only to the
    open block and of its kind, no block open at ``message_delta``,
    ``message_stop`` last. Anything else raises ``ValueError``.

    >>> acc = MessageAccumulator()
    >>> for e in MessageEvents(model="m", message_id="msg_1").feed({"choices": [{"delta": {"content": "Hi"},
    ...                                                              "finish_reason": "stop"}]}):
    ...     acc.feed(e)
    >>> acc.message["content"]
    [{'type': 'text', 'text': 'Hi'}]
    """

    def __init__(self) -> None:
        self.message: Body | None = None
        self._open: int | None = None
        self._json = ""
        self._delta_seen = False
        self.ended = False

    def feed(self, event: Event) -> None:
        kind = event.get("type")
        if self.ended:
            raise ValueError(f"{kind} after message_stop")
        if self.message is None:
            if kind != "message_start":
                raise ValueError(f"{kind} before message_start")
            self.message = {**event["message"], "content": list(event["message"]["content"])}
            self.message["usage"] = dict(self.message["usage"])
            return
        content: list[Block] = self.message["content"]
        if kind == "ping":
            return
        if kind == "message_start":
            raise ValueError("a second message_start")
        if kind == "error":
            raise ValueError(f"error event: {event.get('error')}")
        if self._delta_seen and kind != "message_stop":
            raise ValueError(f"{kind} after message_delta")
        if kind == "content_block_start":
            if self._open is not None:
                raise ValueError("content_block_start while a block is open")
            if event["index"] != len(content):
                raise ValueError(f"block index {event['index']}, expected {len(content)}")
            content.append(dict(event["content_block"]))
            self._open = event["index"]
            self._json = ""
        elif kind == "content_block_delta":
            self._apply(content, event)
        elif kind == "content_block_stop":
            if self._open is None or event["index"] != self._open:
                raise ValueError(f"content_block_stop for block {event['index']}, which is not open")
            block = content[self._open]
            if block["type"] == "tool_use":
                block["input"] = _tool_input(self._json)
            self._open = None
        elif kind == "message_delta":
            if self._open is not None:
                raise ValueError("message_delta while a block is open")
            self.message.update(event["delta"])
            self.message["usage"].update(event["usage"])
            self._delta_seen = True
        elif kind == "message_stop":
            if not self._delta_seen:
                raise ValueError("message_stop before message_delta")
            self.ended = True
        else:
            raise ValueError(f"unknown event type {kind!r}")

    def _apply(self, content: list[Block], event: Event) -> None:
        if self._open is None or event["index"] != self._open:
            raise ValueError(f"content_block_delta for block {event['index']}, which is not open")
        block, delta = content[self._open], event["delta"]
        expected = {"text": "text_delta", "thinking": "thinking_delta", "tool_use": "input_json_delta"}
        if expected.get(block["type"]) != delta["type"]:
            raise ValueError(f"{delta['type']} in a {block['type']} block")
        if block["type"] == "text":
            block["text"] += delta["text"]
        elif block["type"] == "thinking":
            block["thinking"] += delta["thinking"]
        else:
            self._json += delta["partial_json"]


def _completion_chunk(completion: Body) -> Body:
    """A whole non-stream completion as one chunk, so it takes the same path as a stream."""
    choices = completion.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    message: Body = choice["message"] if isinstance(choice.get("message"), dict) else {}
    delta: Body = {k: message[k] for k in ("content", "reasoning_content", "reasoning") if k in message}
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        delta["tool_calls"] = [{**call, "index": i} for i, call in enumerate(calls) if isinstance(call, dict)]
    chunk: Body = {"choices": [{"index": 0, "delta": delta, "finish_reason": choice.get("finish_reason") or "stop"}]}
    if isinstance(completion.get("usage"), dict):
        chunk["usage"] = completion["usage"]
    return chunk


def message_from_completion(completion: Body, *, model: str, message_id: str | None = None) -> Body:
    """A non-stream ``chat.completion`` as an Anthropic message.

    >>> message_from_completion({"choices": [{"message": {"content": "Hi"}, "finish_reason": "stop"}],
    ...                          "usage": {"prompt_tokens": 9, "completion_tokens": 1}},
    ...                         model="claude", message_id="msg_1")["usage"]
    {'input_tokens': 9, 'output_tokens': 1, 'cache_creation_input_tokens': 0, 'cache_read_input_tokens': 0}
    """
    events = MessageEvents(model=model, message_id=message_id)
    return accumulate([*events.feed(_completion_chunk(completion)), *events.finish()])


def accumulate(events: Iterable[Event]) -> Body:
    """The final message of a complete event sequence."""
    accumulator = MessageAccumulator()
    for event in events:
        accumulator.feed(event)
    if accumulator.message is None or not accumulator.ended:
        raise ValueError("the events did not end the message")
    return accumulator.message
