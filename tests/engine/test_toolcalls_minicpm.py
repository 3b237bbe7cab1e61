"""MiniCPM 5: ``<function name="NAME"><param name="K">V</param></function>``, read from its own template.

Its template wraps a string with ``<`` in CDATA and writes a list as Python does; both come back typed.
"""

from __future__ import annotations

import pytest

from proxy.engine.toolcalls import ExtractOptions, detect_tool_call_format
from tests.support import template_replies as replies

NAME = "openbmb-MiniCPM5-1B"
END = "</function>"
MINICPM = ExtractOptions(calls="minicpm5", tools=replies.TOOLS)


def test_the_template_is_detected() -> None:
    assert detect_tool_call_format(replies.template_text(NAME)) == "minicpm5"


@pytest.mark.parametrize("calls", ["minicpm5", "auto"])
def test_the_templates_own_parallel_calls_are_read_back_typed(calls: str) -> None:
    text = replies.rendered_reply(NAME, END)
    assert "<![CDATA[" in text and "['x', 'y']" in text  # what the template does to a string with < and a list
    replies.assert_read_back(text, ExtractOptions(calls=calls, tools=replies.TOOLS))


def test_without_the_schema_values_stay_text() -> None:
    events, _ = replies.extract(replies.rendered_reply(NAME, END), ExtractOptions(calls="minicpm5"))
    assert replies.calls_of(events)[1] == (
        "get_weather",
        {"city": 'New "York" <b>', "metric": "True", "tags": "['x', 'y']"},
    )


def test_text_between_and_after_the_calls_stays_content() -> None:
    one = '<function name="get_weather"><param name="city">Paris</param></function>'
    events, _ = replies.extract(f"A {one} B {one} C", MINICPM)
    assert replies.calls_of(events) == [("get_weather", {"city": "Paris"})] * 2
    assert replies.content_of(events) == "ABC"


@pytest.mark.parametrize(
    "bad",
    [
        '<function name="get_weather"><param name="city">Paris</param>',  # cut off
        '<function name="get_weather">Paris</function>',
        '<function name="get_weather"><param name="city">Paris</function>',
        '<function name=""></function>',
        '<function name="get_weather" <param name="city">Paris</param></function>',
    ],
)
def test_malformed_calls_stay_content(bad: str) -> None:
    replies.assert_stays_content("Sure. " + bad, MINICPM)


def test_another_quoting_is_no_call_at_all() -> None:
    text = "Sure. <function name='get_weather'></function>"
    events, extractor = replies.extract(text, MINICPM)
    assert replies.content_of(events) == text and extractor.malformed == 0


def test_cut_off_in_the_second_call_keeps_the_first() -> None:
    text = replies.rendered_reply(NAME, END)
    cut = text[: text.rindex("</param>")]
    replies.assert_stays_content(cut, MINICPM, calls=1)
    assert replies.content_of(replies.extract(cut, MINICPM)[0]) == replies.CONTENT + cut[cut.rindex("\n") + 1 :]


def test_parallel_off_keeps_the_first() -> None:
    replies.assert_parallel_off_keeps_the_first(replies.rendered_reply(NAME, END), "minicpm5")
