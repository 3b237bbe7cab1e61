"""Chat Completions replies with calls and reasoning lifted out of ``content``.

:class:`ChunkExtractor` is the stream stage: ``chat.completion.chunk`` dicts
in, dicts out (``feed(chunk) -> list``, ``finish() -> list``). Each call goes
out as OpenAI sends one: a delta with its index, ID, type and name, then a
delta with its arguments. :func:`extract_completion` does the same to a whole
``chat.completion``, through the same :class:`TextExtractor`, so both agree.

A reply the engine already structured (``tool_calls`` present, content null)
passes untouched. ``finish_reason`` ``stop`` becomes ``tool_calls`` when a
call was found; ``length`` stays, so a cut-off reply still says so.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from proxy._types import Body
from proxy.engine.toolcalls._events import Content, Event, IdSource, Reasoning, ToolCall, random_call_id
from proxy.engine.toolcalls._text import ExtractOptions, TextExtractor

__all__ = ["ChunkExtractor", "Note", "extract_completion"]

Note = Callable[[int, int], None]
"""Told, for each finished reply, how many calls were extracted and how many call texts were malformed."""


def _finish_reason(reason: Any, extractor: TextExtractor) -> Any:
    return "tool_calls" if reason == "stop" and extractor.calls else reason


class ChunkExtractor:
    """Chunk dicts in, chunk dicts out, one :class:`TextExtractor` per choice.

    ``text`` keeps every piece of raw content the engine produced (for
    counting tokens when the engine reports no usage); ``usage_seen`` says
    whether the engine sent usage itself; ``note`` hears each choice's counts
    when it ends.
    """

    def __init__(
        self,
        options: ExtractOptions,
        ids: IdSource = random_call_id,
        *,
        keep_text: bool = False,
        note: Note | None = None,
    ) -> None:
        self._options = options
        self._note = note
        self._ids = ids
        self._choices: dict[Any, TextExtractor] = {}
        self._finished: set[Any] = set()
        self._head: Body = {}
        self._keep_text = keep_text
        self.text: list[str] = []
        self.usage_seen = False

    @property
    def head(self) -> Body:
        """The latest chunk's fields other than choices and usage (id, object, created, model, …)."""
        return self._head

    def _extractor(self, index: Any) -> TextExtractor:
        extractor = self._choices.get(index)
        if extractor is None:
            extractor = self._choices[index] = TextExtractor(self._options, self._ids)
        return extractor

    def _chunk(self, index: Any, delta: Body, finish: Any = None, logprobs: Any = None) -> Body:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return {**self._head, "choices": [choice]}

    def _events(self, index: Any, events: list[Event], logprobs: Any) -> list[Body]:
        out: list[Body] = []
        for event in events:
            if isinstance(event, Content):
                out.append(self._chunk(index, {"content": event.text}, logprobs=logprobs))
            elif isinstance(event, Reasoning):
                out.append(self._chunk(index, {"reasoning_content": event.text}, logprobs=logprobs))
            else:
                out.extend(self._call(index, event))
            logprobs = None  # logprobs ride on the first piece cut from their chunk
        return out

    def _call(self, index: Any, call: ToolCall) -> list[Body]:
        function = {"name": call.name, "arguments": ""}
        head = {"index": call.index, "id": call.id, "type": "function", "function": function}
        arguments = {"index": call.index, "function": {"arguments": call.arguments}}
        return [self._chunk(index, {"tool_calls": [head]}), self._chunk(index, {"tool_calls": [arguments]})]

    def feed(self, chunk: Body) -> list[Body]:
        self._head = {k: v for k, v in chunk.items() if k not in ("choices", "usage")}
        choices = chunk.get("choices")
        usage = chunk.get("usage")
        if usage is not None:
            self.usage_seen = True
        if not isinstance(choices, list) or not choices:
            return [chunk]
        out: list[Body] = []
        for choice in choices:
            # A choice of the wrong shape (or with a list or object as its index) goes on untouched.
            if (
                not isinstance(choice, dict)
                or not isinstance(choice.get("delta"), dict)
                or not isinstance(choice.get("index", 0), Hashable)
            ):
                out.append({**self._head, "choices": [choice]})
                continue
            index = choice.get("index", 0)
            delta = choice["delta"]
            content = delta.get("content")
            reason = choice.get("finish_reason")
            extractor = self._extractor(index)
            rest = {k: v for k, v in delta.items() if k != "content"}
            if rest:
                out.append(self._chunk(index, rest))
            events: list[Event] = []
            if isinstance(content, str) and content:
                if self._keep_text:
                    self.text.append(content)
                events = extractor.feed(content)
            if reason is not None:
                events += self._close(index, extractor)
            out.extend(self._events(index, events, choice.get("logprobs")))
            if reason is not None:
                out.append(self._chunk(index, {}, _finish_reason(reason, extractor)))
        if usage is not None:
            if out:
                out[-1] = {**out[-1], "usage": usage}
            else:
                out.append({**self._head, "choices": [], "usage": usage})
        return out

    def _close(self, index: Any, extractor: TextExtractor) -> list[Event]:
        if index in self._finished:
            return []
        self._finished.add(index)
        events = extractor.finish()
        if self._note is not None:
            self._note(extractor.calls, extractor.malformed)
        return events

    def finish(self) -> list[Body]:
        """End of the stream: whatever a choice still holds goes out (the engine sent no finish_reason)."""
        out: list[Body] = []
        for index, extractor in self._choices.items():
            out.extend(self._events(index, self._close(index, extractor), None))
        return out


def _extract_message(message: Body, options: ExtractOptions, ids: IdSource) -> tuple[Body | None, TextExtractor]:
    """The message with calls and reasoning moved out (None if nothing moved), and its extractor's counts."""
    extractor = TextExtractor(options, ids)
    content = message.get("content")
    if not isinstance(content, str) or message.get("tool_calls"):
        return None, extractor
    events = extractor.feed(content) + extractor.finish()
    text = "".join(e.text for e in events if isinstance(e, Content))
    reasoning = "".join(e.text for e in events if isinstance(e, Reasoning))
    calls = [e for e in events if isinstance(e, ToolCall)]
    if not calls and not reasoning and text == content:
        return None, extractor
    adapted: Body = {**message, "content": text or (None if calls else "")}
    if reasoning:
        adapted["reasoning_content"] = reasoning
    if calls:
        adapted["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls
        ]
    return adapted, extractor


def extract_completion(
    completion: Body, options: ExtractOptions, ids: IdSource = random_call_id, *, note: Note | None = None
) -> Body:
    """A ``chat.completion`` with calls and reasoning moved out of each choice's content.

    Returns the same object when nothing was found. ``note`` hears each choice's counts.

    >>> reply = {"choices": [{"index": 0, "finish_reason": "stop",
    ...          "message": {"role": "assistant", "content": '<tool_call>{"name": "f", "arguments": {}}</tool_call>'}}]}
    >>> choice = extract_completion(reply, ExtractOptions(calls="hermes"), lambda style: "call_1")["choices"][0]
    >>> choice["finish_reason"], choice["message"]["content"], choice["message"]["tool_calls"][0]["id"]
    ('tool_calls', None, 'call_1')
    """
    choices = completion.get("choices")
    if not options.active or not isinstance(choices, list):
        return completion
    adapted_choices: list[Any] = []
    changed = False
    for choice in choices:
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            adapted_choices.append(choice)
            continue
        adapted, extractor = _extract_message(message, options, ids)
        if note is not None:
            note(extractor.calls, extractor.malformed)
        if adapted is None:
            adapted_choices.append(choice)
            continue
        reason = _finish_reason(choice.get("finish_reason"), extractor)
        adapted_choices.append({**choice, "message": adapted, "finish_reason": reason})
        changed = True
    return {**completion, "choices": adapted_choices} if changed else completion
