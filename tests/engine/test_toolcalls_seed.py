"""Seed-OSS: ``<seed:tool_call><function=NAME><parameter=K>V</parameter></function></seed:tool_call>``.

Read from ByteDance Seed-OSS's own template, with its ``<seed:think>`` reasoning.
"""

from __future__ import annotations

import pytest

from proxy.engine.toolcalls import ExtractOptions, Reasoning, detect_tool_call_format, template_reasoning
from tests.support import template_replies as replies

NAME = "ByteDance-Seed-OSS"
END = "</seed:tool_call>"
SEED = ExtractOptions(calls="seed-oss", tools=replies.TOOLS)


def test_the_template_is_detected_as_seed_not_qwen3_coder() -> None:
    assert detect_tool_call_format(replies.template_text(NAME)) == "seed-oss"


@pytest.mark.parametrize("calls", ["seed-oss", "auto"])
def test_the_templates_own_parallel_calls_are_read_back_typed(calls: str) -> None:
    text = replies.rendered_reply(NAME, END)
    assert text.count("<seed:tool_call>") == 2 and "<function=get_weather>" in text
    replies.assert_read_back(text, ExtractOptions(calls=calls, tools=replies.TOOLS))


def test_its_seed_think_reasoning_goes_to_reasoning_before_the_calls() -> None:
    form = template_reasoning(replies.template_text(NAME))
    assert form is not None and (form.open, form.close) == ("<seed:think>", "</seed:think>")
    options = ExtractOptions(
        calls="seed-oss", tools=replies.TOOLS, reasoning=True, think_markers=(form.open, form.close)
    )
    text = "<seed:think>Two cities, two calls.</seed:think>" + replies.rendered_reply(NAME, END)
    events, _ = replies.extract(text, options)
    assert [e.text for e in events if isinstance(e, Reasoning)] == ["Two cities, two calls."]
    assert replies.content_of(events) == replies.CONTENT and replies.calls_of(events) == replies.CALLS
    replies.every_split(text, options)


def test_text_after_the_calls_stays_content() -> None:
    text = replies.rendered_reply(NAME, END) + "\nDone."
    assert replies.calls_and_content(text, SEED) == (replies.CALLS, replies.CONTENT + "Done.")


@pytest.mark.parametrize(
    "bad",
    [
        "<seed:tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter>",  # cut off
        "<seed:tool_call>\nget_weather(city='Paris')\n</seed:tool_call>",
        "<seed:tool_call>\n<function=get weather>\n</function>\n</seed:tool_call>",
        "<seed:tool_call>\n</seed:tool_call>",
    ],
)
def test_malformed_calls_stay_content(bad: str) -> None:
    replies.assert_stays_content("Sure. " + bad, SEED)


def test_cut_off_in_the_second_call_keeps_the_first() -> None:
    text = replies.rendered_reply(NAME, END)
    replies.assert_stays_content(text[: text.rindex("</function>")], SEED, calls=1)


def test_parallel_off_keeps_the_first() -> None:
    replies.assert_parallel_off_keeps_the_first(replies.rendered_reply(NAME, END), "seed-oss")
