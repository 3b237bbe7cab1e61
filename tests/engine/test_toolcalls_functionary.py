"""Functionary v3.1: ``<function=NAME>{...}</function>`` per call, read from its own template."""

from __future__ import annotations

import pytest

from proxy.engine.toolcalls import ExtractOptions, detect_tool_call_format
from tests.support import template_replies as replies

V31 = "meetkai-functionary-medium-v3.1"
FUNCTIONARY = ExtractOptions(calls="functionary-v3.1", tools=replies.TOOLS)
END = "</function>"


def test_the_template_is_detected() -> None:
    assert detect_tool_call_format(replies.template_text(V31)) == "functionary-v3.1"


@pytest.mark.parametrize("end_token", ["", "<|eom_id|>", "\n<|eot_id|>"])
def test_the_templates_own_parallel_calls_are_read_back(end_token: str) -> None:
    text = replies.rendered_reply(V31, END) + end_token
    assert text.count("<function=get_weather>{") == 2
    replies.assert_read_back(text, FUNCTIONARY)


def test_without_the_close_tag_the_call_stands_and_text_after_it_stays_content() -> None:
    events, _ = replies.extract('<function=f>{"a": 1}', FUNCTIONARY)
    assert replies.calls_of(events) == [("f", {"a": 1})]
    assert replies.calls_and_content("<function=f>{}</function> Done.", FUNCTIONARY) == ([("f", {})], "Done.")


@pytest.mark.parametrize(
    "bad",
    [
        '<function=get_weather>{"city": "Paris"',  # cut off
        "<function=get_weather>[1]</function>",
        "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>",  # Qwen3-Coder's form
        '<function=get weather>{"city": "Paris"}</function>',
        '<function=get_weather {"city": "Paris"}</function>',
        "<function=get_weather>",
    ],
)
def test_malformed_calls_stay_content(bad: str) -> None:
    replies.assert_stays_content("Sure. " + bad, FUNCTIONARY)


def test_parallel_off_keeps_the_first() -> None:
    replies.assert_parallel_off_keeps_the_first(replies.rendered_reply(V31, END), "functionary-v3.1")
