"""Independent checkers for what a client receives: each dialect's stream grammar, and error shapes.

Written from the public API descriptions, not from toolpair's own transducers, so a
bug in those cannot hide here. Each checker takes the raw bytes of one response body
and returns a :class:`Stream` saying how it ended, or raises :class:`Malformed`
saying what is wrong. A stream may end in one of two ways only:

- ``complete``: Chat chunks then ``data: [DONE]``; Anthropic ``message_start`` ..
  ``message_stop``; Responses ``response.created`` .. ``response.completed`` (or
  ``response.incomplete``) with consecutive sequence numbers;
- ``error``: a valid prefix of that grammar, then one in-band error in the dialect
  (a Chat ``data:`` object with ``error``; Anthropic ``event: error``; Responses
  ``response.failed``), and nothing after it.

Every frame must be whole: the body ends with a blank line and no bytes dangle.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import orjson

__all__ = [
    "Malformed",
    "Stream",
    "check_anthropic",
    "check_chat",
    "check_error_body",
    "check_responses",
    "check_stream",
    "frames_of",
]

_FRAME_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")


class Malformed(AssertionError):
    """Raised when a body breaks its dialect's grammar."""


@dataclass
class Stream:
    """How one stream ended, and what it carried."""

    outcome: str  # "complete" or "error"
    events: list[tuple[str, Any]] = field(default_factory=list)  # (event name, decoded data)
    text: str = ""  # the generated text, joined
    error: dict[str, Any] | None = None  # the in-band error object, when outcome is "error"


def frames_of(raw: bytes) -> list[tuple[str, str]]:
    """``(event name, data)`` per frame; raises if the body ends inside a frame.

    >>> frames_of(b"event: a\\ndata: 1\\n\\ndata: 2\\n\\n")
    [('a', '1'), ('message', '2')]
    """
    out: list[tuple[str, str]] = []
    start = 0
    for match in _FRAME_END.finditer(raw):
        out.append(_frame(raw[start : match.start()]))
        start = match.end()
    if raw[start:].strip():
        raise Malformed(f"the body ends inside a frame: {raw[start:][:200]!r}")
    return [frame for frame in out if frame[1] or frame[0] != "message"]


def _frame(block: bytes) -> tuple[str, str]:
    try:
        text = block.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Malformed(f"a frame is not UTF-8: {block[:200]!r}") from exc
    name, data = "message", []
    for line in re.split(r"\r\n|\r|\n", text):
        if not line or line.startswith(":"):
            continue
        key, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if key == "event":
            name = value
        elif key == "data":
            data.append(value)
        else:
            raise Malformed(f"unexpected field {key!r} in frame {block[:200]!r}")
    return name, "\n".join(data)


def _json(data: str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise Malformed(f"a frame's data is not JSON: {data[:200]!r}") from exc


def _error_object(error: Any, where: str) -> dict[str, Any]:
    if not isinstance(error, dict) or not isinstance(error.get("message"), str) or not error["message"]:
        raise Malformed(f"{where}: the error carries no message: {error!r}")
    if "Traceback" in error["message"]:
        raise Malformed(f"{where}: a traceback in the error: {error['message'][:300]}")
    return error


# --- Chat Completions ------------------------------------------------------------------------


def check_chat(raw: bytes) -> Stream:
    """A Chat Completions stream: chunk objects, then ``[DONE]``; or chunks, then one error object."""
    stream = Stream("open")
    frames = frames_of(raw)
    for position, (name, data) in enumerate(frames):
        last = position == len(frames) - 1
        if name != "message":
            raise Malformed(f"chat streams name no events, got {name!r}")
        if data == "[DONE]":
            if not last:
                raise Malformed("frames after [DONE]")
            stream.outcome = "complete"
            continue
        chunk = _json(data)
        if not isinstance(chunk, dict):
            raise Malformed(f"a chunk is not an object: {data[:200]}")
        if "error" in chunk:
            if not last:
                raise Malformed("frames after an error")
            stream.outcome, stream.error = "error", _error_object(chunk["error"], "chat")
            continue
        if chunk.get("object") != "chat.completion.chunk" or not isinstance(chunk.get("choices"), list):
            raise Malformed(f"not a chat.completion.chunk: {data[:200]}")
        for choice in chunk["choices"]:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if not isinstance(delta, dict):
                raise Malformed(f"a choice without a delta: {data[:200]}")
            if isinstance(delta.get("content"), str):
                stream.text += delta["content"]
        stream.events.append((name, chunk))
    if stream.outcome == "open":
        raise Malformed("the chat stream ended without [DONE] or an error")
    return stream


# --- Anthropic Messages --------------------------------------------------------------------


def check_anthropic(raw: bytes) -> Stream:
    """``message_start``, blocks (start, deltas, stop; indices 0, 1, ...), ``message_delta``, ``message_stop``."""
    stream = Stream("open")
    state = "new"  # new -> started -> (block open / closed)* -> delta -> stopped
    open_block: int | None = None
    next_block = 0
    frames = frames_of(raw)
    for position, (name, data) in enumerate(frames):
        last = position == len(frames) - 1
        event = _json(data)
        if not isinstance(event, dict) or event.get("type") != name:
            raise Malformed(
                f"event {name!r} carries data of type {event.get('type') if isinstance(event, dict) else event!r}"
            )
        if name == "error":
            if not last:
                raise Malformed("events after an error")
            stream.outcome, stream.error = "error", _error_object(event.get("error"), "anthropic")
            if not isinstance(stream.error.get("type"), str):
                raise Malformed(f"an Anthropic error without a type: {event}")
            continue
        if name == "ping":
            if state in ("new", "stopped"):
                raise Malformed(f"ping while the message is {state}")
        elif name == "message_start":
            if state != "new" or not isinstance(event.get("message"), dict):
                raise Malformed("message_start out of place or without a message")
            state = "started"
        elif name == "content_block_start":
            if state != "started" or open_block is not None or event.get("index") != next_block:
                raise Malformed(f"content_block_start out of place: {event}")
            open_block = next_block
            next_block += 1
        elif name == "content_block_delta":
            if open_block is None or event.get("index") != open_block or not isinstance(event.get("delta"), dict):
                raise Malformed(f"content_block_delta out of place: {event}")
            if event["delta"].get("type") == "text_delta":
                stream.text += event["delta"]["text"]
        elif name == "content_block_stop":
            if open_block is None or event.get("index") != open_block:
                raise Malformed(f"content_block_stop out of place: {event}")
            open_block = None
        elif name == "message_delta":
            if state != "started" or open_block is not None:
                raise Malformed("message_delta out of place")
            if not isinstance(event.get("delta"), dict) or "stop_reason" not in event["delta"]:
                raise Malformed(f"message_delta without a stop_reason: {event}")
            state = "delta"
        elif name == "message_stop":
            if state != "delta" or not last:
                raise Malformed("message_stop out of place")
            state = "stopped"
            stream.outcome = "complete"
        else:
            raise Malformed(f"unknown event {name!r}")
        stream.events.append((name, event))
    if stream.outcome == "open":
        raise Malformed(f"the Anthropic stream ended without message_stop or an error (state {state})")
    return stream


# --- Responses -----------------------------------------------------------------------------

_ENDINGS = ("response.completed", "response.incomplete", "response.failed")


def check_responses(raw: bytes) -> Stream:
    """Consecutive sequence numbers from 0; created, in_progress, items each added then done; one ending."""
    stream = Stream("open")
    frames = frames_of(raw)
    open_items: dict[int, str] = {}  # output_index -> item id
    done_items: list[str] = []
    for position, (name, data) in enumerate(frames):
        last = position == len(frames) - 1
        event = _json(data)
        if not isinstance(event, dict) or event.get("type") != name:
            raise Malformed(f"event {name!r} carries data of another type: {data[:200]}")
        if event.get("sequence_number") != position:
            raise Malformed(f"sequence_number {event.get('sequence_number')} at position {position}")
        if position == 0 and name != "response.created":
            raise Malformed(f"the stream starts with {name}")
        if position == 1 and name != "response.in_progress":
            raise Malformed(f"the second event is {name}")
        if name == "response.output_item.added":
            index, item = event.get("output_index"), event.get("item")
            if index in open_items or not isinstance(item, dict) or index != len(done_items) + len(open_items):
                raise Malformed(f"output_item.added out of place: {data[:200]}")
            open_items[index] = item.get("id")
        elif name == "response.output_item.done":
            index, item = event.get("output_index"), event.get("item")
            if index not in open_items or not isinstance(item, dict) or item.get("id") != open_items.pop(index):
                raise Malformed(f"output_item.done without its added: {data[:200]}")
            done_items.append(item["id"])
        elif name.endswith(".delta") or name.endswith(".done") or name.startswith("response.content_part"):
            if event.get("output_index") not in open_items:
                raise Malformed(f"{name} for an item that is not open: {data[:200]}")
            if name == "response.output_text.delta":
                stream.text += event["delta"]
        if name in _ENDINGS:
            if not last:
                raise Malformed(f"events after {name}")
            response = event.get("response")
            if not isinstance(response, dict):
                raise Malformed(f"{name} without a response")
            if name == "response.failed":
                if response.get("status") != "failed":
                    raise Malformed("response.failed whose status is not failed")
                stream.outcome, stream.error = "error", _error_object(response.get("error"), "responses")
            else:
                if open_items:
                    raise Malformed(f"{name} with items still open")
                ids = [item.get("id") for item in response.get("output", []) if isinstance(item, dict)]
                if ids != done_items:
                    raise Malformed(f"{name} lists output {ids}, the stream finished {done_items}")
                stream.outcome = "complete"
        stream.events.append((name, event))
    if stream.outcome == "open":
        raise Malformed("the Responses stream ended without a final event")
    return stream


CHECKERS = {"chat": check_chat, "anthropic": check_anthropic, "responses": check_responses}


def check_stream(api: str, raw: bytes) -> Stream:
    """The checker for ``api`` (``chat``, ``anthropic`` or ``responses``)."""
    return CHECKERS[api](raw)


def check_error_body(api: str, raw: bytes) -> dict[str, Any]:
    """A whole error body in the dialect of ``api``; returns the error object.

    OpenAI (Chat and Responses): ``{"error": {"message", "type", ...}}``; Anthropic:
    ``{"type": "error", "error": {"type", "message"}}``.
    """
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise Malformed(f"the error body is not JSON: {raw[:300]!r}") from exc
    if not isinstance(body, dict):
        raise Malformed(f"the error body is not an object: {raw[:300]!r}")
    if api == "anthropic":
        if body.get("type") != "error":
            raise Malformed(f"not an Anthropic error: {raw[:300]!r}")
        error = _error_object(body.get("error"), api)
        if not isinstance(error.get("type"), str):
            raise Malformed(f"an Anthropic error without a type: {raw[:300]!r}")
        return error
    error = _error_object(body.get("error"), api)
    if not isinstance(error.get("type"), str):
        raise Malformed(f"an OpenAI error without a type: {raw[:300]!r}")
    return error
