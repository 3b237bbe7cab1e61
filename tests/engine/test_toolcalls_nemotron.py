"""Nemotron Nano v2: ``<TOOLCALL>[{"name": ..., "arguments": {...}}, ...]</TOOLCALL>``, read from its own template."""

from __future__ import annotations

import pytest

from proxy.engine.toolcalls import ExtractOptions, Reasoning, detect_tool_call_format
from tests.support import template_replies as replies

NAME = "NVIDIA-Nemotron-Nano-v2"
NEMOTRON = ExtractOptions(calls="nemotron", tools=replies.TOOLS)
OPEN, END = "<TOOLCALL>", "</TOOLCALL>"


def turn() -> str:
    """The template's calls; it renders a turn's content apart from them, in a turn of its own."""
    return replies.rendered_reply(NAME, END, start=OPEN, follow_up=True)


def test_the_template_is_detected() -> None:
    assert detect_tool_call_format(replies.template_text(NAME)) == "nemotron"


@pytest.mark.parametrize("calls", ["nemotron", "auto"])
def test_the_templates_own_parallel_calls_are_read_back(calls: str) -> None:
    replies.assert_read_back(turn(), ExtractOptions(calls=calls, tools=replies.TOOLS), content="")


def test_content_before_the_calls_stays_content() -> None:
    replies.assert_read_back("Checking both cities.\n" + turn(), NEMOTRON)


def test_reasoning_the_prompt_opened_then_calls() -> None:
    options = ExtractOptions(calls="nemotron", tools=replies.TOOLS, reasoning=True, think_open=True)
    text = "Two cities, two calls.\n</think>\n\n" + turn()
    events, _ = replies.extract(text, options)
    assert [e.text for e in events if isinstance(e, Reasoning)] == ["Two cities, two calls.\n"]
    assert replies.calls_of(events) == replies.CALLS and replies.content_of(events) == ""
    replies.every_split(text, options)


def test_without_the_close_marker_the_calls_stand() -> None:
    text = '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}]'
    assert replies.calls_and_content(text, NEMOTRON) == ([("get_weather", {"city": "Paris"})], "")


def test_text_after_the_calls_stays_content() -> None:
    text = '<TOOLCALL>[{"name": "f", "arguments": {}}]</TOOLCALL> Done.'
    assert replies.calls_and_content(text, NEMOTRON) == ([("f", {})], "Done.")


@pytest.mark.parametrize(
    "bad",
    [
        '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}',  # cut off
        '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}, 3]</TOOLCALL>',
        '<TOOLCALL>[{"name": "get_weather", "arguments": [1]}]</TOOLCALL>',
        '<TOOLCALL>[{"arguments": {"city": "Paris"}}]</TOOLCALL>',  # no name
        '<TOOLCALL>{"name": "get_weather", "arguments": {}}</TOOLCALL>',  # not an array
        '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": NaN}}]</TOOLCALL>',  # not JSON
        "<TOOLCALL>[]</TOOLCALL>",
    ],
)
def test_malformed_calls_stay_content(bad: str) -> None:
    replies.assert_stays_content("Sure. " + bad, NEMOTRON)


def test_parallel_off_keeps_the_first() -> None:
    replies.assert_parallel_off_keeps_the_first(turn(), "nemotron")
