"""gpt-oss and llm-jp 4.1 replies in harmony, read from the text their own templates render."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine_launcher.templates.template_check import CALL_IDS, CITIES
from proxy.engine.toolcalls import (
    ChunkExtractor,
    Content,
    ExtractOptions,
    Reasoning,
    ToolCall,
    detect_tool_call_format,
    extract_completion,
)
from tests.support.template_replies import every_split, reply_after_prompt, template_text, with_parallel_off

GPT_OSS = "openai-gpt-oss-120b"
LLM_JP = "llm-jp-llm-jp-4.1-8b-thinking"
TOOLS = {"get_weather": {"type": "object", "properties": {"city": {"type": "string"}}}}
HARMONY = ExtractOptions(calls="harmony", tools=TOOLS)
PARIS = ToolCall(0, "id-0", "get_weather", '{"city":"Paris"}')
TOKYO = ToolCall(1, "id-1", "get_weather", '{"city":"Tokyo"}')


def call(index: int) -> dict[str, Any]:
    arguments = json.dumps({"city": CITIES[index]})
    return {"id": CALL_IDS[index], "type": "function", "function": {"name": "get_weather", "arguments": arguments}}


def gpt_oss_reply() -> str:
    """Reasoning, then a call, then another: gpt-oss's template renders one call per assistant message."""
    turns = [
        {"role": "assistant", "content": "", "thinking": "Two cities, two calls.", "tool_calls": [call(0)]},
        {"role": "assistant", "content": "", "tool_calls": [call(1)]},
    ]
    return reply_after_prompt(GPT_OSS, "<|start|>assistant", turns)


def test_gpt_oss_reasoning_and_two_calls_at_every_split() -> None:
    text = gpt_oss_reply()
    assert text.startswith("<|channel|>analysis<|message|>")
    assert "<|start|>assistant to=functions.get_weather<|channel|>" in text  # the recipient in the role header
    events, extractor = every_split(text, HARMONY)
    assert events == [Reasoning("Two cities, two calls."), PARIS, TOKYO]
    assert extractor.malformed == 0


def test_llm_jp_two_calls_with_its_spaced_constrain_at_every_split() -> None:
    text = reply_after_prompt(LLM_JP, "<|start|>assistant")
    assert "<|constrain|> json" in text
    events, extractor = every_split(text, HARMONY)
    assert events == [PARIS, TOKYO]
    assert extractor.malformed == 0


def test_the_recipient_after_the_channel_and_a_final_answer() -> None:
    text = (
        "<|channel|>analysis<|message|>Look it up.<|end|>"
        '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}'
        "<|call|><|start|>assistant<|channel|>final<|message|>It is 31C in Paris.<|return|>"
    )
    events, _ = every_split(text, HARMONY)
    assert events == [Reasoning("Look it up."), PARIS, Content("It is 31C in Paris.")]


def test_a_call_the_engine_stopped_at_its_call_token_still_counts() -> None:
    """llama-cpp-python stops at ``<|call|>`` (an end-of-generation token) and leaves it out."""
    text = reply_after_prompt(GPT_OSS, "<|call|>")
    events, _ = every_split(text, HARMONY)
    assert events == [PARIS]


def test_without_tools_the_channels_still_split_reasoning_from_the_answer() -> None:
    text = "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>Hello!"
    events, _ = every_split(text, ExtractOptions(harmony=True))
    assert events == [Reasoning("Easy."), Content("Hello!")]


def test_auto_reads_a_reply_that_opens_as_harmony_and_leaves_other_text_alone() -> None:
    events, _ = every_split(gpt_oss_reply(), ExtractOptions(calls="auto", tools=TOOLS))
    assert events == [Reasoning("Two cities, two calls."), PARIS, TOKYO]
    plain, _ = every_split("<b>hi</b> to=functions.x", ExtractOptions(calls="auto", tools=TOOLS))
    assert plain == [Content("<b>hi</b> to=functions.x")]


def test_parallel_off_keeps_the_first_call() -> None:
    events = with_parallel_off(gpt_oss_reply(), ExtractOptions(calls="harmony", tools=TOOLS))
    assert events == [Reasoning("Two cities, two calls."), PARIS]


def test_malformed_arguments_stay_content_and_are_counted() -> None:
    text = gpt_oss_reply().replace('{"city": "Paris"}', '{"city": Paris}')
    events, extractor = every_split(text, HARMONY)
    head = text.index("<|start|>assistant to=")
    second = text.index("<|start|>assistant to=", head + 1)
    tokyo_first = ToolCall(0, "id-0", "get_weather", TOKYO.arguments)
    assert events == [Reasoning("Two cities, two calls."), Content(text[head:second]), tokyo_first]
    assert extractor.malformed == 1


def test_a_call_cut_off_in_its_arguments_stays_content() -> None:
    text = gpt_oss_reply()
    cut = text.index('"Tokyo"')
    events, extractor = every_split(text[:cut], HARMONY)
    second = text.index("<|start|>assistant to=", text.index("<|start|>assistant to=") + 1)
    assert events == [Reasoning("Two cities, two calls."), PARIS, Content(text[second:cut])]
    assert extractor.malformed == 1


def test_stream_and_non_stream_give_the_same_calls() -> None:
    text = gpt_oss_reply()
    message = {"role": "assistant", "content": text}
    completion = {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
    ids = iter(f"call_{i}" for i in range(10))
    choice = extract_completion(completion, HARMONY, lambda style: next(ids))["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["reasoning_content"] == "Two cities, two calls."
    assert [c["function"]["arguments"] for c in choice["message"]["tool_calls"]] == [PARIS.arguments, TOKYO.arguments]
    stream = ChunkExtractor(HARMONY)
    chunks = [{"choices": [{"index": 0, "delta": {"content": text[i : i + 7]}}]} for i in range(0, len(text), 7)]
    out = [c for chunk in chunks for c in stream.feed(chunk)] + stream.finish()
    names = [t["function"].get("name") for c in out for t in c["choices"][0]["delta"].get("tool_calls", [])]
    assert names.count("get_weather") == 2


@pytest.mark.parametrize("name", [GPT_OSS, LLM_JP])
def test_format_detected_from_the_real_template(name: str) -> None:
    assert detect_tool_call_format(template_text(name)) == "harmony"
