"""Kimi K3: sections of ``<|open|>TAG<|sep|>`` tokens; reasoning, the response, and calls in ``tools``.

Read from its own template's turn: the reasoning section (the prompt opens it) goes to reasoning, the
response section's text to content without its tokens, the ``call`` elements to tool calls.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine_launcher.templates.chat_template import render_prompt
from proxy.engine.toolcalls import (
    CONTENT_WRAPPERS,
    Content,
    ExtractOptions,
    Reasoning,
    detect_tool_call_format,
)
from tests.support import template_replies as replies

K3 = "Kimi-K3"
RESPONSE = "<|open|>response<|sep|>"
TOOLS_END = "<|close|>tools<|sep|>"
WRAPPERS = CONTENT_WRAPPERS["kimi-k3"]
OPTIONS = ExtractOptions(calls="kimi-k3", tools=replies.TOOLS, wrappers=WRAPPERS)


def turn() -> str:
    """The response section and the calls, as K3's template renders them."""
    return replies.rendered_reply(K3, TOOLS_END, start=RESPONSE)


def thinking() -> ExtractOptions:
    options = replies.reading_reasoning(K3, calls="kimi-k3", tools=replies.TOOLS, wrappers=WRAPPERS)
    assert options.think_open
    return options


def test_detected_from_the_real_template() -> None:
    assert detect_tool_call_format(replies.template_text(K3)) == "kimi-k3"


@pytest.mark.parametrize("calls", ["kimi-k3", "auto"])
def test_the_templates_own_parallel_calls_are_read_back(calls: str) -> None:
    text = turn()
    assert text.count('<|open|>call tool="get_weather"') == 2
    replies.assert_read_back(text, ExtractOptions(calls=calls, tools=replies.TOOLS, wrappers=WRAPPERS))


def test_each_argument_says_its_type() -> None:
    events, _ = replies.extract(turn(), ExtractOptions(calls="kimi-k3", wrappers=WRAPPERS))  # no schema to type by
    assert replies.calls_of(events) == replies.CALLS  # "42" stays a string, 3 a number, true and the list JSON


def test_the_reasoning_the_prompt_opened_then_the_response_then_calls() -> None:
    text = "Two lookups.<|close|>think<|sep|>" + turn()
    events, _ = replies.extract(text, thinking())
    assert events[0] == Reasoning("Two lookups.")
    assert replies.content_of(events) == replies.CONTENT and replies.calls_of(events) == replies.CALLS
    replies.every_split(text, thinking())


def test_a_plain_reply_is_clean_content_with_tools_or_without() -> None:
    text = "Sure.<|close|>think<|sep|><|open|>response<|sep|>Sunny.<|close|>response<|sep|><|close|>message<|sep|>"
    for options in (thinking(), ExtractOptions(reasoning=True, think_open=True, wrappers=WRAPPERS)):
        options = ExtractOptions(**{**options.__dict__, "think_markers": thinking().think_markers})
        events, extractor = replies.extract(text, options)
        assert events == [Reasoning("Sure."), Content("Sunny.")]
        assert extractor.malformed == 0
        replies.every_split(text, options)


def test_arguments_as_one_json_element() -> None:
    calls = [
        {"type": "function", "function": {"name": "get_weather", "arguments": a, "_xtml_json_block": json.dumps(a)}}
        for a in replies.ARGUMENTS
    ]
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": calls},
    ]
    text = render_prompt(replies.template_text(K3), messages, bos_token="", eos_token="", as_transformers=True)
    text = text[text.rindex(RESPONSE) : text.rindex(TOOLS_END) + len(TOOLS_END)]
    assert '<|open|>json type="object"<|sep|>{' in text
    replies.assert_read_back(text, OPTIONS, content="")


def test_attribute_values_are_unescaped() -> None:
    text = turn().replace('key="note"', 'key="a &quot;b&quot; &amp; c"')
    events, _ = replies.extract(text, OPTIONS)
    assert replies.calls_of(events)[0][1]['a "b" & c'] == "42"


def test_the_reply_may_end_before_the_section_closes() -> None:
    text = turn().removesuffix(TOOLS_END)
    events, extractor = replies.extract(text, OPTIONS)
    assert replies.calls_of(events) == replies.CALLS and extractor.malformed == 0
    replies.every_split(text, OPTIONS)


def test_parallel_off_keeps_the_first() -> None:
    options = ExtractOptions(calls="kimi-k3", tools=replies.TOOLS, wrappers=WRAPPERS, parallel=False)
    events, extractor = replies.extract(turn(), options)
    assert replies.calls_of(events) == replies.CALLS[:1] and extractor.dropped == 1


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('<|open|>call tool="get_weather" index="1"', '<|open|>cal tool="get_weather" index="1"'),
        ('<|open|>call tool="get_weather" index="1"', '<|open|>call name="get_weather" index="1"'),
        ('<|open|>argument key="city" type="string"<|sep|>Paris', "Paris"),
        ("<|close|>call<|sep|><|open|>call", "<|open|>call"),
    ],
)
def test_a_malformed_section_stays_content_and_is_counted(old: str, new: str) -> None:
    text = turn()
    assert old in text
    tools = text[text.index("<|open|>tools<|sep|>") :].replace(old, new, 1)
    replies.assert_stays_content(tools, OPTIONS)


def test_malformed_json_stays_content() -> None:
    text = '<|open|>tools<|sep|><|open|>call tool="f"<|sep|><|open|>json type="object"<|sep|>[1]<|close|>json<|sep|>'
    replies.assert_stays_content(text + "<|close|>call<|sep|>" + TOOLS_END, OPTIONS)


def test_a_call_cut_off_stays_content_after_the_calls_before_it() -> None:
    text = turn()
    second = text.index('<|open|>call tool="get_weather" index="2"')
    cut = second + 60
    replies.assert_cut_off_after_the_first(text, second, cut, OPTIONS)


def test_auto_drops_the_response_sections_tokens_too() -> None:
    text = "<|open|>response<|sep|>Sunny.<|close|>response<|sep|>" + turn()
    options = ExtractOptions(calls="auto", tools=replies.TOOLS, wrappers=CONTENT_WRAPPERS["auto"])
    events, _ = replies.extract(text, options)
    assert replies.content_of(events) == "Sunny." + replies.CONTENT and replies.calls_of(events) == replies.CALLS
    replies.every_split(text, options)
