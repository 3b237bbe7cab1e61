# ruff: noqa: RUF001, RUF002  # the fullwidth bar is how DeepSeek's tokenizer spells DSML
"""DeepSeek V3.2 and V4 (DSML): ``<｜DSML｜invoke name=...><｜DSML｜parameter name=K string="true|false">V``.

The calls are the ones DeepSeek's own templates render for two parallel calls: ``string="true"``
values are the text as it is, ``string="false"`` values are JSON.
"""

from __future__ import annotations

import pytest

from proxy.engine.toolcalls import ExtractOptions, detect_tool_call_format
from tests.support import template_replies as replies

DSML = ExtractOptions(calls="dsml", tools=replies.TOOLS)
TEMPLATES = [
    ("deepseek-ai-DeepSeek-V3.2", "</｜DSML｜function_calls>"),
    ("deepseek-ai-DeepSeek-V4", "</｜DSML｜tool_calls>"),
    ("deepseek-ai-DeepSeek-V4-Flash-0731", "</｜DSML｜tool_calls>"),
]


@pytest.mark.parametrize("calls", ["dsml", "auto"])
@pytest.mark.parametrize(("name", "end"), TEMPLATES)
def test_the_templates_own_parallel_calls_are_read_back(name: str, end: str, calls: str) -> None:
    assert detect_tool_call_format(replies.template_text(name)) == "dsml"
    text = replies.rendered_reply(name, end)
    assert 'string="false"' in text
    replies.assert_read_back(text, ExtractOptions(calls=calls, tools=replies.TOOLS))


def test_the_string_attribute_types_values_without_a_schema() -> None:
    """The model says which values are JSON: no schema is needed, and a JSON-looking string stays text."""
    events, _ = replies.extract(replies.rendered_reply(*TEMPLATES[0]), ExtractOptions(calls="dsml"))
    assert replies.calls_of(events) == replies.CALLS


def test_json_that_does_not_parse_falls_back_to_the_schema() -> None:
    text = (
        '<｜DSML｜function_calls><｜DSML｜invoke name="get_weather">'
        '<｜DSML｜parameter name="city" string="false">Paris</｜DSML｜parameter>'
        '<｜DSML｜parameter name="days" string="false"> 3 </｜DSML｜parameter>'
        "</｜DSML｜invoke></｜DSML｜function_calls>"
    )
    assert replies.calls_of(replies.extract(text, DSML)[0]) == [("get_weather", {"city": "Paris", "days": 3})]


def test_cut_off_in_the_second_call_keeps_the_first() -> None:
    text = replies.rendered_reply(*TEMPLATES[1])
    cut = text[: text.rindex("</｜DSML｜invoke>") + 3]
    replies.assert_stays_content(cut, DSML, calls=1)
    events, _ = replies.extract(cut, DSML)
    assert replies.content_of(events).startswith(replies.CONTENT) and replies.content_of(events).endswith("</｜")


@pytest.mark.parametrize(
    "bad",
    [
        '<｜DSML｜tool_calls><｜DSML｜invoke name="get_weather"><parameter name="city">Paris</parameter>'
        "</｜DSML｜invoke></｜DSML｜tool_calls>",  # MiniMax's tags inside a DSML block
        '<｜DSML｜tool_calls><｜DSML｜invoke name="get_weather" string="true"></｜DSML｜invoke></｜DSML｜tool_calls>',
        '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Pa',
    ],
)
def test_malformed_blocks_stay_content(bad: str) -> None:
    replies.assert_stays_content("Sure. " + bad, DSML)


def test_parallel_off_keeps_the_first() -> None:
    replies.assert_parallel_off_keeps_the_first(replies.rendered_reply(*TEMPLATES[0]), "dsml")


def test_v3_2_s_close_of_an_empty_think_before_the_calls_is_not_content() -> None:
    """V3.2's history renders a turn as ``</think>`` then its calls; with reasoning on, that close is dropped."""
    text = "</think>\n\n" + replies.rendered_reply(
        "deepseek-ai-DeepSeek-V3.2", "</｜DSML｜function_calls>", start="<｜DSML｜function_calls>"
    )
    replies.assert_read_back(text, ExtractOptions(calls="dsml", tools=replies.TOOLS, reasoning=True), content="")
