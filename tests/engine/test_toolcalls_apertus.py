"""Apertus: ``<|tools_prefix|>[{"NAME": {...}}, ...]<|tools_suffix|>``, read from its own template.

Its reasoning is a thoughts section, ``<|inner_prefix|>...<|inner_suffix|>``, and its calls may stand
inside it (the template renders a turn's thoughts, calls and more thoughts in one section).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine_launcher.templates.chat_template import render_prompt
from proxy.engine.toolcalls import Content, ExtractOptions, Reasoning, detect_tool_call_format, template_reasoning
from tests.support import template_replies as replies

NAME = "Apertus-8B-Instruct"
APERTUS = ExtractOptions(calls="apertus", tools=replies.TOOLS)
END = "<|tools_suffix|>"


def test_the_template_is_detected() -> None:
    assert detect_tool_call_format(replies.template_text(NAME)) == "apertus"


@pytest.mark.parametrize("calls", ["apertus", "auto"])
def test_the_templates_own_parallel_calls_are_read_back(calls: str) -> None:
    text = replies.rendered_reply(NAME, END)
    assert '[{"get_weather": {"city": "Paris"' in text  # the name is the key
    replies.assert_read_back(text, ExtractOptions(calls=calls, tools=replies.TOOLS))


def test_a_name_that_is_also_an_argument_key_stays_the_name() -> None:
    events, _ = replies.extract('<|tools_prefix|>[{"name": {"name": "x"}}]<|tools_suffix|> Done.', APERTUS)
    assert replies.calls_of(events) == [("name", {"name": "x"})] and replies.content_of(events) == "Done."


@pytest.mark.parametrize(
    "bad",
    [
        '<|tools_prefix|>[{"get_weather": {"city": "Paris"}}',  # cut off
        '<|tools_prefix|>[{"get_weather": {"city": "Paris"}, "get_time": {}}]<|tools_suffix|>',  # two names in one
        '<|tools_prefix|>[{"get_weather": "Paris"}]<|tools_suffix|>',
        "<|tools_prefix|>[{}]<|tools_suffix|>",
        '<|tools_prefix|>{"get_weather": {"city": "Paris"}}<|tools_suffix|>',  # not a list
        "<|tools_prefix|>[]<|tools_suffix|>",
    ],
)
def test_malformed_calls_stay_content(bad: str) -> None:
    replies.assert_stays_content("Sure. " + bad, APERTUS)


def test_parallel_off_keeps_the_first() -> None:
    options = ExtractOptions(calls="apertus", tools=replies.TOOLS, parallel=False)
    events, extractor = replies.extract(replies.rendered_reply(NAME, END), options)
    assert replies.calls_of(events) == replies.CALLS[:1] and extractor.dropped == 1


def thinking() -> ExtractOptions:
    """As ``toolpair serve`` sets up from the template: its reasoning pair, which the prompt does not open."""
    form = template_reasoning(replies.template_text(NAME), {"enable_thinking": True})
    assert form is not None and not form.opens_in_prompt
    return ExtractOptions(calls="apertus", tools=replies.TOOLS, reasoning=True, think_markers=(form.open, form.close))


def rendered_blocks(blocks: list[dict[str, Any]]) -> str:
    """An assistant turn of content blocks (thoughts, calls, response) as the template renders it."""
    messages = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": {"blocks": blocks}}]
    text = render_prompt(replies.template_text(NAME), messages, bos_token="", eos_token="")
    start = text.index("<|assistant_start|>") + len("<|assistant_start|>")
    return text[start:].removesuffix("<|assistant_start|>")


THOUGHTS = {"type": "thoughts", "text": "Two cities, two lookups."}
CALL_BLOCK = {
    "type": "tool_calls",
    "calls": [{"name": name, "arguments": json.dumps(arguments)} for name, arguments in replies.CALLS],
}


def test_its_reasoning_markers_come_from_the_template() -> None:
    assert thinking().think_markers == ("<|inner_prefix|>", "<|inner_suffix|>")


def test_thoughts_then_the_response() -> None:
    text = rendered_blocks([THOUGHTS, {"type": "response", "text": "Sunny."}])
    assert text == "<|inner_prefix|>Two cities, two lookups.<|inner_suffix|>Sunny."
    events, _ = replies.extract(text, thinking())
    assert events == [Reasoning("Two cities, two lookups."), Content("Sunny.")]
    replies.every_split(text, thinking())


def test_calls_inside_the_thoughts_are_calls_and_the_thoughts_go_on() -> None:
    text = rendered_blocks([THOUGHTS, CALL_BLOCK]) + "Now compare.<|inner_suffix|>Paris is warmer."
    assert text.startswith("<|inner_prefix|>Two cities, two lookups.<|tools_prefix|>[")
    events, extractor = replies.extract(text, thinking())
    assert events[0] == Reasoning("Two cities, two lookups.")
    assert replies.calls_of(events) == replies.CALLS
    assert events[-2:] == [Reasoning("Now compare."), Content("Paris is warmer.")]
    assert extractor.malformed == 0
    replies.every_split(text, thinking())


def test_a_malformed_call_inside_the_thoughts_stays_reasoning_and_is_counted() -> None:
    bad = '<|tools_prefix|>[{"get_weather": "Paris"}]<|tools_suffix|>'
    text = "<|inner_prefix|>Let me see. " + bad + " Hm.<|inner_suffix|>Done."
    events, extractor = replies.extract(text, thinking())
    assert replies.calls_of(events) == [] and extractor.malformed == 1
    assert "".join(e.text for e in events if isinstance(e, Reasoning)) == "Let me see. " + bad + " Hm."
    assert replies.content_of(events) == "Done."
    replies.every_split(text, thinking())


def test_other_formats_keep_a_marker_inside_reasoning_as_reasoning() -> None:
    text = '<think>I could write <tool_call>{"name": "get_weather", "arguments": {}}</tool_call></think>Hi.'
    events, _ = replies.extract(text, ExtractOptions(calls="hermes", tools=replies.TOOLS, reasoning=True))
    assert replies.calls_of(events) == [] and replies.content_of(events) == "Hi."


def test_the_arguments_typed_values_survive() -> None:
    events, _ = replies.extract(rendered_blocks([THOUGHTS, CALL_BLOCK]), thinking())
    assert [arguments for _, arguments in replies.calls_of(events)] == replies.ARGUMENTS
