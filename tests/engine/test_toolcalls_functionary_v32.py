"""Functionary v3.2: ``RECIPIENT\\nBODY`` segments joined by ``>>>``, the first opened by the prompt.

Read from its own template's turn: the generation prompt ends with ``>>>``, so the reply starts with a
recipient; ``all`` is the user (content), a tool's name makes the body its JSON arguments.
"""

from __future__ import annotations

import json

import pytest

from engine_launcher.templates.chat_template import render_prompt
from engine_launcher.templates.template_check import conversation, render, template_from_file_text
from proxy.engine.toolcalls import Content, ExtractOptions, detect_tool_call_format
from tests.support import template_replies as replies

V32 = "meetkai-functionary-medium-v3.2"
OPTIONS = ExtractOptions(calls="functionary-v3.2", tools=replies.TOOLS)
EOT = "<|eot_id|>"


def turn() -> str:
    """The turn after the prompt's ``>>>``: the content's segment, then one per call.

    Rendered as ``toolpair serve``'s engine renders it: the template adds each call's arguments to a
    string, so it gets the client's JSON text.
    """
    calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
        for i, (name, arguments) in enumerate(replies.CALLS)
    ]
    messages = [
        {"role": "user", "content": "Weather in Paris and New York?"},
        {"role": "assistant", "content": replies.CONTENT, "tool_calls": calls},
    ]
    text = render_prompt(replies.template_text(V32), messages, bos_token="", eos_token="", tools=replies.OPENAI_TOOLS)
    return text[text.rindex("all\n" + replies.CONTENT) : text.rindex(EOT)]


def test_detected_from_the_real_template_whose_prompt_opens_the_first_segment() -> None:
    template = replies.template_text(V32)
    assert detect_tool_call_format(template) == "functionary-v3.2"
    prompt = render(template_from_file_text(template, V32), conversation((0, 1))[:1])
    assert prompt.endswith(">>>")


def test_the_templates_own_content_and_parallel_calls_are_read_back() -> None:
    text = turn()
    assert text.count(">>>get_weather\n{") == 2
    replies.assert_read_back(text, OPTIONS)


def test_a_reply_that_writes_the_prompts_separator_again_reads_the_same() -> None:
    replies.assert_read_back(">>>" + turn(), OPTIONS)


def test_calls_alone_as_the_first_segment() -> None:
    text = turn().split(">>>", 1)[1]
    assert text.startswith("get_weather\n{")
    replies.assert_read_back(text, OPTIONS, content="")


@pytest.mark.parametrize("tools", [replies.TOOLS, {}])
def test_a_plain_answer_is_clean_content_with_tools_or_without(tools: dict[str, object]) -> None:
    options = ExtractOptions(calls="functionary-v3.2", tools=tools)
    events, extractor = replies.extract("all\nIt is sunny in Paris.", options)
    assert events == [Content("It is sunny in Paris.")] and extractor.malformed == 0
    replies.every_split("all\nIt is sunny in Paris.", options)


@pytest.mark.parametrize(
    "text",
    [
        "It is sunny.\nBring a hat.",  # no recipient line
        "all\nIn Python, >>> print(1) prints 1.",  # >>> in prose
        "all\nHere:>>>python\nprint(1)",  # a recipient the request did not offer
        "Sure\nI can do that.",
    ],
)
def test_text_that_is_no_call_stays_content_uncounted(text: str) -> None:
    events, extractor = replies.extract(text, OPTIONS)
    assert replies.calls_of(events) == [] and extractor.malformed == 0
    assert replies.content_of(events) == text.removeprefix("all\n")
    replies.every_split(text, OPTIONS)


def test_a_tool_without_tools_in_the_request_stays_content() -> None:
    events, _ = replies.extract(turn(), ExtractOptions(calls="functionary-v3.2"))
    assert replies.calls_of(events) == [] and replies.content_of(events).startswith(
        replies.CONTENT + ">>>get_weather\n{"
    )


@pytest.mark.parametrize(
    "bad",
    [
        "get_weather\nParis",
        "get_weather\n[1]",
        'get_weather\n{"city": "Paris"',  # cut off
        'get_weather\n"Paris"',
    ],
)
def test_a_tools_malformed_segment_stays_content_and_is_counted(bad: str) -> None:
    replies.assert_stays_content(bad, OPTIONS)


def test_a_tool_named_with_no_body_is_a_cut_off_call() -> None:
    events, extractor = replies.extract("get_weather\n", OPTIONS)
    assert events == [Content("get_weather\n")] and extractor.malformed == 1


def test_a_call_cut_off_stays_content_after_the_calls_before_it() -> None:
    text = turn()
    second = text.rindex(">>>get_weather")
    cut = second + 30
    replies.assert_cut_off_after_the_first(text, second, cut, OPTIONS)


def test_parallel_off_keeps_the_first() -> None:
    replies.assert_parallel_off_keeps_the_first(turn(), "functionary-v3.2")
