"""Muse Glimmer: harmony-like messages to recipients, each call an ``<atem:function_calls>`` block.

Read from the turn its own template renders: ``to=NAME`` messages of ATEM calls, ended by ``<|eom|>``.
"""

from __future__ import annotations

import pytest

from proxy.engine.toolcalls import ExtractOptions, Reasoning, detect_tool_call_format
from tests.support import template_replies as replies

NAME = "muse-glimmer"
GLIMMER = ExtractOptions(calls="glimmer", tools=replies.TOOLS, harmony=True, dialect="glimmer")
NO_TOOLS = ExtractOptions(harmony=True, dialect="glimmer")
PROMPT_END = "<|eot|><|start|>assistant"


def reply() -> str:
    """The assistant turn after the prompt's ``<|start|>assistant`` (a turn with calls renders no text)."""
    whole = replies.rendered_reply(NAME, "</atem:function_calls>", start="<s>")
    return whole[whole.index(PROMPT_END) + len(PROMPT_END) :]


def test_the_template_is_detected() -> None:
    assert detect_tool_call_format(replies.template_text(NAME)) == "glimmer"


def test_the_templates_own_parallel_calls_are_read_back_typed() -> None:
    text = reply()
    assert text.startswith(" to=get_weather<|message|><atem:function_calls>") and "<|eom|><|start|>assistant" in text
    replies.assert_read_back(text, GLIMMER, content="")


def test_a_message_to_self_is_reasoning_and_one_to_user_content() -> None:
    assert "to=self<|message|>" in replies.template_text(NAME)
    text = " to=self<|message|>Two cities.<|eom|><|start|>assistant" + reply() + "<|eom|>"
    text += "<|start|>assistant to=user<|message|>Asking.<|eot|>"
    events, _ = replies.extract(text, GLIMMER)
    assert [e.text for e in events if isinstance(e, Reasoning)] == ["Two cities."]
    assert replies.calls_of(events) == replies.CALLS and replies.content_of(events) == "Asking."
    events, _ = replies.extract(
        " to=self<|message|>Two cities.<|eom|><|start|>assistant to=user<|message|>Hi.", NO_TOOLS
    )
    assert [e.text for e in events if isinstance(e, Reasoning)] == ["Two cities."] and replies.content_of(
        events
    ) == "Hi."
    replies.every_split(text, GLIMMER)


def test_a_plain_reply_to_user_is_its_text() -> None:
    events, _ = replies.extract(" to=user<|message|>Hello there.", NO_TOOLS)
    assert replies.content_of(events) == "Hello there." and replies.calls_of(events) == []


@pytest.mark.parametrize(
    "bad",
    [
        ' to=get_weather<|message|><atem:function_calls>\n<atem:invoke name="get_weather">\n'
        '<atem:parameter name="city">Paris</atem:parameter>\n',  # cut off
        ' to=get_weather<|message|>{"city": "Paris"}<|eom|>',  # harmony's JSON body is not Glimmer's
        ' to=get_weather<|message|><atem:function_calls>\n<atem:invoke name="get_weather">\nParis\n'
        "</atem:invoke>\n</atem:function_calls><|eom|>",
        " to=get_weather<|message|><atem:function_calls>\n</atem:function_calls><|eom|>",
    ],
)
def test_malformed_calls_stay_content(bad: str) -> None:
    events, extractor = replies.extract(bad, GLIMMER)
    assert replies.calls_of(events) == [] and extractor.malformed == 1
    assert bad.split("<|message|>")[1].split("<|eom|>")[0] in replies.content_of(events)
    replies.every_split(bad, GLIMMER)


def test_cut_off_in_the_second_call_keeps_the_first() -> None:
    text = reply()
    events, extractor = replies.extract(text[: text.rindex("</atem:invoke>")], GLIMMER)
    assert replies.calls_of(events) == replies.CALLS[:1] and extractor.malformed == 1


def test_parallel_off_keeps_the_first() -> None:
    options = ExtractOptions(calls="glimmer", tools=replies.TOOLS, harmony=True, dialect="glimmer")
    assert replies.calls_of(replies.with_parallel_off(reply(), options)) == replies.CALLS[:1]
