"""Apertus: ``<|tools_prefix|>[{"NAME": {...}}, ...]<|tools_suffix|>``, read from its own template."""

from __future__ import annotations

import pytest

from proxy.engine.toolcalls import ExtractOptions, detect_tool_call_format
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
    text = '<|tools_prefix|>[{"name": {"name": "x"}}]<|tools_suffix|> Done.'
    assert replies.calls_and_content(text, APERTUS) == ([("name", {"name": "x"})], "Done.")


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
    replies.assert_parallel_off_keeps_the_first(replies.rendered_reply(NAME, END), "apertus")
