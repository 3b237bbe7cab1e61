"""Chat Completions answers as Responses: :class:`ResponsesStream` (chunk dicts in, events out).

One state machine serves streams and whole completions (:func:`chat_to_response` feeds it once);
:class:`ResponsesFrames` is its SSE form, as the generic streaming handler drives it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import orjson

from proxy._types import Body
from proxy.dialects.responses.request import Event, ResponsesPlan, ToolRef
from proxy.errors import ToolpairError, UpstreamError, response_error
from proxy.sse import encode_event

# --- the response: one state machine for streams, reused for whole completions ----------------


_TRUNCATED = {"length": "max_output_tokens", "content_filter": "content_filter"}  # chat finish -> incomplete reason


class StreamStateError(RuntimeError):
    """Raised when the stream transducer is driven in an order that cannot happen (a toolpair bug)."""


class _Phase(Enum):
    NEW = "new"  # nothing sent yet
    OPEN = "open"  # response.created sent; items may be added
    DONE = "done"  # completed, incomplete or failed sent; nothing more


@dataclass
class _Item:
    """The one output item that is currently open."""

    kind: str  # reasoning, message, function_call or custom_tool_call
    index: int  # output_index
    id: str
    chat_index: int | None = None  # the chat tool call index it came from
    call_id: str = ""
    ref: ToolRef | None = None
    parts: list[str] = field(default_factory=list)
    logprobs: list[Body] = field(default_factory=list)  # a message's token logprobs, when asked for
    announced: bool = False  # output_item.added sent (a call waits for its name)


def _tokens(usage: Body, key: str, detail: str | None = None) -> int:
    """A token count from the engine's usage; anything but a number there counts as 0."""
    value = usage.get(key)
    if detail is not None:
        value = value.get(detail) if isinstance(value, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _usage(chat_usage: Any) -> Body | None:
    """Responses usage from a chat ``usage`` object.

    >>> _usage({"prompt_tokens": 3, "completion_tokens": "2", "prompt_tokens_details": []})["total_tokens"]
    3
    """
    if not isinstance(chat_usage, dict):
        return None
    prompt = _tokens(chat_usage, "prompt_tokens")
    completion = _tokens(chat_usage, "completion_tokens")
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": _tokens(chat_usage, "prompt_tokens_details", "cached_tokens")},
        "output_tokens": completion,
        "output_tokens_details": {
            "reasoning_tokens": _tokens(chat_usage, "completion_tokens_details", "reasoning_tokens")
        },
        "total_tokens": _tokens(chat_usage, "total_tokens") or prompt + completion,
    }


class ResponsesStream:
    """Chat chunk dicts in, Responses stream events out.

    ``start()`` gives ``response.created`` and ``response.in_progress``; each ``feed(chunk)`` the
    events for one chat chunk; ``finish()`` closes the open item and gives ``response.completed``
    (or ``response.incomplete`` when the engine hit its token limit); ``fail(error)`` ends with
    ``response.failed`` instead. Exactly one output item is open at a time, so every
    ``output_index`` is new, each ``added`` gets its ``done`` with the same identity, and the
    closing event carries the full output list, as the openai SDK's stream helper demands.

    >>> from proxy.dialects.responses.request import translate_request
    >>> s = ResponsesStream(translate_request({"input": "hi"}), "resp_1", 0)
    >>> [e["type"] for e in s.start() + s.feed({"choices": [{"index": 0, "delta": {"content": "Hi"}}]})]
    ['response.created', 'response.in_progress', 'response.output_item.added', 'response.content_part.added', \
'response.output_text.delta']
    >>> [e["type"] for e in s.finish()][-1], s.response["output"][0]["content"][0]["text"]
    ('response.completed', 'Hi')
    """

    def __init__(self, plan: ResponsesPlan, response_id: str, created_at: int) -> None:
        self._plan = plan
        self._id = response_id
        self._created_at = created_at
        self._phase = _Phase.NEW
        self._sequence = 0
        self._open: _Item | None = None
        self._output: list[Body] = []
        self._chat_calls: set[int] = set()
        self._finish_reason: str | None = None
        self._unspelled: list[Body] = []  # logprobs of tokens whose text the engine client holds back
        self._usage: Body | None = None
        self._model: str | None = None
        self.response: Body = self._snapshot("in_progress")

    # -- public steps ---------------------------------------------------------------------------

    def start(self) -> list[Event]:
        if self._phase is not _Phase.NEW:
            raise StreamStateError("start() called twice")
        self._phase = _Phase.OPEN
        snapshot = self._snapshot("in_progress")
        return [
            self._event("response.created", response=snapshot),
            self._event("response.in_progress", response=snapshot),
        ]

    def feed(self, chunk: Body) -> list[Event]:
        if self._phase is not _Phase.OPEN:
            raise StreamStateError(f"feed() while the stream is {self._phase.value}")
        if isinstance(chunk.get("model"), str):
            self._model = chunk["model"]
        usage = _usage(chunk.get("usage"))
        if usage is not None:
            self._usage = usage
        choices = chunk.get("choices")
        if choices is None:
            return []
        if not isinstance(choices, list):
            raise UpstreamError("the engine sent a chunk whose 'choices' is not a list")
        events: list[Event] = []
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                raise UpstreamError("the engine sent a malformed choice or more than one choice")
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                raise UpstreamError("the engine sent a malformed delta")
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                events += self._text("reasoning", reasoning)
            content = delta.get("content")
            logprobs = _logprobs_of(choice)
            if isinstance(content, str) and content:
                events += self._text("message", content, [*self._unspelled, *logprobs])
                self._unspelled = []
            elif logprobs:
                # The text of these tokens is held back (it may begin an end-of-turn marker): their
                # logprobs go with the next text, or onto the message when it closes.
                self._unspelled += logprobs
            calls = delta.get("tool_calls")
            if isinstance(calls, list):
                for call in calls:
                    events += self._call_delta(call)
            if isinstance(choice.get("finish_reason"), str):
                self._finish_reason = choice["finish_reason"]
                events += self._close("incomplete" if self._finish_reason in _TRUNCATED else "completed")
        return events

    def finish(self) -> list[Event]:
        if self._phase is not _Phase.OPEN:
            raise StreamStateError(f"finish() while the stream is {self._phase.value}")
        truncated = self._finish_reason in _TRUNCATED
        events = self._close("incomplete" if truncated else "completed")
        self._phase = _Phase.DONE
        if truncated:
            reason = _TRUNCATED[str(self._finish_reason)]
            self.response = self._snapshot("incomplete", incomplete_details={"reason": reason})
            return [*events, self._event("response.incomplete", response=self.response)]
        self.response = self._snapshot("completed")
        return [*events, self._event("response.completed", response=self.response)]

    def fail(self, error: ToolpairError) -> list[Event]:
        """End the stream with ``response.failed``; an open item is finished as incomplete first."""
        if self._phase is _Phase.DONE:
            raise StreamStateError("fail() after the stream ended")
        events = self.start() if self._phase is _Phase.NEW else []
        if self._open is not None and not self._open.announced:
            self._open = None  # never shown to the client, so nothing to finish
        events += self._close("incomplete")
        self._phase = _Phase.DONE
        self.response = self._snapshot("failed", error=response_error(error))
        return [*events, self._event("response.failed", response=self.response)]

    @property
    def finished(self) -> bool:
        """True once the engine gave a finish reason: the answer is whole."""
        return self._finish_reason is not None

    @property
    def completed(self) -> bool:
        """True once the response finished normally (completed or incomplete, not failed)."""
        return self._phase is _Phase.DONE and self.response["status"] != "failed"

    # -- building blocks ------------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> Event:
        event: Event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def _snapshot(self, status: str, **extra: Any) -> Body:
        echo = self._plan.echo
        return {
            "id": self._id,
            "object": "response",
            "created_at": self._created_at,
            "status": status,
            "error": extra.get("error"),
            "incomplete_details": extra.get("incomplete_details"),
            **echo,
            "model": echo["model"] or self._model or "unknown",
            "output": list(self._output),
            "usage": self._usage if status != "in_progress" else None,
        }

    def _new_item(self, kind: str, prefix: str) -> _Item:
        index = len(self._output)
        return _Item(kind, index, f"{prefix}_{self._id.removeprefix('resp_')}_{index}")

    def _added(self, item: _Item) -> Event:
        item.announced = True
        return self._event("response.output_item.added", output_index=item.index, item=self._body(item, "in_progress"))

    def _body(self, item: _Item, status: str) -> Body:
        """The item as the client sees it; ``status`` is in_progress until it is done."""
        text = "".join(item.parts)
        if item.kind == "message":
            content = [] if status == "in_progress" else [_text_part(text, item.logprobs)]
            return {"id": item.id, "type": "message", "status": status, "role": "assistant", "content": content}
        if item.kind == "reasoning":
            content = [] if status == "in_progress" else [{"type": "reasoning_text", "text": text}]
            return {"id": item.id, "type": "reasoning", "status": status, "summary": [], "content": content}
        assert item.ref is not None
        body: Body = {
            "id": item.id,
            "type": item.kind,
            "status": status,
            "call_id": item.call_id,
            "name": item.ref.name,
        }
        if item.ref.namespace is not None:
            body["namespace"] = item.ref.namespace
        if item.kind == "function_call":
            body["arguments"] = text if status != "in_progress" else ""
        else:
            body["input"] = _custom_input(text) if status != "in_progress" else ""
        return body

    def _text(self, kind: str, delta: str, logprobs: Sequence[Body] = ()) -> list[Event]:
        events: list[Event] = []
        item = self._open
        if item is None or item.kind != kind:
            events += self._close("completed")
            item = self._open = self._new_item(kind, "msg" if kind == "message" else "rs")
            events.append(self._added(item))
            part = _text_part("") if kind == "message" else {"type": "reasoning_text", "text": ""}
            events.append(self._event("response.content_part.added", **self._where(item), part=part))
        item.parts.append(delta)
        item.logprobs.extend(logprobs)
        name = "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        extra: Body = {"logprobs": list(logprobs)} if kind == "message" else {}
        events.append(self._event(name, **self._where(item), delta=delta, **extra))
        return events

    def _where(self, item: _Item, content: bool = True) -> Body:
        where: Body = {"item_id": item.id, "output_index": item.index}
        if content:
            where["content_index"] = 0
        return where

    def _call_delta(self, call: Any) -> list[Event]:
        if not isinstance(call, dict):
            raise UpstreamError("the engine sent a malformed tool call delta")
        chat_index = call.get("index", 0)
        function = call.get("function") or {}
        if not isinstance(chat_index, int) or not isinstance(function, dict):
            raise UpstreamError("the engine sent a malformed tool call delta")
        events: list[Event] = []
        item = self._open
        if item is None or item.chat_index != chat_index:
            if chat_index in self._chat_calls:
                raise UpstreamError(f"the engine resumed tool call {chat_index} after another output had started")
            events += self._close("completed")
            self._chat_calls.add(chat_index)
            item = self._open = self._new_item("function_call", "fc")
            item.chat_index = chat_index
        if not item.call_id and isinstance(call.get("id"), str) and call["id"]:
            item.call_id = call["id"]
        name = function.get("name")
        if item.ref is None and isinstance(name, str) and name:
            item.ref = self._plan.tools.ref(name)
            item.kind = "function_call" if item.ref.kind == "function" else "custom_tool_call"
            if item.kind == "custom_tool_call":
                item.id = "ctc" + item.id.removeprefix("fc")
            item.call_id = item.call_id or f"call_{item.id}"
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            item.parts.append(arguments)
        if item.ref is None:
            return events  # the name has not arrived yet: hold the arguments
        if not item.announced:
            events.append(self._added(item))
            held = "".join(item.parts)
            if held and item.kind == "function_call":
                events.append(
                    self._event("response.function_call_arguments.delta", **self._where(item, False), delta=held)
                )
        elif item.kind == "function_call" and isinstance(arguments, str) and arguments:
            events.append(
                self._event("response.function_call_arguments.delta", **self._where(item, False), delta=arguments)
            )
        return events

    def _close(self, status: str) -> list[Event]:
        """Finish the open item: its done events, then output_item.done; it joins the output list."""
        item = self._open
        if item is None:
            return []
        if not item.announced:
            raise UpstreamError("the engine sent a tool call without a function name")
        self._open = None
        if item.kind == "message" and self._unspelled:
            item.logprobs += self._unspelled
            self._unspelled = []
        body = self._body(item, status)
        events: list[Event] = []
        if item.kind in ("message", "reasoning"):
            text = body["content"][0]["text"]
            name = "response.output_text.done" if item.kind == "message" else "response.reasoning_text.done"
            extra: Body = {"logprobs": list(item.logprobs)} if item.kind == "message" else {}
            events.append(self._event(name, **self._where(item), text=text, **extra))
            events.append(self._event("response.content_part.done", **self._where(item), part=body["content"][0]))
        elif item.kind == "function_call":
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    **self._where(item, False),
                    name=body["name"],
                    arguments=body["arguments"],
                )
            )
        else:
            if body["input"]:
                events.append(
                    self._event(
                        "response.custom_tool_call_input.delta", **self._where(item, False), delta=body["input"]
                    )
                )
            events.append(
                self._event("response.custom_tool_call_input.done", **self._where(item, False), input=body["input"])
            )
        events.append(self._event("response.output_item.done", output_index=item.index, item=body))
        self._output.append(body)
        return events


def _text_part(text: str, logprobs: Sequence[Body] = ()) -> Body:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": list(logprobs)}


def _logprobs_of(choice: Body) -> list[Body]:
    """A chat choice's token logprobs (``logprobs.content``) in the Responses shape; [] when it has none.

    >>> entry = {"token": "Hi", "logprob": -0.5, "top_logprobs": [{"token": "Hi", "logprob": -0.5}]}
    >>> _logprobs_of({"logprobs": {"content": [entry]}})[0]["top_logprobs"]
    [{'token': 'Hi', 'logprob': -0.5, 'bytes': [72, 105]}]
    """
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list):
        return []
    out = []
    for entry in content:
        if not isinstance(entry, dict):
            continue
        top = entry.get("top_logprobs")
        alternatives = [_token_logprob(t) for t in top if isinstance(t, dict)] if isinstance(top, list) else []
        out.append({**_token_logprob(entry), "top_logprobs": alternatives})
    return out


def _token_logprob(entry: Body) -> Body:
    given = entry.get("token")
    token = given if isinstance(given, str) else ""
    raw = entry.get("bytes")
    return {
        "token": token,
        "logprob": entry.get("logprob"),
        "bytes": raw if isinstance(raw, list) else list(token.encode()),
    }


def _custom_input(arguments: str) -> str:
    """The free text of a custom tool call, from the ``{"input": ...}`` arguments of its function."""
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    if isinstance(parsed, dict) and isinstance(parsed.get("input"), str):
        return str(parsed["input"])
    return arguments


def chat_to_response(completion: Body, plan: ResponsesPlan, response_id: str, created_at: int) -> Body:
    """A whole ``chat.completion`` as a Response object (the stream transducer, fed once).

    >>> from proxy.dialects.responses.request import translate_request
    >>> plan = translate_request({"model": "m", "input": "hi"})
    >>> done = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello"},
    ...          "finish_reason": "stop"}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}
    >>> r = chat_to_response(done, plan, "resp_1", 0)
    >>> r["status"], r["output"][0]["content"][0]["text"], r["usage"]["total_tokens"]
    ('completed', 'Hello', 4)
    """
    choices = completion.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise UpstreamError("the engine answered without a choice")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise UpstreamError("the engine answered without a message")
    calls = message.get("tool_calls")
    delta: Body = {
        "reasoning_content": message.get("reasoning_content") or message.get("reasoning"),
        "content": message.get("content"),
        "tool_calls": [{**call, "index": i} if isinstance(call, dict) else call for i, call in enumerate(calls)]
        if isinstance(calls, list)
        else None,
    }
    stream = ResponsesStream(plan, response_id, created_at)
    stream.start()
    stream.feed(
        {
            "model": completion.get("model"),
            "usage": completion.get("usage"),
            "choices": [
                {
                    "index": 0,
                    "delta": delta,
                    "logprobs": choice.get("logprobs"),
                    "finish_reason": choice.get("finish_reason"),
                }
            ],
        }
    )
    stream.finish()
    return stream.response


def encode(events: Sequence[Event]) -> bytes:
    """Events as SSE frames, each named by its type, as the Responses API sends them."""
    return b"".join(encode_event(orjson.dumps(event), event["type"]) for event in events)


class ResponsesFrames:
    """:class:`ResponsesStream` with SSE bytes out, as :func:`proxy.http.streaming.stream_reply` drives it.

    A stream the engine ends without a finish reason is not a finished answer: it fails, and the
    response is never stored as completed.
    """

    done = False

    def __init__(self, stream: ResponsesStream) -> None:
        self.stream = stream

    def start(self) -> bytes:
        return encode(self.stream.start())

    def ping(self) -> bytes:
        return b""

    def feed(self, chunk: Body) -> bytes:
        return encode(self.stream.feed(chunk))

    def finish(self) -> bytes:
        if not self.stream.finished:
            raise UpstreamError("the engine ended the stream before it finished the response")
        return encode(self.stream.finish())

    def fail(self, error: ToolpairError) -> bytes:
        return encode(self.stream.fail(error))
