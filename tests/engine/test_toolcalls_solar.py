"""Solar Open tool calls, read from the text its own template renders."""

from __future__ import annotations

from typing import Any

import pytest

from engine_launcher.templates.chat_template import render_prompt
from engine_launcher.templates.template_check import WRITTEN_ANSWER, template_from_file_text, written_answer
from proxy.engine.toolcalls import (
    CONTENT_WRAPPERS,
    Content,
    ExtractOptions,
    Reasoning,
    ToolCall,
    detect_tool_call_format,
    template_reasoning,
)
from tests.support.template_replies import every_split, extract, reply_after_prompt, template_text

SOLAR = "upstage-Solar-Open-100B"
PARIS = ToolCall(0, "id-0", "get_weather", '{"city":"Paris"}')
TOKYO = ToolCall(1, "id-1", "get_weather", '{"city":"Tokyo"}')
OPTIONS = ExtractOptions(calls="solar-open")


def solar_reply() -> str:
    """Everything after the generation prompt's ``<|begin|>assistant``, with the closing ``<|calls|>``."""
    return reply_after_prompt(SOLAR, "<|calls|>") + "<|calls|>"


def test_parallel_calls_as_its_template_renders_them_at_every_split() -> None:
    text = solar_reply()
    assert text.count("<|tool_call:begin|>") == 2
    events, extractor = every_split(text, OPTIONS)
    assert events == [PARIS, TOKYO]
    assert extractor.malformed == 0


def test_the_reply_may_end_before_the_section_closes() -> None:
    events, _ = every_split(solar_reply().removesuffix("<|calls|>"), OPTIONS)
    assert events == [PARIS, TOKYO]  # <|calls|> ends generation: the engine may never show it


def test_auto_reads_it_and_the_models_own_ids_are_replaced() -> None:
    events, _ = extract(solar_reply() + solar_reply(), ExtractOptions(calls="auto"))
    calls = [e for e in events if isinstance(e, ToolCall)]
    assert [c.id for c in calls] == ["id-0", "id-1", "id-2", "id-3"]


def test_parallel_off_keeps_the_first_call() -> None:
    events, extractor = extract(solar_reply(), ExtractOptions(calls="solar-open", parallel=False))
    assert events == [PARIS]
    assert extractor.dropped == 1


def test_malformed_arguments_stay_content_and_are_counted() -> None:
    text = solar_reply().replace('{"city": "Paris"}', '{"city": "Paris"')
    events, extractor = every_split(text, OPTIONS)
    assert [e for e in events if isinstance(e, ToolCall)] == []
    assert "".join(e.text for e in events if isinstance(e, Content)) == text
    assert extractor.malformed == 1


def test_a_call_cut_off_stays_content_after_the_calls_before_it() -> None:
    text = solar_reply()
    second = text.index("<|tool_call:begin|>", text.index("<|tool_call:end|>"))
    cut = second + 30
    events, extractor = every_split(text[:cut], OPTIONS)
    assert events == [PARIS, Content(text[second:cut])]
    assert extractor.malformed == 1


def test_format_detected_from_the_real_template() -> None:
    assert detect_tool_call_format(template_text(SOLAR)) == "solar-open"


@pytest.mark.parametrize("tools", [{"get_weather": {}}, {}])
@pytest.mark.parametrize("end", ["", "<|end|>"])
def test_a_plain_answer_is_clean_content(tools: dict[str, object], end: str) -> None:
    written = written_answer(template_from_file_text(template_text(SOLAR), SOLAR))
    assert written is not None
    answer, closing = written
    assert answer.startswith("<|content|>") and closing.startswith("<|end|>")
    text = answer + end  # the engine may stop before the message's <|end|> or show it
    options = ExtractOptions(
        calls="solar-open" if tools else None, tools=tools, wrappers=CONTENT_WRAPPERS["solar-open"]
    )
    events, extractor = every_split(text, options)
    assert events == [Content(WRITTEN_ANSWER)]
    assert extractor.malformed == 0


def test_content_then_calls_each_a_message_of_its_own() -> None:
    text = "<|content|>Checking.<|end|><|begin|>assistant" + solar_reply()
    options = ExtractOptions(calls="solar-open", tools={"get_weather": {}}, wrappers=CONTENT_WRAPPERS["solar-open"])
    events, _ = every_split(text, options)
    assert events == [Content("Checking."), PARIS, TOKYO]


def solar_reasoning_turn(**turn: Any) -> str:
    """A turn with reasoning as Solar Open's template renders it, after the prompt's ``<|begin|>assistant``."""
    messages = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "reasoning": "Two cities.", **turn}]
    text = render_prompt(template_text(SOLAR), messages, bos_token="", eos_token="", add_generation_prompt=False)
    return text[text.rindex("<|begin|>assistant<|think|>") + len("<|begin|>assistant") :]


def solar_thinking(tools: dict[str, Any]) -> ExtractOptions:
    form = template_reasoning(template_text(SOLAR))
    assert form is not None and (form.open, form.close, form.opens_in_prompt) == ("<|think|>", "<|end|>", False)
    return ExtractOptions(
        calls="solar-open" if tools else None,
        tools=tools,
        wrappers=CONTENT_WRAPPERS["solar-open"],
        reasoning=True,
        think_markers=(form.open, form.close),
    )


@pytest.mark.parametrize("tools", [{"get_weather": {}}, {}])
def test_reasoning_then_the_answer_in_a_message_of_its_own(tools: dict[str, Any]) -> None:
    text = solar_reasoning_turn(content="Sunny.")
    assert text == "<|think|>Two cities.<|end|><|begin|>assistant<|content|>Sunny.<|end|>"
    events, _ = every_split(text, solar_thinking(tools))
    assert events == [Reasoning("Two cities."), Content("Sunny.")]


def test_reasoning_then_calls() -> None:
    calls = [
        {"id": "Kq7Zt3Wm9", "type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}
        for city in ("Paris", "Tokyo")
    ]
    text = solar_reasoning_turn(content="", tool_calls=calls)
    assert text.startswith("<|think|>Two cities.<|end|><|begin|>assistant<|tool_calls|>")
    events, extractor = every_split(text, solar_thinking({"get_weather": {}}))
    assert events == [Reasoning("Two cities."), PARIS, TOKYO]
    assert extractor.malformed == 0
