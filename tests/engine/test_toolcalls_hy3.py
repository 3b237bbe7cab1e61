# ruff: noqa: RUF001  # the fullwidth bar is how Hunyuan's tokenizer spells its end of turn
"""Hunyuan Hy3: GLM's pairs with ``:opensource`` tags in a ``<tool_calls:opensource>`` section, from its template."""

from __future__ import annotations

import pytest

from proxy.engine.toolcalls import ExtractOptions, Reasoning, detect_tool_call_format, template_reasoning
from tests.support import template_replies as replies

NAME = "tencent-Hy3"
END = "</tool_calls:opensource>"
EOS = "<｜hy_eos:opensource｜>"
HY3 = ExtractOptions(calls="hy3", tools=replies.TOOLS)


def reply() -> str:
    return replies.rendered_reply(NAME, END)


def test_the_template_is_detected() -> None:
    assert detect_tool_call_format(replies.template_text(NAME)) == "hy3"


@pytest.mark.parametrize("calls", ["hy3", "auto"])
def test_the_templates_own_parallel_calls_are_read_back_typed(calls: str) -> None:
    assert "<tool_sep:opensource>" in reply()
    replies.assert_read_back(reply(), ExtractOptions(calls=calls, tools=replies.TOOLS))


def test_the_end_of_turn_token_the_template_writes_after_the_section_is_not_content() -> None:
    assert "'<｜hy_eos{}｜>'.format(HYTK)" in replies.template_text(NAME)
    replies.assert_read_back(reply() + EOS, HY3)


def test_text_after_the_section_stays_content() -> None:
    assert replies.calls_and_content(reply() + "\nDone.", HY3) == (replies.CALLS, replies.CONTENT + "Done.")


def test_its_reasoning_markers_go_to_reasoning() -> None:
    form = template_reasoning(replies.template_text(NAME))
    assert form is not None and form.open == "<think:opensource>"
    options = ExtractOptions(calls="hy3", tools=replies.TOOLS, reasoning=True, think_markers=(form.open, form.close))
    text = "<think:opensource>Two calls.</think:opensource>" + reply()
    events, _ = replies.extract(text, options)
    assert [e.text for e in events if isinstance(e, Reasoning)] == ["Two calls."]
    assert replies.calls_of(events) == replies.CALLS
    replies.every_split(text, options)


@pytest.mark.parametrize(
    "bad",
    [
        "<tool_calls:opensource>\n<tool_call:opensource>get_weather<tool_sep:opensource>\n"
        "<arg_key:opensource>city</arg_key:opensource>\n<arg_value:opensource>Paris",  # cut off
        "<tool_calls:opensource>\n<tool_call:opensource>get_weather\n<arg_key:opensource>city</arg_key:opensource>\n"
        "<arg_value:opensource>Paris</arg_value:opensource>\n</tool_call:opensource>\n</tool_calls:opensource>",
        "<tool_calls:opensource>\n<tool_call:opensource>get_weather<tool_sep:opensource>\n<arg_key>city</arg_key>\n"
        "</tool_call:opensource>\n</tool_calls:opensource>",
        "<tool_calls:opensource>\n</tool_calls:opensource>",
    ],
)
def test_malformed_calls_stay_content(bad: str) -> None:
    replies.assert_stays_content("Sure. " + bad, HY3)


def test_cut_off_in_the_second_call_keeps_the_first() -> None:
    text = reply()
    replies.assert_stays_content(text[: text.rindex("</tool_call:opensource>")], HY3, calls=1)


def test_parallel_off_keeps_the_first() -> None:
    replies.assert_parallel_off_keeps_the_first(reply(), "hy3")
