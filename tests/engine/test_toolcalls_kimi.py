"""Kimi K2 tool calls, read from the text its own template renders."""

from __future__ import annotations

import pytest

from proxy.engine.toolcalls import Content, ExtractOptions, Reasoning, ToolCall, detect_tool_call_format
from tests.support.template_replies import every_split, extract, reply_after_prompt, template_text, with_parallel_off

KIMI = "moonshotai-Kimi-K2"
TOOLS = {"get_weather": {"type": "object", "properties": {"city": {"type": "string"}}}}
PARIS = ToolCall(0, "id-0", "get_weather", '{"city":"Paris"}')
TOKYO = ToolCall(1, "id-1", "get_weather", '{"city":"Tokyo"}')


def kimi_reply() -> str:
    return reply_after_prompt(KIMI, "<|im_end|>")


def test_parallel_calls_as_its_template_renders_them_at_every_split() -> None:
    text = "Checking both.\n" + kimi_reply()
    assert "functions.get_weather:1" in text
    events, extractor = every_split(text, ExtractOptions(calls="kimi-k2", tools=TOOLS))
    assert events == [Content("Checking both."), PARIS, TOKYO]
    assert extractor.malformed == 0


def test_k2_thinking_reasoning_then_calls() -> None:
    options = ExtractOptions(calls="kimi-k2", tools=TOOLS, reasoning=True)
    events, _ = every_split("<think>Two cities.</think>" + kimi_reply(), options)
    assert events == [Reasoning("Two cities."), PARIS, TOKYO]


def test_the_models_own_ids_are_replaced_by_ids_unique_per_call() -> None:
    extractor_events, _ = extract(kimi_reply() + kimi_reply(), ExtractOptions(calls="auto"))
    calls = [e for e in extractor_events if isinstance(e, ToolCall)]
    assert [c.id for c in calls] == ["id-0", "id-1", "id-2", "id-3"]  # the model wrote :0 and :1 twice


def test_parallel_off_keeps_the_first_call() -> None:
    assert with_parallel_off(kimi_reply(), ExtractOptions(calls="kimi-k2")) == [PARIS]


def test_malformed_arguments_stay_content_and_are_counted() -> None:
    text = kimi_reply().replace('{"city": "Paris"}', '{"city": "Paris"')
    events, extractor = every_split(text, ExtractOptions(calls="kimi-k2"))
    assert [e for e in events if isinstance(e, ToolCall)] == []
    assert "".join(e.text for e in events if isinstance(e, Content)) == text
    assert extractor.malformed == 1


def test_a_head_without_the_argument_token_is_malformed() -> None:
    text = kimi_reply().replace("<|tool_call_argument_begin|>", " ", 1)
    events, extractor = every_split(text, ExtractOptions(calls="kimi-k2"))
    assert events == [Content(text)]  # the second call's section began with the first: all of it is text
    assert extractor.malformed == 1


def test_a_call_cut_off_stays_content_after_the_calls_before_it() -> None:
    text = kimi_reply()
    cut = text.index("functions.get_weather:1") + 12
    events, extractor = every_split(text[:cut], ExtractOptions(calls="kimi-k2"))
    assert events == [PARIS, Content(text[text.index("<|tool_call_begin|>functions.get_weather:1") : cut])]
    assert extractor.malformed == 1


@pytest.mark.parametrize("name", [KIMI, "Kimi-K2-Instruct", "Kimi-K2-Thinking"])
def test_format_detected_from_the_real_template(name: str) -> None:
    assert detect_tool_call_format(template_text(name)) == "kimi-k2"
