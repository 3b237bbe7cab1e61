"""gpt-oss and llm-jp 4.1 replies in OpenAI's harmony format: messages on channels, calls by recipient.

After the prompt's ``<|start|>assistant`` the model writes one or more
messages, each a header, ``<|message|>``, a body and an end token::

    <|channel|>analysis<|message|>Two cities, two calls.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Oslo"}<|call|>
    <|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Tokyo"}<|call|>
    <|channel|>final<|message|>It is warm in Paris.<|return|>

(gpt-oss's template puts the recipient in the role header, as in the third
line; llm-jp's writes ``<|constrain|> json``). The ``analysis`` channel is
reasoning, ``final`` and a ``commentary`` message without a recipient are
content, and a message to ``functions.NAME`` is a call whose body is the JSON
arguments. A call goes out when its body ends (``<|call|>``, ``<|end|>``, or
the end of the reply: engines stop at ``<|call|>`` and leave it out). A call
body that is not a JSON object, or a header that does not parse, goes out as
the text it was and is counted as malformed.

Hand-written, not OpenAI's ``openai-harmony``: that package (0.0.8) installs
here, but its parser reads *tokens* (``StreamableParser.process(token)``), and
it downloads the ``o200k_harmony`` vocabulary from the network on first use
(``load_harmony_encoding`` fails offline). toolpair gets *text* from the
engine, split anywhere, and runs where there is no network, so neither fits.

Muse Glimmer writes messages the same way with other tokens, recipients and call
bodies (see :mod:`._glimmer`): a :class:`HarmonyDialect` says which, and one reader
reads both.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from proxy.engine.toolcalls._calls import dump_arguments
from proxy.engine.toolcalls._events import Content, ParsedCall, Reasoning
from proxy.engine.toolcalls._scan import held_suffix, loads_strict

__all__ = ["HARMONY", "HARMONY_OPENERS", "HarmonyDialect", "HarmonyReader"]

START = "<|start|>"
CHANNEL = "<|channel|>"
MESSAGE = "<|message|>"
_ENDS = ("<|end|>", "<|call|>", "<|return|>")
HARMONY_OPENERS = (CHANNEL, START, " to=functions.")
"""How a harmony reply can begin; ``auto`` takes a reply that opens with one for harmony."""

_HEAD_LIMIT = 512
"""Longest header waited for; a longer one is not harmony."""
_HEAD_START = re.compile(r"\s*(?:<\|start\|>|<\|channel\|>|to=|assistant)")
_HEAD = re.compile(
    r"\s*(?:<\|start\|>)?\s*(?:assistant)?\s*(?:to=(?P<before>[^\s<]+))?\s*"
    r"(?:<\|channel\|>(?P<channel>[^\s<]+))?\s*(?:to=(?P<after>[^\s<]+))?\s*"
    r"(?:<\|constrain\|>)?\s*(?:[^\s<]+)?\s*"
)
_FUNCTIONS = "functions."

HarmonyEvent = Content | Reasoning | ParsedCall

CallBody = Callable[[str, str, Mapping[str, Any]], list[ParsedCall] | None]
"""A call message's (recipient name, body, tools) -> its calls, or None when the body is malformed."""


def _json_body(name: str, body: str, tools: Mapping[str, Any]) -> list[ParsedCall] | None:
    try:
        arguments = loads_strict(body) if body.strip() else {}
    except ValueError:
        return None
    if not isinstance(arguments, dict) or not name:
        return None
    return [ParsedCall(name, dump_arguments(arguments))]


@dataclass(frozen=True)
class HarmonyDialect:
    """One family's spelling of messages: the end tokens, what recipients mean, and how a call body reads."""

    ends: tuple[str, ...]
    call_prefix: str
    """A recipient with this prefix is a call of the name after it (any recipient, when empty)."""
    call_body: CallBody
    reasoning_to: str | None = None
    """The recipient whose messages are reasoning (Glimmer's ``self``); harmony says it by channel."""
    content_to: str | None = None
    """The recipient whose messages are content (Glimmer's ``user``)."""


HARMONY = HarmonyDialect(_ENDS, _FUNCTIONS, _json_body)


class HarmonyReader:
    """Harmony text in, content, reasoning and calls out: ``feed`` and ``finish``, any split alike.

    ``tools`` are the request's function tools; None reads no calls (a message
    to a recipient then stays text). ``malformed`` counts call messages that
    went out as text.
    """

    def __init__(self, tools: Mapping[str, Any] | None, dialect: HarmonyDialect = HARMONY) -> None:
        self._tools = tools
        self._dialect = dialect
        self._longest_end = max(map(len, dialect.ends))
        self._buffer = ""
        self._phase = "between"  # between messages, head, body, plain (not harmony: all text)
        self._head = ""  # the current message's header, as written, for a malformed call
        self._kind = "content"  # what the body is: content, reasoning or call
        self._name = ""
        self._searched = 0  # how much of the body has been searched for an end token
        self.malformed = 0

    def feed(self, text: str) -> list[HarmonyEvent]:
        self._buffer += text
        return self._run(final=False)

    def finish(self) -> list[HarmonyEvent]:
        return self._run(final=True)

    def _run(self, final: bool) -> list[HarmonyEvent]:
        out: list[HarmonyEvent] = []
        while self._buffer and self._advance(out, final):
            pass
        return out

    def _advance(self, out: list[HarmonyEvent], final: bool) -> bool:
        """One step; True when it should run again."""
        if self._phase == "between":
            return self._between(out, final)
        if self._phase == "head":
            return self._header(out, final)
        if self._phase == "body":
            return self._body(out, final)
        out.append(Content(self._buffer))
        self._buffer = ""
        return False

    def _between(self, out: list[HarmonyEvent], final: bool) -> bool:
        stripped = self._buffer.lstrip()
        if not stripped:
            return False
        head = _HEAD_START.match(self._buffer)
        if head is not None:
            self._phase = "head"
            return True
        if not final and any(o.strip().startswith(stripped) for o in (START, CHANNEL, "to=", "assistant")):
            return False
        self._phase = "plain"
        return True

    def _header(self, out: list[HarmonyEvent], final: bool) -> bool:
        end = self._buffer.find(MESSAGE)
        if end < 0:
            if final or len(self._buffer) > _HEAD_LIMIT:
                if self._tools is not None and "to=" in self._buffer:
                    self.malformed += 1  # a call's header, cut off
                self._phase = "plain"
                return True
            return False
        self._head = self._buffer[: end + len(MESSAGE)]
        self._buffer = self._buffer[end + len(MESSAGE) :]
        self._phase, self._searched = "body", 0
        match = _HEAD.fullmatch(self._head, 0, end)
        if match is None:
            self._kind = "content"
            out.append(Content(self._head))
            return True
        recipient = match["before"] or match["after"]
        dialect = self._dialect
        if recipient is not None and recipient in (dialect.reasoning_to, dialect.content_to):
            self._kind = "reasoning" if recipient == dialect.reasoning_to else "content"
        elif recipient is not None:
            name = recipient.removeprefix(dialect.call_prefix)
            reads = self._tools is not None and (recipient.startswith(dialect.call_prefix) or name in self._tools)
            self._kind, self._name = ("call", name) if reads else ("text", "")
            if self._kind == "text":
                out.append(Content(self._head))
        else:
            self._kind = "reasoning" if match["channel"] == "analysis" else "content"
        return True

    def _body(self, out: list[HarmonyEvent], final: bool) -> bool:
        ends = self._dialect.ends
        start = max(0, self._searched - self._longest_end)
        found = min(((i, e) for e in ends if (i := self._buffer.find(e, start)) >= 0), default=None)
        if self._kind == "call":
            if found is None and not final:
                self._searched = len(self._buffer)
                return False
            body = self._buffer if found is None else self._buffer[: found[0]]
            closing = "" if found is None else found[1]
            self._buffer = "" if found is None else self._buffer[found[0] + len(closing) :]
            self._phase = "between"
            calls = self._dialect.call_body(self._name, body, self._tools or {})
            if not calls:
                self.malformed += 1
                out.append(Content(self._head + body + closing))
            else:
                out.extend(calls)
            return True
        if found is not None:
            text, self._buffer = self._buffer[: found[0]], self._buffer[found[0] + len(found[1]) :]
            self._phase = "between"
            if self._kind == "text":
                text += found[1]
        else:
            keep = 0 if final else held_suffix(self._buffer, ends)
            text, self._buffer = self._buffer[: len(self._buffer) - keep], self._buffer[len(self._buffer) - keep :]
        if text:
            out.append(Reasoning(text) if self._kind == "reasoning" else Content(text))
        return found is not None
