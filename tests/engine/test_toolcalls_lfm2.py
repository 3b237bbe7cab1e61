"""LFM2 and LFM2.5: ``<|tool_call_start|>[f(a=1), g(b="x")]<|tool_call_end|>``, read from LFM2's own templates."""

from __future__ import annotations

import pytest

from proxy.engine.toolcalls import ExtractOptions, detect_tool_call_format
from tests.support import template_replies as replies

LFM2 = ExtractOptions(calls="lfm2", tools=replies.TOOLS)
END = "<|tool_call_end|>"
RENDERS_CALLS = "LFM2.5-8B-A1B"
"""LFM2-8B-A1B's template prints an assistant turn's calls only as its content; LFM2.5-Instruct's
names no marker at all, so nothing in it says the format."""


@pytest.mark.parametrize("name", ["LFM2-8B-A1B", RENDERS_CALLS])
def test_every_lfm2_template_is_detected(name: str) -> None:
    assert detect_tool_call_format(replies.template_text(name)) == "lfm2"


@pytest.mark.parametrize("calls", ["lfm2", "auto"])
def test_the_templates_own_parallel_calls_are_read_back(calls: str) -> None:
    text = replies.rendered_reply(RENDERS_CALLS, END)
    assert "get_weather(city=" in text  # Python call syntax, not JSON
    replies.assert_read_back(text, ExtractOptions(calls=calls, tools=replies.TOOLS))


def test_python_literals_become_json_and_a_dotted_name_stays_whole() -> None:
    text = "<|tool_call_start|>[tools.f(a=None, b=(1, 2), c={'k': [True, -1.5]}, d=\"x)]\")]<|tool_call_end|>"
    assert replies.calls_of(replies.extract(text, LFM2)[0]) == [
        ("tools.f", {"a": None, "b": [1, 2], "c": {"k": [True, -1.5]}, "d": "x)]"})
    ]


def test_a_single_call_without_the_list_is_read() -> None:
    assert replies.calls_of(replies.extract("<|tool_call_start|>f(a=1)<|tool_call_end|>", LFM2)[0]) == [("f", {"a": 1})]


def test_text_after_the_calls_stays_content() -> None:
    assert replies.calls_and_content("<|tool_call_start|>[f()]<|tool_call_end|> Done.", LFM2) == ([("f", {})], "Done.")


@pytest.mark.parametrize(
    "bad",
    [
        "<|tool_call_start|>[get_weather('Paris')]<|tool_call_end|>",  # positional
        "<|tool_call_start|>[get_weather(city=__import__('os').getcwd())]<|tool_call_end|>",  # not a literal
        "<|tool_call_start|>[get_weather(**{'city': 'Paris'})]<|tool_call_end|>",
        "<|tool_call_start|>[get_weather(city='Paris'),]]<|tool_call_end|>",  # not Python
        "<|tool_call_start|>[]<|tool_call_end|>",
        "<|tool_call_start|>['get_weather']<|tool_call_end|>",
        "<|tool_call_start|>[get_weather(tags={1, 2})]<|tool_call_end|>",  # a set has no JSON
        "<|tool_call_start|>[get_weather(city='Paris')]",  # cut off
    ],
)
def test_malformed_calls_stay_content(bad: str) -> None:
    replies.assert_stays_content("Sure. " + bad, LFM2)


def test_parallel_off_keeps_the_first() -> None:
    replies.assert_parallel_off_keeps_the_first(replies.rendered_reply(RENDERS_CALLS, END), "lfm2")
