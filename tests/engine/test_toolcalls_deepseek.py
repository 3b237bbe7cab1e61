# ruff: noqa: RUF001  # the fullwidth bar is how DeepSeek's tokenizer spells its tokens
"""DeepSeek V3.1 and R1 tool calls, read from the text their own templates render."""

from __future__ import annotations

import json

import pytest

from proxy.engine.toolcalls import Content, ExtractOptions, Reasoning, ToolCall, detect_tool_call_format
from tests.support.template_replies import (
    every_split,
    extract,
    rendered_history,
    reply_after_prompt,
    template_text,
    with_parallel_off,
)

V31 = "deepseek-ai-DeepSeek-V3.1"
R1 = "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"
EOS = "<｜end▁of▁sentence｜>"
TOOLS = {"get_weather": {"type": "object", "properties": {"city": {"type": "string"}}}}
PARIS = ToolCall(0, "id-0", "get_weather", json.dumps({"city": "Paris"}, separators=(",", ":")))
TOKYO = ToolCall(1, "id-1", "get_weather", json.dumps({"city": "Tokyo"}, separators=(",", ":")))


def v31_reply() -> str:
    return reply_after_prompt(V31, EOS)


def r1_reply() -> str:
    """The R1 distill's calls as its template renders them, after the reasoning the model closes."""
    history = rendered_history(R1)
    start = history.index("<｜tool▁calls▁begin｜>")
    return "Two cities: two calls.\n</think>\n\n" + history[start : history.index(EOS, start)]


def test_v31_parallel_calls_as_its_template_renders_them_at_every_split() -> None:
    text = "Let me look both up." + v31_reply()
    events, extractor = every_split(text, ExtractOptions(calls="deepseek-v3.1", tools=TOOLS))
    assert events == [Content("Let me look both up."), PARIS, TOKYO]
    assert extractor.malformed == 0


def test_r1_fenced_calls_after_its_reasoning_at_every_split() -> None:
    assert "```json" in r1_reply()  # the fenced form, as the template writes it
    options = ExtractOptions(calls="deepseek-r1", tools=TOOLS, reasoning=True, think_open=True)
    events, extractor = every_split(r1_reply(), options)
    assert events == [Reasoning("Two cities: two calls.\n"), PARIS, TOKYO]
    assert extractor.malformed == 0


@pytest.mark.parametrize("fmt", ["auto", "deepseek-r1", "deepseek-v3.1"])
def test_each_deepseek_name_and_auto_read_both_forms(fmt: str) -> None:
    for text in (v31_reply(), r1_reply().split("</think>")[1]):
        assert extract(text, ExtractOptions(calls=fmt, tools=TOOLS))[0] == [PARIS, TOKYO]


def test_parallel_off_keeps_the_first_call() -> None:
    assert with_parallel_off(v31_reply(), ExtractOptions(calls="deepseek-v3.1")) == [PARIS]


def test_a_tool_named_function_is_read_in_the_v31_form() -> None:
    call = '<｜tool▁call▁begin｜>function<｜tool▁sep｜>{"a": 1}<｜tool▁call▁end｜>'
    text = f"<｜tool▁calls▁begin｜>{call}<｜tool▁calls▁end｜>"
    events, _ = every_split(text, ExtractOptions(calls="deepseek-v3.1"))
    assert events == [ToolCall(0, "id-0", "function", '{"a":1}')]


def test_malformed_arguments_stay_content_and_are_counted() -> None:
    text = v31_reply().replace('{"city": "Paris"}', '{"city": Paris}')
    events, extractor = every_split(text, ExtractOptions(calls="deepseek-v3.1"))
    assert events == [Content(text)]
    assert extractor.malformed == 1


def test_a_call_cut_off_stays_content_after_the_calls_before_it() -> None:
    text = v31_reply()
    cut = text.index('{"city": "Tokyo"}') + 5
    events, extractor = every_split(text[:cut], ExtractOptions(calls="deepseek-v3.1"))
    tail = text[text.index("<｜tool▁call▁end｜>") + len("<｜tool▁call▁end｜>") : cut]
    assert events == [PARIS, Content(tail)]
    assert extractor.malformed == 1


def test_a_reply_cut_inside_its_first_call_is_all_content() -> None:
    text = v31_reply()[:40]
    events, extractor = every_split(text, ExtractOptions(calls="deepseek-v3.1"))
    assert events == [Content(text)]
    assert extractor.malformed == 1


def test_a_reply_that_ends_before_the_closing_tokens_keeps_its_calls() -> None:
    text = v31_reply().removesuffix("<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
    events, extractor = every_split(text, ExtractOptions(calls="deepseek-v3.1"))
    assert events == [PARIS, TOKYO]
    assert extractor.malformed == 0


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (V31, "deepseek-v3.1"),
        (R1, "deepseek-r1"),
        ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B", "deepseek-r1"),
        ("llama-cpp-deepseek-r1", "deepseek-r1"),
    ],
)
def test_format_detected_from_the_real_template(name: str, expected: str) -> None:
    assert detect_tool_call_format(template_text(name)) == expected
