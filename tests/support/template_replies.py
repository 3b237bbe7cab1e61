"""What a model writes, taken from its own chat template, and the reading of it back, for the format tests.

A template renders an assistant turn exactly as its model was trained to write it, so its rendering of a
turn with two parallel calls is the model's real call format: the text the parser tests feed their
extractor, instead of a hand-typed guess. The templates are llama.cpp's, from the pinned sdist
(``bench/template_survey.py``), fetched on first use and cached.

Two renderings, for two kinds of test:

- :func:`reply_after_prompt` renders check-template's own conversation (two calls, Paris then Tokyo, as
  ``engine_launcher.templates.template_check`` builds it) and keeps what follows the generation prompt: the exact
  bytes the model would write, reasoning and end-of-turn token included.
- :func:`rendered_reply` renders a weather turn whose arguments carry typed values (:data:`ARGUMENTS`)
  through the engine's renderer, with :data:`OPENAI_TOOLS` declared, and keeps the turn from its content
  to its last call: what :func:`assert_read_back` reads back as :data:`CONTENT` and :data:`CALLS`.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from bench import template_survey as survey
from engine_launcher.templates.chat_template import render_prompt
from engine_launcher.templates.template_check import conversation, render, template_from_file_text
from proxy.engine import toolcalls
from proxy.engine.toolcalls import Content, Event, ExtractOptions, Reasoning, TextExtractor, ToolCall

__all__ = [
    "ARGUMENTS",
    "CALLS",
    "CONTENT",
    "OPENAI_TOOLS",
    "TOOLS",
    "WEATHER",
    "assert_parallel_off_keeps_the_first",
    "assert_read_back",
    "assert_stays_content",
    "calls_and_content",
    "calls_of",
    "content_of",
    "counting_ids",
    "every_split",
    "extract",
    "merged",
    "rendered_history",
    "rendered_reply",
    "reply_after_prompt",
    "template_text",
    "with_parallel_off",
]

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


@lru_cache(maxsize=1)
def _templates() -> Path:
    return Path(survey.fetch_templates())


def template_text(name: str) -> str:
    """The Jinja source of llama.cpp's ``models/templates/NAME.jinja``."""
    return (_templates() / f"{name}.jinja").read_text()


# --- check-template's conversation: the bytes after the generation prompt ---------------------------


def rendered_history(name: str, turns: list[dict[str, Any]] | None = None) -> str:
    """The whole prompt for a question and ``turns`` (by default one assistant turn with the two calls)."""
    question, calls = conversation((0, 1))[:2]
    return render(template_from_file_text(template_text(name), name), [question, *(turns or [calls])])


def reply_after_prompt(name: str, until: str, turns: list[dict[str, Any]] | None = None) -> str:
    """What the model writes for ``turns`` (see :func:`rendered_history`): after the generation prompt, up to the
    last ``until`` (the end-of-turn token, or the next generation prompt)."""
    source = template_from_file_text(template_text(name), name)
    prompt = render(source, conversation((0, 1))[:1])
    history = rendered_history(name, turns)
    assert history.startswith(prompt), "the template renders its history unlike its generation prompt"
    return history[len(prompt) : history.rindex(until)]


# --- the weather turn with typed arguments: content then calls ---------------------------------------


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


# --- reading it back ---------------------------------------------------------------------------------


def counting_ids() -> Callable[[str], str]:
    """Fresh call IDs that name their style: ``openai-0``, ``mistral-1``, ..."""
    counter = itertools.count()
    return lambda style: f"{style}-{next(counter)}"


def merged(events: list[Event]) -> list[Event]:
    """Adjacent text pieces joined: how a client sees them."""
    out: list[Event] = []
    for event in events:
        if out and isinstance(event, (Content, Reasoning)) and type(out[-1]) is type(event):
            out[-1] = type(event)(out[-1].text + event.text)  # type: ignore[union-attr]
        else:
            out.append(event)
    return out


def extract(
    text: str,
    options: ExtractOptions,
    pieces: list[str] | None = None,
    *,
    ids: Callable[[str], str] | None = None,
) -> tuple[list[Event], TextExtractor]:
    """Events (adjacent text merged) from ``text`` fed in ``pieces`` (whole when None), and the extractor.

    Call IDs count from ``id-0`` whatever their style, unless ``ids`` makes them."""
    counter = itertools.count()
    extractor = TextExtractor(options, ids or (lambda style: f"id-{next(counter)}"))
    events: list[Event] = []
    for piece in pieces if pieces is not None else [text]:
        events += extractor.feed(piece)
    events += extractor.finish()
    return merged(events), extractor


def every_split(text: str, options: ExtractOptions) -> tuple[list[Event], TextExtractor]:
    """Asserts that every cut in two, and one character at a time, give the whole text's events and malformed
    count; returns the whole text's events and extractor."""
    whole, extractor = extract(text, options)
    for cut in range(len(text) + 1):
        events, split = extract(text, options, [text[:cut], text[cut:]])
        assert events == whole, cut
        assert split.malformed == extractor.malformed, cut
    one_by_one, by_char = extract(text, options, list(text))
    assert one_by_one == whole
    assert by_char.malformed == extractor.malformed
    return whole, extractor


def calls_of(events: list[Event]) -> list[tuple[str, Any]]:
    return [(e.name, json.loads(e.arguments)) for e in events if isinstance(e, ToolCall)]


def content_of(events: list[Event]) -> str:
    return "".join(e.text for e in events if isinstance(e, Content))


def calls_and_content(text: str, options: ExtractOptions) -> tuple[list[tuple[str, Any]], str]:
    """What a client gets from ``text`` read whole: the calls (name, parsed arguments) and the content."""
    events, _ = extract(text, options)
    return calls_of(events), content_of(events)


def assert_read_back(text: str, options: ExtractOptions, content: str = CONTENT) -> None:
    """The rendered reply gives its content, the two calls typed, fresh IDs, nothing malformed, on any split."""
    events, extractor = extract(text, options)
    assert content_of(events) == content
    assert calls_of(events) == CALLS
    assert len({e.id for e in events if isinstance(e, ToolCall)}) == 2
    assert extractor.malformed == 0
    every_split(text, options)


def assert_stays_content(text: str, options: ExtractOptions, calls: int = 0) -> None:
    """``text`` keeps its first ``calls`` calls; all else is content, and one block counts as malformed."""
    events, extractor = extract(text, options)
    assert calls_of(events) == CALLS[:calls]
    assert extractor.malformed == 1
    if not calls:
        assert content_of(events) == text.strip()
    every_split(text, options)


def with_parallel_off(text: str, options: ExtractOptions) -> list[Event]:
    """The events of ``text`` read whole with parallel calls off, once it is asserted that one call was dropped."""
    events, extractor = extract(text, replace(options, parallel=False))
    assert extractor.dropped == 1
    return events


def assert_parallel_off_keeps_the_first(text: str, calls: str) -> None:
    """With parallel calls off, the first of the rendered two calls of format ``calls`` stands; one is dropped."""
    assert calls_of(with_parallel_off(text, ExtractOptions(calls=calls, tools=TOOLS))) == CALLS[:1]


def assert_cut_off_after_the_first(text: str, second: int, cut: int, options: ExtractOptions) -> None:
    """``text`` cut at ``cut``, inside its second call (which starts at ``second``): the first call stands, the
    rest is content, one block counts as malformed, on any split."""
    events, extractor = extract(text[:cut], options)
    assert calls_of(events) == CALLS[:1]
    assert events[-1] == Content(text[second:cut])
    assert extractor.malformed == 1
    every_split(text[:cut], options)


def reading_reasoning(name: str, **options: Any) -> ExtractOptions:
    """Options that read reasoning with the markers template ``name`` renders, opened as its prompt opens them."""
    form = toolcalls.template_reasoning(template_text(name))
    assert form is not None
    return ExtractOptions(
        reasoning=True, think_open=form.opens_in_prompt, think_markers=(form.open, form.close), **options
    )
