"""GigaChat 3 and 3.1 tool calls, read from the text their own templates render."""

from __future__ import annotations

import pytest

from proxy.engine.toolcalls import Content, ExtractOptions, ToolCall, detect_tool_call_format
from tests.support.template_replies import every_split, extract, reply_after_prompt, template_text

GIGACHAT = ["GigaChat3-10B-A1.8B", "GigaChat3.1-10B-A1.8B"]
TOOLS = {"get_weather": {"type": "object", "properties": {"city": {"type": "string"}}}}
PARIS = ToolCall(0, "id-0", "get_weather", '{"city":"Paris"}')
OPTIONS = ExtractOptions(calls="gigachat", tools=TOOLS)


def reply(name: str) -> str:
    """The call as the template writes it, up to the end of its message (both render the first call only)."""
    return reply_after_prompt(name, "<|message_sep|>")


@pytest.mark.parametrize("name", GIGACHAT)
def test_the_call_as_its_template_renders_it_at_every_split(name: str) -> None:
    events, extractor = every_split("Let me check.\n" + reply(name) + "<|message_sep|>", OPTIONS)
    assert events == [Content("Let me check."), PARIS]
    assert extractor.malformed == 0


@pytest.mark.parametrize("name", GIGACHAT)
def test_auto_reads_it(name: str) -> None:
    assert extract(reply(name), ExtractOptions(calls="auto", tools=TOOLS))[0] == [PARIS]


@pytest.mark.parametrize("name", GIGACHAT)
def test_malformed_arguments_stay_content_and_are_counted(name: str) -> None:
    text = reply(name).replace('"Paris"}}', '"Paris"}')
    events, extractor = every_split(text, OPTIONS)
    assert events == [Content(text)]
    assert extractor.malformed == 1


@pytest.mark.parametrize("name", GIGACHAT)
def test_a_call_cut_off_stays_content(name: str) -> None:
    text = reply(name)[:-12]
    events, extractor = every_split(text, OPTIONS)
    assert events == [Content(text)]
    assert extractor.malformed == 1


def test_an_ordinary_message_header_is_not_a_call() -> None:
    text = "Sunny.<|message_sep|>\n\nassistant<|role_sep|>\nMore."
    assert every_split(text, OPTIONS)[0] == [Content(text)]


@pytest.mark.parametrize("name", GIGACHAT)
def test_format_detected_from_the_real_template(name: str) -> None:
    assert detect_tool_call_format(template_text(name)) == "gigachat"
