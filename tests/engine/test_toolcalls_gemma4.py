"""Gemma 4: ``<|tool_call>call:NAME{key:<|"|>text<|"|>,n:3}<tool_call|>``, read from Gemma 4's own templates."""

from __future__ import annotations

import pytest

from proxy.engine.toolcalls import ExtractOptions, detect_tool_call_format
from tests.support import template_replies as replies

GEMMA4 = ExtractOptions(calls="gemma4", tools=replies.TOOLS)
TEMPLATES = ["google-gemma-4-31B-it", "google-gemma-4-31B-it-interleaved"]


def gemma_reply(name: str) -> str:
    """Gemma 4's template writes a turn's calls first and its text after them."""
    return replies.rendered_reply(name, replies.CONTENT, start="<|turn>model\n").removeprefix("<|turn>model\n")


@pytest.mark.parametrize("calls", ["gemma4", "auto"])
@pytest.mark.parametrize("name", TEMPLATES)
def test_the_templates_own_parallel_calls_are_read_back(name: str, calls: str) -> None:
    assert detect_tool_call_format(replies.template_text(name)) == "gemma4"
    text = gemma_reply(name)
    assert '<|"|>' in text
    replies.assert_read_back(text, ExtractOptions(calls=calls, tools=replies.TOOLS))


def test_the_quoting_types_values_without_a_schema() -> None:
    assert (
        replies.calls_of(replies.extract(gemma_reply(TEMPLATES[0]), ExtractOptions(calls="gemma4"))[0]) == replies.CALLS
    )


def test_nested_values_and_quoted_text_with_brackets() -> None:
    text = '<|tool_call>call:f{a:{b:[1, -2.5e3, null]},s:<|"|>x}, {y: ]<|"|>,<|"|>k k<|"|>:false}<tool_call|>'
    assert replies.calls_of(replies.extract(text, GEMMA4)[0]) == [
        ("f", {"a": {"b": [1, -2500.0, None]}, "s": "x}, {y: ]", "k k": False})
    ]


@pytest.mark.parametrize(
    "bad",
    [
        "<|tool_call>call:get_weather{city:Paris}<tool_call|>",  # a string without Gemma's quotes
        '<|tool_call>get_weather{city:<|"|>Paris<|"|>}<tool_call|>',  # no call:
        '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,}<tool_call|>',
        '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>',  # cut off
        "<|tool_call>call:f" + "{a:" * 100 + "1" + "}" * 100 + "<tool_call|>",  # deeper than any call
    ],
)
def test_malformed_calls_stay_content(bad: str) -> None:
    replies.assert_stays_content("Sure. " + bad, GEMMA4)


def test_cut_off_in_the_second_call_keeps_the_first() -> None:
    text = gemma_reply(TEMPLATES[0])
    replies.assert_stays_content(text[: text.rindex("<tool_call|>")], GEMMA4, calls=1)


def test_parallel_off_keeps_the_first() -> None:
    replies.assert_parallel_off_keeps_the_first(gemma_reply(TEMPLATES[0]), "gemma4")


def test_the_31b_template_s_hand_over_after_the_calls_is_the_turn_s_close() -> None:
    """Gemma 4 31B's template ends a turn of calls with ``<|tool_response>``, not ``<turn|>``."""
    text = gemma_reply(TEMPLATES[0])
    calls = text[: text.rindex("<tool_call|>") + len("<tool_call|>")]
    replies.assert_read_back(calls + "<|tool_response>", GEMMA4, content="")
    assert replies.calls_and_content(calls + "<|tool_response> Sure.", GEMMA4) == (replies.CALLS, "Sure.")
    cut = "<|tool_respite"  # only the whole marker is the close
    assert replies.calls_and_content(calls + cut, GEMMA4) == (replies.CALLS, cut)
