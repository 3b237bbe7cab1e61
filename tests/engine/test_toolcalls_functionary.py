"""Functionary v3.1: ``<function=NAME>{...}</function>`` per call, read from its own template."""

from __future__ import annotations

import pytest

from proxy.engine.toolcalls import ExtractOptions, detect_tool_call_format
from tests.support.template_replies import (
    TOOLS,
    assert_parallel_off_keeps_the_first,
    assert_read_back,
    assert_stays_content,
    calls_of,
    content_of,
    extract,
    rendered_reply,
    template_text,
)

V31 = "meetkai-functionary-medium-v3.1"
FUNCTIONARY = ExtractOptions(calls="functionary-v3.1", tools=TOOLS)
END = "</function>"


def test_the_template_is_detected() -> None:
    assert detect_tool_call_format(template_text(V31)) == "functionary-v3.1"


@pytest.mark.parametrize("end_token", ["", "<|eom_id|>", "\n<|eot_id|>"])
def test_the_templates_own_parallel_calls_are_read_back(end_token: str) -> None:
    text = rendered_reply(V31, END) + end_token
    assert text.count("<function=get_weather>{") == 2
    assert_read_back(text, FUNCTIONARY)


def test_without_the_close_tag_the_call_stands_and_text_after_it_stays_content() -> None:
    events, _ = extract('<function=f>{"a": 1}', FUNCTIONARY)
    assert calls_of(events) == [("f", {"a": 1})]
    events, _ = extract("<function=f>{}</function> Done.", FUNCTIONARY)
    assert calls_of(events) == [("f", {})] and content_of(events) == "Done."


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
    assert_stays_content("Sure. " + bad, FUNCTIONARY)


def test_parallel_off_keeps_the_first() -> None:
    assert_parallel_off_keeps_the_first(rendered_reply(V31, END), "functionary-v3.1")
