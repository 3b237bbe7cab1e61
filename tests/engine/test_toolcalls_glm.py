"""GLM 4.6/4.7, Ling 3.0, Spark 2.5, Poolside Laguna: ``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>``.

Each family's own template renders the two parallel calls; the extractor must read them back,
typed by the tool's schema, however the text is split.
"""

from __future__ import annotations

import re

import pytest

from proxy.engine.toolcalls import ExtractOptions, ToolCall, detect_tool_call_format
from tests.support import template_replies as replies

GLM_TEMPLATES = [
    "GLM-4.6",
    "GLM-4.7-Flash",
    "inclusionai-ling-3.0-flash",
    "Spark2.5",
    "poolside-Laguna-S-2.1",
    "poolside-Laguna-XS-2.1",
    "poolside-Laguna-XS.2",
]
END = "</tool_call>"
GLM = ExtractOptions(calls="glm", tools=replies.TOOLS)


@pytest.mark.parametrize("name", GLM_TEMPLATES)
def test_the_templates_own_parallel_calls_are_read_back_typed(name: str) -> None:
    text = replies.rendered_reply(name, END)
    assert "<arg_key>" in text
    assert detect_tool_call_format(replies.template_text(name)) == "glm"
    events, extractor = replies.extract(text, GLM)
    assert replies.content_of(events) == replies.CONTENT
    assert replies.calls_of(events) == replies.CALLS
    ids = [e.id for e in events if isinstance(e, ToolCall)]
    assert len(set(ids)) == 2 and extractor.malformed == 0
    replies.every_split(text, GLM)


def test_glm_47_writes_no_newline_after_the_name() -> None:
    text = replies.rendered_reply("GLM-4.7-Flash", END)
    assert "<tool_call>get_weather<arg_key>" in text
    assert replies.calls_of(replies.extract(text, GLM)[0]) == replies.CALLS


@pytest.mark.parametrize("calls", ["auto", "hermes"])
def test_auto_and_hermes_read_it_too(calls: str) -> None:
    """The tag is Hermes's; what follows it tells the families apart, so a sidecar's ``auto`` reads GLM."""
    text = replies.rendered_reply("GLM-4.6", END)
    assert replies.calls_of(replies.extract(text, ExtractOptions(calls=calls, tools=replies.TOOLS))[0]) == replies.CALLS


def test_without_the_tools_schema_values_stay_text() -> None:
    events, _ = replies.extract(replies.rendered_reply("GLM-4.6", END), ExtractOptions(calls="glm"))
    assert replies.calls_of(events)[0] == ("get_weather", {"city": "Paris", "note": "42", "days": "3"})


def test_a_cut_off_call_stays_content_and_is_counted() -> None:
    text = replies.rendered_reply("GLM-4.6", END)
    cut = text[: text.rindex("<arg_value>")]  # the second call cut off before its last value
    events, extractor = replies.extract(cut, GLM)
    assert replies.calls_of(events) == replies.CALLS[:1]
    assert replies.content_of(events).startswith(replies.CONTENT) and replies.content_of(events).endswith(
        cut[cut.rindex("<tool_call>") :]
    )
    assert extractor.malformed == 1
    replies.every_split(cut, GLM)


@pytest.mark.parametrize(
    "bad",
    [
        "<tool_call>get_weather<arg_key>city</arg_key>Paris</tool_call>",  # the value's tag missing
        "<tool_call>get_weather<arg_value>Paris</arg_value></tool_call>",  # a value without its key
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>",  # never closed
        "<tool_call>get weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>",
    ],
)
def test_malformed_calls_stay_content(bad: str) -> None:
    events, extractor = replies.extract("Sure. " + bad, GLM)
    assert replies.calls_of(events) == []
    assert replies.content_of(events) == "Sure. " + bad
    assert extractor.malformed == 1
    replies.every_split("Sure. " + bad, GLM)


def test_parallel_off_keeps_the_first_call() -> None:
    replies.assert_parallel_off_keeps_the_first(replies.rendered_reply("GLM-4.6", END), "glm")


def test_a_call_without_arguments_and_values_across_lines() -> None:
    text = (
        "<tool_call>get_time</tool_call><tool_call>get_weather\n"
        "<arg_key>city</arg_key>\n<arg_value>São\nPaulo</arg_value>\n</tool_call>"
    )
    events, _ = replies.extract(text, GLM, ids=replies.counting_ids())
    assert replies.calls_of(events) == [("get_time", {}), ("get_weather", {"city": "São\nPaulo"})]
    assert replies.content_of(events) == ""
    assert all(re.fullmatch(r"openai-\d", e.id) for e in events if isinstance(e, ToolCall))
    replies.every_split(text, GLM)
